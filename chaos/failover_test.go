package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWindowEnd: a failover's stall window ends two minutes after its
// primary returned, or where the next failover began, so one failover's
// stall is not counted as its predecessor's.
func TestWindowEnd(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	s := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	f := &dbFailovers{rows: []failoverRow{
		{Kind: failoverKilled, at: s(0), back: s(20)},
		{Kind: failoverCutOff, at: s(60), back: s(83)},
		{Kind: failoverSwitch, Error: "no primary"}, // never began
		{Kind: failoverSwitch, at: s(400), back: s(408)},
	}}
	require.Equal(t, s(60), f.windowEnd(0), "the next failover began 40s after the first one's primary returned")
	require.Equal(t, s(83).Add(stallAfter), f.windowEnd(1), "the next one began long after: two minutes")
	require.Equal(t, s(408).Add(stallAfter), f.windowEnd(3), "the last one")
}
