package judge

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The ends a hostile message can be held to besides an inbox_quarantine
// kind (dead_letter, malformed, conflict, …).
const (
	KindRefused       = "refused"           // the consumer's domain guard refused it, with a reason (its refusals table)
	KindBrokerRefused = "refused_by_broker" // the broker refused the write: its principal may not write the topic
	// KindRefusedOrRepaired: a wrong answer signed as its producer (a
	// producer's bug) for a paid order: refused by the consumer's domain
	// guard when the producer's real answer came first, or else applied,
	// found by the auditor and repaired (WrongAnswerOutcome).
	KindRefusedOrRepaired = "refused_or_repaired"
	KindHTTP              = "4xx" // a hostile HTTP request: answered 4xx with a JSON reason
)

// HostileMessage is one hostile class a driver put on a topic itself,
// bypassing every outbox, and what must become of it.
type HostileMessage struct {
	Class    string
	Consumer string // the service whose inbox must catch it
	Topic    string
	ID       string // the message id it was sent under
	// RecordedAs is the id its consumer's rows hold: ID, or the id the inbox
	// records a message under whose id Postgres text cannot hold.
	RecordedAs string
	Kind       string // the inbox_quarantine kind it must end as, KindRefused or KindBrokerRefused
	Reason     string // what its reason must say, when set
	Payload    []byte
	Times      int    // deliveries
	As         string // the principal that wrote it (KindBrokerRefused)
	Order      string // the order it concerns (KindRefusedOrRepaired)
}

// HostileResult is one hostile class's outcome. For the HTTP classes
// ExpectedKind is KindHTTP and QuarantinedOrDead counts the requests refused
// with a 4xx and a reason.
type HostileResult struct {
	Sent              int    `json:"sent"`
	QuarantinedOrDead int    `json:"quarantined_or_dead"`
	SuppressedRepeats int    `json:"suppressed_repeats,omitempty"`
	Reason            string `json:"reason,omitempty"`
	ExpectedKind      string `json:"expected_kind"`
	Handled           bool   `json:"handled"`
}

// HostileOutcome looks a hostile message up in its consumer's database
// (pool). It is handled when every delivery is accounted for: refused by
// the domain guard with a reason (KindRefused), or recorded in
// inbox_quarantine with the expected kind, its payload and a reason that
// says what it must, or (for repeats of an already dead-lettered id)
// suppressed as a duplicate.
func HostileOutcome(ctx context.Context, pool *pgxpool.Pool, m HostileMessage) (HostileResult, error) {
	r := HostileResult{Sent: m.Times, ExpectedKind: m.Kind}
	var reason *string
	if m.Kind == KindRefused {
		if err := pool.QueryRow(ctx, `SELECT count(*), min(reason) FROM refusals WHERE message_id = $1`, m.ID).
			Scan(&r.QuarantinedOrDead, &reason); err != nil {
			return r, err
		}
		if reason != nil {
			r.Reason = *reason
		}
		// >=: without the inbox, a redelivered original under the same id
		// (the conflict's) is refused as well.
		r.Handled = r.QuarantinedOrDead >= m.Times && r.Reason != ""
		return r, nil
	}
	sum := sha256.Sum256(m.Payload)
	var rows int
	if err := pool.QueryRow(ctx, `
		SELECT count(*), min(reason) FROM inbox_quarantine
		WHERE consumer = $1 AND message_id = $2 AND kind = $3 AND payload_sha256 = $4`,
		m.Consumer, m.RecordedAs, m.Kind, sum[:]).Scan(&rows, &reason); err != nil {
		return r, err
	}
	if reason != nil {
		r.Reason = *reason
	}
	var dups int
	if m.RecordedAs != "" {
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(duplicates), 0) FROM inbox_messages WHERE consumer = $1 AND message_id = $2`,
			m.Consumer, m.RecordedAs).Scan(&dups); err != nil {
			return r, err
		}
	}
	r.QuarantinedOrDead = min(rows, m.Times)
	if m.Times > 1 {
		r.SuppressedRepeats = dups
		r.QuarantinedOrDead = min(m.Times, rows+dups)
	}
	r.Handled = rows >= 1 && r.QuarantinedOrDead == m.Times && r.Reason != "" && strings.Contains(r.Reason, m.Reason)
	return r, nil
}

// RepairMark ends the reason the auditor gives orders when it has a
// capture refunded (services/auditor repair.go; TestChaosJudgesTheseKinds
// holds it to it): orders keeps it as the order's reject_reason.
const RepairMark = "(audit: answers-disagree)"

// WrongAnswerOutcome judges a wrong answer orders received for m.Order, a
// paid order inventory rejects (KindRefusedOrRepaired): handled when
// orders' guard refused it (inventory's answer came first), or when the
// auditor (its database: audit) found the disagreement and the order ended
// as its repair makes it: rejected, its capture refunded, at the auditor's
// request. That request shows on the finding (repair) or, when the
// auditor's record of it was lost (its database restarted between the call
// and the record: the recheck then resolves the finding, no longer
// holding), in the order's reason (RepairMark).
func WrongAnswerOutcome(ctx context.Context, orders, audit *pgxpool.Pool, m HostileMessage) (HostileResult, error) {
	r := HostileResult{Sent: m.Times, ExpectedKind: m.Kind}
	var refused int
	var reason *string
	if err := orders.QueryRow(ctx, `SELECT count(*), min(reason) FROM refusals WHERE message_id = $1`, m.ID).Scan(&refused, &reason); err != nil {
		return r, err
	}
	if refused > 0 && reason != nil {
		r.QuarantinedOrDead, r.Reason, r.Handled = refused, "refused: "+*reason, true
		return r, nil
	}
	var status, payment, why string
	if err := orders.QueryRow(ctx, `SELECT status, coalesce(payment, ''), coalesce(reject_reason, '') FROM orders WHERE id::text = $1`,
		m.Order).Scan(&status, &payment, &why); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			r.Reason = "no such order"
			return r, nil
		}
		return r, err
	}
	var found int
	var repair *string
	if err := audit.QueryRow(ctx, `SELECT count(*), max(repair) FROM audit_findings WHERE check_name = 'orders' AND entity = $1 AND kind = 'answers-disagree'`,
		m.Order).Scan(&found, &repair); err != nil {
		return r, err
	}
	r.Reason = fmt.Sprintf("order %s, payment %s; the auditor's answers-disagree findings: %d", status, payment, found)
	asked := repair != nil || strings.HasSuffix(why, RepairMark)
	switch {
	case repair != nil:
		r.Reason += ", repaired: " + *repair
	case asked:
		r.Reason += ", repaired (the order's reason: " + why + "; the auditor's record of it lost)"
	}
	r.Handled = found > 0 && asked && status == "rejected" && payment == "refunded"
	if r.Handled {
		r.QuarantinedOrDead = 1
	}
	return r, nil
}

// BrokerRefusedOutcome judges a write the broker must refuse: handled when
// it was tried (sent), the broker refused it for authorization (refusal),
// and no trace of its id is in its consumer's database (inbox, quarantine,
// refusals), so nothing of it was ever applied.
func BrokerRefusedOutcome(ctx context.Context, pool *pgxpool.Pool, m HostileMessage, sent bool, refusal error) (HostileResult, error) {
	r := HostileResult{Sent: m.Times, ExpectedKind: m.Kind}
	var seen int
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM inbox_messages WHERE message_id = $1) +
		(SELECT count(*) FROM inbox_quarantine WHERE message_id = $1) +
		(SELECT count(*) FROM refusals WHERE message_id = $1)`, m.ID).Scan(&seen); err != nil {
		return r, err
	}
	switch {
	case !sent:
		r.Reason = "not sent"
	case refusal == nil:
		r.Reason = fmt.Sprintf("the broker accepted it from %s", m.As)
	case !errors.Is(refusal, sarama.ErrTopicAuthorizationFailed):
		r.Reason = "not refused for authorization: " + refusal.Error()
	case seen > 0:
		r.Reason = fmt.Sprintf("refused by the broker, yet %d row(s) of its id in %s", seen, m.Consumer)
	default:
		r.QuarantinedOrDead, r.Handled = m.Times, true
		r.Reason = fmt.Sprintf("%s may not write %s: %v", m.As, m.Topic, refusal)
	}
	return r, nil
}

// HTTPOutcome judges one hostile HTTP request by its answer: handled when
// it was refused with a 4xx and a JSON reason (err: no replica answered).
func HTTPOutcome(status int, reason string, err error) HostileResult {
	r := HostileResult{Sent: 1, ExpectedKind: KindHTTP}
	switch {
	case err != nil:
		r.Reason = "no answer: " + err.Error()
	case status >= 400 && status < 500 && reason != "":
		r.QuarantinedOrDead, r.Reason, r.Handled = 1, fmt.Sprintf("%d: %s", status, reason), true
	default:
		r.Reason = fmt.Sprintf("%d: %s", status, reason)
	}
	return r
}
