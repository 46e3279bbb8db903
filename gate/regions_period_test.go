package gate

import (
	"testing"
	"time"

	"github.com/costgate/costgate/weighted"
)

// TestPeriodEnd reads back the end of every period periodName names, and
// refuses names it did not write (a row of another version, or hand-made)
// rather than guess: such rows are never swept.
func TestPeriodEnd(t *testing.T) {
	at := time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC)
	for _, l := range []weighted.Limit{
		{Period: 24 * time.Hour}, {Period: time.Hour}, {Period: 7 * 24 * time.Hour}, {Period: time.Microsecond},
		{Calendar: weighted.Month},
	} {
		name := periodName(l, at)
		end, ok := periodEnd(name)
		if !ok || !end.After(at) || (l.Calendar != weighted.Month && end.Sub(at) > l.Period) {
			t.Errorf("%s: end %v %v, for a period holding %v", name, end, ok, at)
		}
	}
	if end, _ := periodEnd(periodName(weighted.Limit{Calendar: weighted.Month}, at)); !end.Equal(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("December 2026 ends %v", end)
	}
	for _, bad := range []string{"", "p", "p:", "p0:1", "p-5:1", "p10:-1", "p10", "px:1", "p10:x", "month:", "month:2026-13", "month:26-1",
		"day:20425", "p9223372036854775807:2", "p2:9223372036854775807"} {
		if end, ok := periodEnd(bad); ok {
			t.Errorf("%q read as ending %v", bad, end)
		}
	}
}

// TestLowering: what a rebalance writes and takes in process for each
// state of a lowering.
func TestLowering(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	hold := 20 * time.Second
	for _, c := range []struct {
		name                string
		next, row, target   int64
		since, now          time.Time
		wantRow, wantInproc int64
		wantTarget          int64
		wantSince           time.Time
	}{
		{"nothing to lower", 50, 50, -1, time.Time{}, t0, 50, 50, -1, time.Time{}},
		{"a target at the row is dropped", 50, 50, 50, t0, t0, 50, 50, -1, time.Time{}},
		{"announced", 10, 50, -1, time.Time{}, t0, 50, 10, 10, t0},
		{"still announced", 30, 50, 10, t0, t0.Add(hold - 1), 50, 10, 10, t0},
		{"committed", 30, 50, 10, t0, t0.Add(hold), 10, 10, -1, time.Time{}},
		{"lowered again: the wait starts anew", 5, 50, 10, t0, t0.Add(hold), 50, 5, 5, t0.Add(hold)},
	} {
		row, inproc, tgt, since := lowering(c.next, c.row, c.target, c.since, c.now, hold)
		if row != c.wantRow || inproc != c.wantInproc || tgt != c.wantTarget || !since.Equal(c.wantSince) {
			t.Errorf("%s: row %d, in process %d, target %d since %v; want %d, %d, %d since %v",
				c.name, row, inproc, tgt, since, c.wantRow, c.wantInproc, c.wantTarget, c.wantSince)
		}
	}
}
