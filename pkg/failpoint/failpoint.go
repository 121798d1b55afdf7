// Package failpoint names every crash window of the outbox and the inbox, and,
// in a binary built with the failpoint build tag, kills the process with a
// real SIGKILL when a window is armed.
//
// A default build carries no kill switch: [Hit] is an empty function the
// compiler removes, [FromEnv] reads nothing, and FAILPOINTS in the
// environment changes nothing. The chaos harness, the e2e tests and the
// narrated scenarios build the services with
//
//	go build -tags failpoint ./services/orders
//
// and only there a window is armed, through the environment, once the
// program calls [FromEnv]:
//
//	FAILPOINTS="after-commit-before-ack=p:0.05,after-publish-before-mark=every:40"
//	FAILPOINT_SEED=42          # makes probabilistic schedules reproducible
//	FAILPOINT_LOG=/tmp/fp.log  # a line is appended here before each kill
//	FAILPOINT_GRACE=1s         # no window fires until the process is this old
//	FAILPOINT_TRACE=before-begin  # a line is appended to the log at every hit of these windows
//
// A running failpoint build can also be armed for one window's next hit
// (Once, which the services serve as POST /debug/crash for the live
// demo's "crash it now") and disarmed (Disarm).
//
// The grace period lets a restarted process catch up and commit its offsets
// before it can be killed again: without it, a schedule that kills every
// 40th message would kill every incarnation inside the same 40 redelivered
// messages, forever.
//
// A trace line ("failpoint NAME hit: pid N subject S") records that a
// process reached a window, fired or not: the chaos harness reads, after a
// kill, whether the killed subject was seen again by another process (a
// redelivery measured, not inferred).
//
// In a failpoint build with FAILPOINTS and FAILPOINT_TRACE empty, Hit is two
// atomic loads and a return: it costs nothing on the hot path (with tracing on, every hit
// takes a lock and writes a line: for chaos runs only). When a window fires there is no deferred code, no
// graceful shutdown and no recover: the kernel removes the process, exactly as
// a power cut or an OOM kill would.
package failpoint

import (
	"strings"
	"unicode"
)

// Name is a crash window.
type Name string

// The crash windows. The chaos harness arms each of these and checks that
// every one of them fired.
const (
	// Consumer (inbox middleware).
	BeforeBegin              Name = "before-begin"                // message delivered, no transaction yet
	AfterInboxInsert         Name = "after-inbox-insert"          // inbox row inserted, handler not run
	AfterHandlerBeforeCommit Name = "after-handler-before-commit" // domain writes done, not committed
	AfterCommitBeforeAck     Name = "after-commit-before-ack"     // committed, Kafka offset not marked

	// Relay (outbox).
	AfterClaimBeforePublish Name = "after-claim-before-publish" // rows locked, nothing sent to Kafka
	AfterPublishBeforeMark  Name = "after-publish-before-mark"  // Kafka has the messages, their mark not committed

	// HTTP.
	AfterCommitBeforeResponse Name = "after-commit-before-response" // payment committed, client gets no answer

	// Effects (pkg/effect): calls to the world outside the database.
	BeforeEffect            Name = "before-effect"              // intent committed, call not made
	AfterEffectBeforeRecord Name = "after-effect-before-record" // the outside system performed it, our record not committed
)

// All lists every crash window, in the order a message meets them.
var All = []Name{
	AfterCommitBeforeResponse,
	AfterClaimBeforePublish, AfterPublishBeforeMark,
	BeforeBegin, AfterInboxInsert, AfterHandlerBeforeCommit, AfterCommitBeforeAck,
	BeforeEffect, AfterEffectBeforeRecord,
}

// Hit marks that the code reached window n while working on subject (a
// message id, an order id: it goes into the kill line, so the harness can
// follow what happened to that subject afterwards). If n is armed and its
// schedule says so, the process is killed with SIGKILL before Hit returns.
// In a default build it does nothing.
func Hit(n Name, subject string) {
	if !Enabled || !active() {
		return
	}
	logged := LoggedSubject(subject)
	hit(n, logged)
}

// LoggedSubject is subject as a trace or kill line writes it, one field of
// the line: a subject comes from a producer (a message id), and one holding
// a space or a newline must not make a line of its own, so spaces and
// control characters become '?' (and invalid UTF-8 U+FFFD); longer than 200
// bytes, it is cut. A reader of the log matches subjects through it.
func LoggedSubject(subject string) string {
	if len(subject) > 200 {
		subject = subject[:200]
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, subject)
}
