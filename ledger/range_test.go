package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

func TestParseRange(t *testing.T) {
	day := func(d int) time.Time { return time.Date(2026, 3, d, 0, 0, 0, 0, time.UTC) }
	cases := []struct {
		name, from, to string
		start, end     time.Time
		invalid        bool
	}{
		{"one day", "2026-03-14", "2026-03-14", day(14), day(15), false},
		{"a month of days", "2026-03-01", "2026-03-31", day(1), day(31).AddDate(0, 0, 1), false},
		{"times are exact", "2026-03-14T15:09:26.535897Z", "2026-03-14T17:00:00+01:00",
			time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC), day(14).Add(16 * time.Hour), false},
		{"a date and a time", "2026-03-14", "2026-03-14T12:00:00Z", day(14), day(14).Add(12 * time.Hour), false},
		{"a time and a date", "2026-03-13T12:00:00Z", "2026-03-14", day(13).Add(12 * time.Hour), day(15), false},
		{"open bounds", "", "", time.Time{}, time.Time{}, false},
		{"open start", "", "2026-03-14", time.Time{}, day(15), false},
		{"equal times are an empty range", "2026-03-14T12:00:00Z", "2026-03-14T12:00:00Z", day(14).Add(12 * time.Hour), day(14).Add(12 * time.Hour), false},
		{"to before from", "2026-03-15", "2026-03-14", time.Time{}, time.Time{}, true},
		{"time before from", "2026-03-14T12:00:00Z", "2026-03-14T11:00:00Z", time.Time{}, time.Time{}, true},
		{"no zone", "2026-03-14T12:00:00", "", time.Time{}, time.Time{}, true},
		{"not a date", "yesterday", "", time.Time{}, time.Time{}, true},
		{"bad to", "", "2026-02-30", time.Time{}, time.Time{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start, end, err := ledger.ParseRange(c.from, c.to)
			if c.invalid {
				if !errors.Is(err, ledger.ErrInvalid) {
					t.Fatalf("ParseRange(%q, %q) = %v, %v, %v; want ErrInvalid", c.from, c.to, start, end, err)
				}
				return
			}
			if err != nil || !start.Equal(c.start) || !end.Equal(c.end) {
				t.Fatalf("ParseRange(%q, %q) = %v, %v, %v; want %v, %v", c.from, c.to, start, end, err, c.start, c.end)
			}
		})
	}
}

// TestExportRange exports entries at the edges of a day through the bounds
// ParseRange gives: a day includes its first and last microsecond and
// nothing of the next; an instant is exact.
func TestExportRange(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		day := time.Date(2026, 3, 14, 0, 0, 0, 0, time.UTC)
		at := map[string]time.Time{
			"day-before-last": day.Add(-time.Microsecond),
			"first":           day,
			"noon":            day.Add(12 * time.Hour),
			"last":            day.Add(24*time.Hour - time.Microsecond),
			"next-day":        day.Add(24 * time.Hour),
		}
		for id, t0 := range at {
			if err := l.Reserve(ctx, reservation(id, t0)); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		for _, c := range []struct {
			name, from, to string
			want           []string
		}{
			{"one day", "2026-03-14", "2026-03-14", []string{"first", "noon", "last"}},
			{"two days", "2026-03-13", "2026-03-14", []string{"day-before-last", "first", "noon", "last"}},
			{"from an instant to a day", "2026-03-14T12:00:00Z", "2026-03-15", []string{"noon", "last", "next-day"}},
			{"to an instant, excluded", "2026-03-14", "2026-03-14T12:00:00Z", []string{"first"}},
			{"instants to the microsecond", "2026-03-13T23:59:59.999999Z", "2026-03-14T00:00:00.000001Z", []string{"day-before-last", "first"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				from, to, err := ledger.ParseRange(c.from, c.to)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, e := range all(t, l, ledger.Query{Tenant: "acme", From: from, To: to}) {
					got = append(got, e.RequestID)
				}
				if len(got) != len(c.want) {
					t.Fatalf("got %v, want %v", got, c.want)
				}
				for i := range got {
					if got[i] != c.want[i] {
						t.Fatalf("got %v, want %v", got, c.want)
					}
				}
			})
		}
	})
}
