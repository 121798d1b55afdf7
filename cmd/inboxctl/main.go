// Command inboxctl lets an operator deal with the messages a consumer's inbox
// did not apply: dead letters and quarantined messages, in the consumer's
// database (DATABASE_URL).
//
//	inboxctl list [-consumer NAME] [-kind dead_letter|payload_conflict|invalid] [-group ID] [-resolved]
//	inboxctl groups [-consumer NAME] [-kind KIND]
//	inboxctl show ID
//	inboxctl redrive [-by WHO] ID
//	inboxctl redrive [-by WHO] -consumer NAME (-group ID | -kind KIND | -all) [-expect N -up-to ID [-digest D]]
//	inboxctl discard -by WHO -why WHY ID
//	inboxctl discard -by WHO -why WHY -consumer NAME (-group ID | -kind KIND | -all) [-expect N -up-to ID [-digest D]]
//	inboxctl actions [-consumer NAME] [-limit N]
//	inboxctl action [-limit N] ID
//	inboxctl stop [-by WHO] ID
//	inboxctl resume ID
//	inboxctl held [-consumer NAME]
//	inboxctl breaches [-consumer NAME] [-limit N]
//	inboxctl consumers
//	inboxctl retire -consumer NAME [-idle DURATION] [-drop-parked]
//
// groups lists the failure groups of the open messages: those that failed
// alike (kind, reason with its ids and numbers masked, event type, producer
// key), the largest first; see inboxadmin.Admin.ListGroups.
// redrive writes a dead letter back through the consumer's outbox (to its
// redrive topic, or the topic it came from), under its original id, in the transaction that marks it redriven
// (see inboxadmin.Admin.Retry): fix the handler first, then redrive.
// discard closes a row without applying it and records who, why and when.
// Given a group, a kind, -holding or -all instead of an ID, redrive and discard act on
// many messages of one consumer: without -expect they only count them (a
// dry run); with -expect N -up-to ID, the count and the last id the dry run
// printed (and -digest, the very messages it counted), they record the action and do it in batches, printing progress
// (inboxadmin.Admin.StartBulk, inboxadmin.Admin.RunBulk): rows quarantined after the dry run are
// not part of it, and messages changed since (in number or which) refuse it. actions lists the
// history of what operators did, newest first; action shows one, with what
// it did to each message (why it refused one); stop stops one for good (its
// messages not done stay open); resume goes on with an action that was cut off (killed, ^C; a console running beside resumes it too): each
// message is done once however often it runs.
// held lists the keys a consumer holds (inbox.Config.OnDeadLetter =
// HoldKey): the dead letter each waits for and the messages parked behind
// it; redriving or discarding that dead letter releases them in order
// (-holding: every such dead letter of -consumer at once).
// breaches lists the breaks in producers' key histories the consumer saw
// (gaps, rewinds and late messages, newest first; see docs/operate.md,
// InboxGap and ProducerRewound).
// consumers lists every consumer with rows in the inbox; retire deletes
// what the inbox keeps for one that no longer runs (renamed or removed: no
// sweep retires its rows, and they hold every partition they are in),
// unless it wrote to the inbox within -idle (72h) or has parked messages
// (-drop-parked deletes them); see inboxadmin.Admin.Retire.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/outboxref/outbox-inbox/cmd/internal/opctl"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
)

var tool = opctl.Tool{
	Name:     "inboxctl",
	Usage:    usage,
	Database: "the consumer's database",
}

func main() { tool.Main(run) }

const usage = `usage:
  inboxctl list [-consumer NAME] [-kind dead_letter|payload_conflict|invalid] [-group ID] [-resolved]
  inboxctl groups [-consumer NAME] [-kind KIND]
  inboxctl show ID
  inboxctl redrive [-by WHO] ID
  inboxctl redrive [-by WHO] -consumer NAME (-group ID | -kind KIND | -all) [-expect N -up-to ID [-digest D]]
  inboxctl discard -by WHO -why WHY ID
  inboxctl discard -by WHO -why WHY -consumer NAME (-group ID | -kind KIND | -all) [-expect N -up-to ID [-digest D]]
  inboxctl actions [-consumer NAME] [-limit N]
  inboxctl action [-limit N] ID
  inboxctl stop [-by WHO] ID
  inboxctl resume ID
  inboxctl held [-consumer NAME]
  inboxctl breaches [-consumer NAME] [-limit N]
  inboxctl skipped [-consumer NAME] [-limit N]
  inboxctl consumers
  inboxctl retire -consumer NAME [-idle DURATION] [-drop-parked]
DATABASE_URL names the consumer's database.`

func run(ctx context.Context, args []string, out io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("inboxctl", flag.ContinueOnError)
	consumer := fs.String("consumer", "", "only this consumer; retire: the consumer to retire")
	kind := fs.String("kind", "", "only this kind: dead_letter, payload_conflict or invalid")
	resolved := fs.Bool("resolved", false, "list: also rows already redriven or discarded")
	group := fs.String("group", "", "list: only this failure group (inboxctl groups); redrive, discard: its open messages")
	all := fs.Bool("all", false, "redrive, discard: every open message of -consumer (redrive: of -kind dead_letter)")
	holding := fs.Bool("holding", false, "redrive, discard: the dead letters of -consumer that hold their keys (held): each releases its parked messages")
	expect := fs.Int64("expect", -1, "redrive, discard of many: the count the dry run printed; without it, only count")
	upTo := fs.Int64("up-to", 0, "redrive, discard of many: the last id the dry run counted (it printed it), with -expect")
	digest := fs.String("digest", "", "redrive, discard of many: the dry run's digest of the very messages it counted (it printed it), with -expect: refuses as many but other messages")
	by := fs.String("by", opctl.Operator(getenv), "redrive, discard: who does it (recorded)")
	why := fs.String("why", "", "discard: why (recorded)")
	idle := fs.Duration("idle", 72*time.Hour, "retire: refuse a consumer that wrote to the inbox within this (keep it above its redelivery horizon)")
	limit := fs.Int("limit", 50, "breaches, skipped, actions: how many, newest first")
	dropParked := fs.Bool("drop-parked", false, "retire: delete its parked messages too (never applied; look at them first with held)")
	cmd, rest, help, err := tool.Parse(fs, args, out, "list", "groups", "show", "redrive", "discard", "actions", "action", "stop", "resume", "held", "breaches", "skipped", "consumers", "retire")
	if err != nil || help {
		return err
	}
	bulk := (cmd == "redrive" || cmd == "discard") && (*all || *group != "" || *kind != "" || *holding)
	id, err := idArg(cmd, rest, bulk)
	if err != nil {
		return err
	}

	timeout := time.Minute
	if cmd == "retire" || cmd == "consumers" || bulk || cmd == "resume" {
		timeout = 0 // a retire of millions of rows takes what it takes; ^C stops it
	}
	ctx, pool, closeDB, err := tool.Connect(ctx, getenv, timeout)
	if err != nil {
		return err
	}
	defer closeDB()
	admin := inboxadmin.New(pool)

	switch cmd {
	case "list":
		list, err := admin.ListQuarantined(ctx, inboxadmin.QuarantineFilter{Consumer: *consumer, Kind: *kind, Group: *group, Resolved: *resolved, WithoutPayloads: true})
		if err != nil {
			return err
		}
		printList(out, list)
	case "held":
		list, err := admin.ListHeld(ctx, *consumer)
		if err != nil {
			return err
		}
		printHeld(out, list)
	case "breaches":
		list, err := admin.ListBreaches(ctx, *consumer, *limit)
		if err != nil {
			return err
		}
		printBreaches(out, list)
	case "skipped":
		list, err := admin.ListSkipped(ctx, *consumer, *limit)
		if err != nil {
			return err
		}
		printSkipped(out, list)
	case "show":
		q, err := admin.GetQuarantined(ctx, id)
		if err != nil {
			return err
		}
		printOne(out, q)
	case "groups":
		list, err := admin.ListGroups(ctx, inboxadmin.GroupFilter{Consumer: *consumer, Kind: *kind})
		if err != nil {
			return err
		}
		printGroups(out, list)
	case "redrive", "discard":
		if cmd == "discard" && strings.TrimSpace(*why) == "" {
			return errors.New("discard needs -why: it is kept as the audit record")
		}
		if bulk {
			action := inboxadmin.ActionRetry
			if cmd == "discard" {
				action = inboxadmin.ActionDrop
			}
			return runBulk(ctx, out, admin, action, inboxadmin.Selection{Consumer: *consumer, Group: *group, Kind: *kind, Holding: *holding, UpTo: *upTo}, *expect, *digest, *by, *why)
		}
		if cmd == "discard" {
			q, err := admin.Drop(ctx, id, *by, *why)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%d discarded by %s at %s: %s\n", q.ID, q.ResolvedBy, q.ResolvedAt.Format(time.RFC3339), q.ResolutionNote)
			return nil
		}
		res, err := admin.Retry(ctx, id, *by)
		if err != nil {
			return fmt.Errorf("redriving %d: %w", id, err)
		}
		verb := "redriven"
		if !res.Redriven {
			verb = "not redriven"
		}
		fmt.Fprintf(out, "%d %s: %s\n", id, verb, res.Note)
	case "actions":
		list, err := admin.ListActions(ctx, inboxadmin.ActionFilter{Consumer: *consumer, Limit: *limit})
		if err != nil {
			return err
		}
		printActions(out, list)
	case "action":
		a, err := admin.GetAction(ctx, id)
		if err != nil {
			return err
		}
		printActions(out, []inboxadmin.Action{a})
		items, err := admin.ListActionItems(ctx, id, 0, *limit)
		if err != nil {
			return err
		}
		printItems(out, items)
	case "stop":
		a, err := admin.StopBulk(ctx, id, *by)
		if err != nil {
			return err
		}
		printActions(out, []inboxadmin.Action{a})
	case "resume":
		a, err := admin.RunBulk(ctx, id, inboxadmin.BulkOptions{Progress: progress(out)})
		if err != nil {
			return err
		}
		printDone(out, a)
	case "consumers":
		list, err := admin.ListConsumers(ctx)
		if err != nil {
			return err
		}
		printConsumers(out, list)
	case "retire":
		if *consumer == "" {
			return errors.New("retire needs -consumer: the name of the consumer that no longer runs")
		}
		r, err := admin.Retire(ctx, inboxadmin.RetireParams{Consumer: *consumer, Idle: *idle, DropParked: *dropParked,
			Progress: func(n int64) { fmt.Fprintf(out, "%d inbox rows of %s deleted\n", n, *consumer) }})

		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s retired: %d inbox rows, %d failed attempts, %d held keys, %d parked messages, %d partition clearances deleted\n",
			*consumer, r.Rows, r.Attempts, r.HeldKeys, r.Parked, r.Clearances)
		if r.OpenQuarantined > 0 {
			fmt.Fprintf(out, "%d quarantined messages of %s are still open: inboxctl list -consumer %s\n", r.OpenQuarantined, *consumer, *consumer)
		}
	}
	return nil
}

// idArg reads the one ID argument show, redrive, discard and resume need.
func idArg(cmd string, rest []string, bulk bool) (int64, error) {
	switch {
	case cmd == "list" || cmd == "groups" || cmd == "actions" || cmd == "held" || cmd == "breaches" || cmd == "skipped" || cmd == "consumers" || cmd == "retire":
		return 0, tool.NoArgs(cmd, rest)
	case bulk:
		if len(rest) > 0 {
			return 0, fmt.Errorf("%s: give an ID, or -group, -kind or -all, not both\n%s", cmd, usage)
		}
		return 0, nil
	}
	return tool.ID(cmd, rest)
}

// runBulk counts what sel chooses and, when expect is that count, retries
// or drops it (action), printing progress.
func runBulk(ctx context.Context, out io.Writer, admin *inboxadmin.Admin, action string, sel inboxadmin.Selection, expect int64, digest, by, why string) error {
	if sel.Consumer == "" {
		return errors.New("a bulk action is for one consumer: -consumer NAME (inboxctl consumers lists them)")
	}
	verb := map[string]string{inboxadmin.ActionRetry: "redrive", inboxadmin.ActionDrop: "discard"}[action]
	if action == inboxadmin.ActionRetry && sel.Kind == "" && sel.Group == "" {
		sel.Kind = inbox.KindDeadLetter // only dead letters can be redriven
	}
	if expect >= 0 && sel.UpTo <= 0 {
		return errors.New("-expect goes with the -up-to the dry run printed: the messages it counted, not those quarantined since")
	}
	if digest != "" && expect < 0 {
		return errors.New("-digest goes with -expect and -up-to: the three the dry run printed")
	}
	plan, err := admin.DryRun(ctx, sel)
	if err != nil {
		return err
	}
	switch {
	case plan.Count == 0:
		fmt.Fprintln(out, "no open message chosen: nothing to do")
		return nil
	case expect < 0:
		fmt.Fprintf(out, "dry run: %d open messages of %s chosen; nothing done. To %s them: the same command with -expect %d -up-to %d -digest %s\n",
			plan.Count, sel.Consumer, verb, plan.Count, plan.Selection.UpTo, plan.Digest)
		return nil
	case expect != plan.Count:
		return fmt.Errorf("%d open messages chosen now, not the %d expected: nothing done; look again (the same command without -expect)", plan.Count, expect)
	case digest != "" && digest != plan.Digest:
		return fmt.Errorf("%d open messages chosen now, as expected, but not the same ones: nothing done; look again (the same command without -expect)", plan.Count)
	}
	started, err := admin.StartBulk(ctx, action, plan, by, why)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "action %d: %s of %d messages by %s started (inboxctl resume %d goes on with it if stopped)\n", started.ID, verb, started.Selected, by, started.ID)
	a, err := admin.RunBulk(ctx, started.ID, inboxadmin.BulkOptions{Progress: progress(out)})
	if err != nil {
		return fmt.Errorf("%w (inboxctl resume %d goes on with it)", err, started.ID)
	}
	printDone(out, a)
	return nil
}

// progress prints an action's progress after each batch, at most once a second.
func progress(out io.Writer) func(inboxadmin.Action) {
	var last time.Time
	return func(a inboxadmin.Action) {
		if a.State == inboxadmin.ActionFinished || time.Since(last) < time.Second {
			return
		}
		last = time.Now()
		fmt.Fprintf(out, "action %d: %d of %d done, %d skipped, %d refused\n", a.ID, a.Done, a.Selected, a.Skipped, a.Refused)
	}
}

func printDone(out io.Writer, a inboxadmin.Action) {
	fmt.Fprintf(out, "action %d finished: %d of %d done, %d skipped (resolved meanwhile, or applied), %d refused\n",
		a.ID, a.Done, a.Selected, a.Skipped, a.Refused)
	if a.Refused > 0 {
		fmt.Fprintf(out, "the refused cannot be redriven (inboxctl action %d says why): discard them\n", a.ID)
	}
}

func printGroups(out io.Writer, list []inboxadmin.Group) {
	if len(list) == 0 {
		fmt.Fprintln(out, "nothing quarantined")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tCONSUMER\tKIND\tCOUNT\tFIRST\tLAST\tEVENT TYPE\tPRODUCER\tREASON")
	for _, g := range list {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", g.ID, g.Consumer, g.Kind, g.Count,
			time.Since(g.FirstSeen).Round(time.Second), time.Since(g.LastSeen).Round(time.Second),
			orDash(g.EventType), orDash(g.Producer), opctl.Clip(g.ReasonPattern, 100))
	}
	w.Flush()
}

func printActions(out io.Writer, list []inboxadmin.Action) {
	if len(list) == 0 {
		fmt.Fprintln(out, "no action recorded")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tWHEN\tCONSUMER\tACTION\tBY\tSELECTION\tCHOSEN\tDONE\tSKIPPED\tREFUSED\tSTATE\tWHY")
	for _, a := range list {
		sel, _ := json.Marshal(a.Selection)
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", a.ID, a.StartedAt.Format(time.RFC3339), a.Consumer,
			a.Action, a.Actor, opctl.Clip(string(sel), 80), a.Selected, a.Done, a.Skipped, a.Refused, a.State, opctl.Clip(a.Why, 60))
	}
	w.Flush()
}

func printItems(out io.Writer, items []inboxadmin.ActionItem) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nMESSAGE\tOUTCOME\tNOTE")
	for _, it := range items {
		fmt.Fprintf(w, "%d\t%s\t%s\n", it.QuarantineID, orDash(it.Outcome), opctl.Clip(it.Note, 160))
	}
	w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printList(out io.Writer, list []inboxadmin.Quarantined) {
	if len(list) == 0 {
		fmt.Fprintln(out, "nothing quarantined")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tCONSUMER\tKIND\tMESSAGE\tATTEMPTS\tAGE\tSTATE\tREASON")
	for _, q := range list {
		state := "open"
		if q.ResolvedAt != nil {
			state = q.Resolution + " by " + q.ResolvedBy
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", q.ID, q.Consumer, q.Kind, q.MessageID, q.Attempts,
			time.Since(q.CreatedAt).Round(time.Second), state, opctl.Clip(q.Reason, 100))
	}
	w.Flush()
}

func printConsumers(out io.Writer, list []inboxadmin.ConsumerInfo) {
	if len(list) == 0 {
		fmt.Fprintln(out, "no consumer has rows here")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONSUMER\tLAST MESSAGE\tOPEN QUARANTINED\tHELD KEYS\tPARKED")
	for _, c := range list {
		last := "no row left"
		if c.LastProcessed != nil {
			last = time.Since(*c.LastProcessed).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\n", c.Consumer, last, c.OpenQuarantined, c.HeldKeys, c.Parked)
	}
	w.Flush()
}

func printHeld(out io.Writer, list []inboxadmin.HeldKey) {
	if len(list) == 0 {
		fmt.Fprintln(out, "no key held")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONSUMER\tTOPIC\tKEY\tSTATE\tDEAD LETTER\tHOLDER\tPARKED\tOLDEST PARKED\tHELD FOR")
	for _, h := range list {
		dl, oldest := "-", "-"
		if h.DeadLetter != 0 {
			dl = fmt.Sprint(h.DeadLetter)
		}
		if h.OldestParked != nil {
			oldest = time.Since(*h.OldestParked).Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", h.Consumer, h.Topic, opctl.Clip(h.Key, 40), h.State, dl, h.Holder,
			h.Parked, oldest, time.Since(h.HeldAt).Round(time.Second))
	}
	w.Flush()
}

func printBreaches(out io.Writer, list []inbox.Breach) {
	if len(list) == 0 {
		fmt.Fprintln(out, "no breach seen: every numbered history arrived whole")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONSUMER\tKIND\tTOPIC\tKEY\tEXPECTED\tGOT\tMESSAGE\tAFTER\tAGE")
	for _, b := range list {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", b.Consumer, b.Kind, b.Topic, opctl.Clip(b.Key, 40), b.Expected, b.Got,
			opctl.Clip(b.MessageID, 40), opctl.Clip(b.PreviousID, 40), time.Since(b.DetectedAt).Round(time.Second))
	}
	w.Flush()
}

func printSkipped(out io.Writer, list []inboxadmin.Skipped) {
	if len(list) == 0 {
		fmt.Fprintln(out, "no record skipped: the broker lost nothing under the consumer's committed offsets")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONSUMER\tTOPIC\tPARTITION\tFROM\tTO\tRECORDS\tCAUSE\tAGE\tREPAIRED")
	for _, s := range list {
		repaired := "no"
		if s.RepairedAt != nil {
			repaired = s.RepairedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", s.Consumer, s.Topic, s.Partition, s.From, s.To-1, s.To-s.From,
			s.Cause, time.Since(s.DetectedAt).Round(time.Second), repaired)
	}
	w.Flush()
}

func printOne(out io.Writer, q inboxadmin.Quarantined) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(w, "%s:\t%v\n", k, v) }
	row("id", q.ID)
	row("consumer", q.Consumer)
	row("kind", q.Kind)
	row("message id", q.MessageID)
	row("topic", q.Topic)
	row("reason", q.Reason)
	row("attempts", q.Attempts)
	row("quarantined at", q.CreatedAt.Format(time.RFC3339))
	row("payload sha256", fmt.Sprintf("%x", q.PayloadSHA256))
	if q.OriginalSHA256 != nil {
		row("applied sha256", fmt.Sprintf("%x", q.OriginalSHA256))
	}
	meta, _ := json.Marshal(q.Metadata)
	row("metadata", string(meta))
	if q.RawMetadata != nil {
		raw := make([]string, 0, len(q.RawMetadata))
		for k, v := range q.RawMetadata {
			raw = append(raw, fmt.Sprintf("%q: %q", k, v))
		}
		slices.Sort(raw)
		row("headers as they arrived", "{"+strings.Join(raw, ", ")+"}")
	}
	if q.ResolvedAt != nil {
		row("resolution", fmt.Sprintf("%s by %s at %s", q.Resolution, q.ResolvedBy, q.ResolvedAt.Format(time.RFC3339)))
		row("note", q.ResolutionNote)
	} else {
		row("resolution", "open")
	}
	payload := string(q.Payload)
	switch {
	case q.PayloadNull:
		payload = "none: the record had no value (a tombstone)"
	case !utf8.Valid(q.Payload):
		payload = fmt.Sprintf("%d bytes, not UTF-8: %x", len(q.Payload), q.Payload[:min(len(q.Payload), 64)])
	}
	row("payload", opctl.Clip(payload, 4096))
	w.Flush()
}
