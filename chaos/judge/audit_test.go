package judge

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/audit"
)

// TestAuditVerdict: a finding raised is a failed run, open or resolved (a
// false alarm that resolved itself is still one in a clean run).
func TestAuditVerdict(t *testing.T) {
	t.Parallel()
	require.True(t, AuditVerdict(nil).OK)
	open := audit.Record{Check: "orders", Finding: audit.Finding{Entity: "o1", Kind: "answers-disagree", Detail: "orders says reserved"}}
	resolved := open
	resolved.Kind, resolved.ResolvedAt = "unanswered", time.Now()
	for _, recs := range [][]audit.Record{{open}, {resolved}, {open, resolved}} {
		v := AuditVerdict(recs)
		require.False(t, v.OK, "%+v", recs)
		require.Contains(t, v.Detail, recs[0].Kind)
	}
	require.Contains(t, AuditVerdict([]audit.Record{open, resolved}).Detail, "2 findings, 1 still open")
}

// TestAuditAlarmsVerdict: late work resolved is no alarm, however late
// (measured: the verdict counts what production would have paged for); a
// breach is, resolved or not; late work still found at the end is.
func TestAuditAlarmsVerdict(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	rec := func(kind string, open time.Duration, resolved bool) audit.Record {
		r := audit.Record{Check: "orders", Finding: audit.Finding{Entity: "o-" + kind, Kind: kind, Detail: "seen"}, FirstSeen: at}
		if resolved {
			r.ResolvedAt = at.Add(open)
		}
		return r
	}
	grace := 10 * time.Second
	require.True(t, AuditAlarmsVerdict(nil, grace, nil).OK)
	injected := rec("answers-disagree", time.Second, true)
	v := AuditAlarmsVerdict([]audit.Record{injected}, grace, map[string]bool{injected.Entity: true})
	require.True(t, v.OK, "a finding about an injected breach is its class's to judge: %s", v.Detail)
	require.Contains(t, v.Detail, "but the 1 about injected breaches")
	var late []audit.Record
	for _, k := range LatenessKinds {
		late = append(late, rec(k, AlarmLateness-grace, true))
	}
	v = AuditAlarmsVerdict(late, grace, nil)
	require.True(t, v.OK, v.Detail)
	require.Contains(t, v.Detail, "the latest 3m0s late, 0 later than production pages at")
	v = AuditAlarmsVerdict(append(late, rec("unanswered", AlarmLateness, true)), grace, nil)
	require.True(t, v.OK, v.Detail)
	require.Contains(t, v.Detail, "the latest 3m10s late, 1 later than production pages at")

	for name, bad := range map[string]audit.Record{
		"a breach, resolved":   rec("answers-disagree", time.Second, true),
		"a breach, open":       rec("wrong-quantities", 0, false),
		"late work still open": rec("unanswered", 0, false),
	} {
		v := AuditAlarmsVerdict(append(append([]audit.Record{}, late...), bad), grace, map[string]bool{"o-other": true})
		require.False(t, v.OK, name)
		require.Contains(t, v.Detail, bad.Entity, name)
		require.Contains(t, v.Detail, "1 alarms", name)
	}
}
