// Command outboxctl lets an operator deal with the outbox rows a relay
// parked because the broker will never take them (too large for the
// producer or the topic, an invalid record), in the producer's database
// (DATABASE_URL).
//
//	outboxctl list
//	outboxctl show ID
//	outboxctl retry ID
//	outboxctl drop -by WHO -why WHY ID
//	outboxctl republish -topic T -since TIME -until TIME [-key K] -by WHO -why WHY [-expect N]
//	outboxctl republishes
//
// A parked row holds back the later rows of its topic and partition key.
// retry sends it again (fix what refused it first: the topic's
// max.message.bytes, the producer's limit); drop moves it to outbox_dropped
// with who and why, and lets its key go on without it.
//
// republish sends again the rows of a topic published in a window (the
// records the broker lost: docs/broker-loss.md): without -expect it only
// counts them; with -expect the count it printed, it marks them
// unpublished and records who asked and why (republishes lists them).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/outboxref/outbox-inbox/cmd/internal/opctl"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
)

var tool = opctl.Tool{
	Name: "outboxctl",
	Usage: `usage:
  outboxctl list
  outboxctl show ID
  outboxctl retry ID
  outboxctl drop -by WHO -why WHY ID
  outboxctl republish -topic T -since TIME -until TIME [-key K] -by WHO -why WHY [-expect N]
  outboxctl republishes
TIME is RFC 3339 (2026-12-01T10:00:00Z). DATABASE_URL names the producer's database.`,
	Database: "the producer's database",
}

func main() { tool.Main(run) }

func run(ctx context.Context, args []string, out io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("outboxctl", flag.ContinueOnError)
	by := fs.String("by", opctl.Operator(getenv), "drop, republish: who does it (recorded)")
	why := fs.String("why", "", "drop, republish: why (recorded)")
	topic := fs.String("topic", "", "republish: the topic")
	since := fs.String("since", "", "republish: the rows published from this time (RFC 3339)")
	until := fs.String("until", "", "republish: the rows published before this time (RFC 3339)")
	key := fs.String("key", "", "republish: only this partition key")
	expect := fs.Int64("expect", -1, "republish: the count the dry run printed; without it, only count")
	cmd, rest, help, err := tool.Parse(fs, args, out, "list", "show", "retry", "drop", "republish", "republishes")
	if err != nil || help {
		return err
	}
	var id int64
	if cmd == "list" || cmd == "republish" || cmd == "republishes" {
		err = tool.NoArgs(cmd, rest)
	} else {
		id, err = tool.ID(cmd, rest)
	}
	if err != nil {
		return err
	}
	if (cmd == "drop" || cmd == "republish" && *expect >= 0) && strings.TrimSpace(*why) == "" {
		return fmt.Errorf("%s needs -why: it is kept as the audit record", cmd)
	}
	var window outboxadmin.RepublishFilter
	if cmd == "republish" {
		if window, err = republishWindow(*topic, *since, *until, *key); err != nil {
			return err
		}
	}

	ctx, pool, closeDB, err := tool.Connect(ctx, getenv, time.Minute)
	if err != nil {
		return err
	}
	defer closeDB()
	admin := outboxadmin.New(pool)

	switch cmd {
	case "list", "show":
		parked, err := admin.ListParked(ctx, outboxadmin.ParkedFilter{})
		if err != nil {
			return err
		}
		if cmd == "list" {
			printList(out, parked)
			return nil
		}
		for _, p := range parked {
			if p.ID == id {
				printOne(out, p)
				return nil
			}
		}
		return fmt.Errorf("%w: %d", outboxadmin.ErrNotParked, id)
	case "retry":
		if err := admin.Retry(ctx, id); err != nil {
			return err
		}
		fmt.Fprintf(out, "%d unparked: the relay sends it with its next batch\n", id)
	case "drop":
		if err := admin.Drop(ctx, id, *by, *why); err != nil {
			return err
		}
		fmt.Fprintf(out, "%d dropped by %s: kept in outbox_dropped\n", id, *by)
	case "republish":
		return republish(ctx, out, admin, window, *expect, *by, *why)
	case "republishes":
		list, err := admin.ListRepublishes(ctx, 50)
		if err != nil {
			return err
		}
		printRepublishes(out, list)
	}
	return nil
}

// republishWindow reads republish's flags.
func republishWindow(topic, since, until, key string) (outboxadmin.RepublishFilter, error) {
	f := outboxadmin.RepublishFilter{Topic: topic, Key: key}
	if topic == "" || since == "" || until == "" {
		return f, fmt.Errorf("republish needs -topic, -since and -until\n%s", tool.Usage)
	}
	var err error
	if f.Since, err = time.Parse(time.RFC3339, since); err != nil {
		return f, fmt.Errorf("republish: -since: %w", err)
	}
	if f.Until, err = time.Parse(time.RFC3339, until); err != nil {
		return f, fmt.Errorf("republish: -until: %w", err)
	}
	return f, nil
}

// republish counts the rows f selects and, when expect is that count,
// marks them unpublished: a count that moved since the dry run is refused.
func republish(ctx context.Context, out io.Writer, admin *outboxadmin.Admin, f outboxadmin.RepublishFilter, expect int64, by, why string) error {
	n, err := admin.CountRepublish(ctx, f)
	if err != nil {
		return err
	}
	if expect < 0 {
		fmt.Fprintf(out, "%d rows of %s published from %s to %s would be sent again; run again with -expect %d -by WHO -why WHY\n",
			n, f.Topic, f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339), n)
		return nil
	}
	if n != expect {
		return fmt.Errorf("republish: %d rows match now, not the %d expected: count again", n, expect)
	}
	done, err := admin.Republish(ctx, f, by, why)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d rows of %s marked unpublished by %s: the relay sends them again\n", done, f.Topic, by)
	return nil
}

func printRepublishes(out io.Writer, list []outboxadmin.Republished) {
	if len(list) == 0 {
		fmt.Fprintln(out, "nothing republished")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tTOPIC\tKEY\tSINCE\tUNTIL\tROWS\tBY\tWHY\tAT")
	for _, r := range list {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.Topic, opctl.Clip(r.Key, 40), r.Since.UTC().Format(time.RFC3339),
			r.Until.UTC().Format(time.RFC3339), r.Rows, r.By, opctl.Clip(r.Why, 60), r.RequestedAt.UTC().Format(time.RFC3339))
	}
	w.Flush()
}

func printList(out io.Writer, list []outboxadmin.ParkedRow) {
	if len(list) == 0 {
		fmt.Fprintln(out, "nothing parked")
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tTOPIC\tKEY\tMESSAGE\tBYTES\tPARKED\tWAITING\tREASON")
	for _, p := range list {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s ago\t%d\t%s\n", p.ID, p.Topic, opctl.Clip(p.Key, 40), p.MessageID, len(p.Payload),
			time.Since(p.ParkedAt).Round(time.Second), p.Waiting, opctl.Clip(p.Reason, 100))
	}
	w.Flush()
}

func printOne(out io.Writer, p outboxadmin.ParkedRow) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(w, "%s:\t%v\n", k, v) }
	row("id", p.ID)
	row("message id", p.MessageID)
	row("topic", p.Topic)
	row("key", p.Key)
	row("reason", p.Reason)
	row("written at", p.CreatedAt.Format(time.RFC3339))
	row("parked at", p.ParkedAt.Format(time.RFC3339))
	row("rows waiting behind it", p.Waiting)
	meta, _ := json.Marshal(p.Metadata)
	row("metadata", string(meta))
	payload := string(p.Payload)
	if !utf8.Valid(p.Payload) {
		payload = fmt.Sprintf("%d bytes, not UTF-8: %x", len(p.Payload), p.Payload[:min(len(p.Payload), 64)])
	}
	row("payload", fmt.Sprintf("%d bytes: %s", len(p.Payload), opctl.Clip(payload, 4096)))
	w.Flush()
}
