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
