// Command outboxctl lets an operator deal with the outbox rows a relay
// parked because the broker will never take them (too large for the
// producer or the topic, an invalid record), in the producer's database
// (DATABASE_URL).
//
//	outboxctl list
//	outboxctl show ID
//	outboxctl retry ID
//	outboxctl drop -by WHO -why WHY ID
//
// A parked row holds back the later rows of its topic and partition key.
// retry sends it again (fix what refused it first: the topic's
// max.message.bytes, the producer's limit); drop moves it to outbox_dropped
// with who and why, and lets its key go on without it.
package main

import (
	"context"
	"encoding/json"
	"errors"
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
DATABASE_URL names the producer's database.`,
	Database: "the producer's database",
}

func main() { tool.Main(run) }

func run(ctx context.Context, args []string, out io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("outboxctl", flag.ContinueOnError)
	by := fs.String("by", opctl.Operator(getenv), "drop: who drops the row (recorded)")
	why := fs.String("why", "", "drop: why (recorded)")
	cmd, rest, help, err := tool.Parse(fs, args, out, "list", "show", "retry", "drop")
	if err != nil || help {
		return err
	}
	var id int64
	if cmd == "list" {
		err = tool.NoArgs(cmd, rest)
	} else {
		id, err = tool.ID(cmd, rest)
	}
	if err != nil {
		return err
	}
	if cmd == "drop" && strings.TrimSpace(*why) == "" {
		return errors.New("drop needs -why: it is kept as the audit record")
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
	}
	return nil
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
