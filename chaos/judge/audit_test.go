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
