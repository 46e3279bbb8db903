package ledger_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// TestCountsByKeyIPAttrs: CountsBy and TotalCountsBy group by what the
// limiter's keys held of each entry's client address and attributes
// (Entry.KeyIP, Entry.KeyAttrs), on both stores, so that limits keyed by
// them are restored each on its counter; a settlement keeps the
// reservation's; an entry without them is in the group of the empty
// ones. An entry reads back with them; KeyAttrs may be longer than other
// fields, up to MaxKeyAttrs, and no longer.
func TestCountsByKeyIPAttrs(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		long := "project=" + strings.Repeat("p", 3000) + ":team=" + strings.Repeat("t", 3000)
		reserve := func(id, tenant, ip, attrs string) {
			t.Helper()
			countsReserve(ctx, t, l, id, func(e *ledger.Entry) { e.Tenant, e.KeyIP, e.KeyAttrs = tenant, ip, attrs })
		}
		reserve("a1", "acme", "192.0.2.1", "project=a")
		reserve("a2", "acme", "192.0.2.1", "project=a:team=x")
		countsSettle(ctx, t, l, settlement("a2", 1_000)) // a settlement keeps the reservation's keys
		reserve("a3", "acme", "2001:db8::/64", "project=a")
		reserve("a4", "acme", "", long)
		reserve("a5", "acme", "", "")
		reserve("g1", "globex", "192.0.2.1", "project=a")
		flush(t, l)

		e := ledger.Entry{RequestID: "too-long", Tenant: "acme", Decision: "allow", Status: ledger.StatusReserved, Requests: 1,
			CreatedAt: t0, KeyAttrs: strings.Repeat("a", ledger.MaxKeyAttrs+1)}
		if err := l.Reserve(ctx, e); !errors.Is(err, ledger.ErrInvalid) {
			t.Fatalf("an entry of %d bytes of key attributes: %v; want ErrInvalid", len(e.KeyAttrs), err)
		}
		if e, ok, err := l.Lookup(ctx, "a2"); err != nil || !ok || e.KeyIP != "192.0.2.1" || e.KeyAttrs != "project=a:team=x" {
			t.Fatalf("a2 read back: %+v, %v, %v; want its key ip and attributes", e, ok, err)
		}
		if e, ok, err := l.Lookup(ctx, "a4"); err != nil || !ok || e.KeyAttrs != long {
			t.Fatalf("a4 read back: %d bytes of key attributes, %v, %v; want %d", len(e.KeyAttrs), ok, err, len(long))
		}
		from, to := t0.Add(-time.Hour), t0.Add(time.Hour)
		acme := all(t, l, ledger.Query{Tenant: "acme", From: from, To: to})
		for _, by := range []ledger.GroupBy{{IP: true}, {Attrs: true}, {IP: true, Attrs: true}, {User: true, IP: true}} {
			gs, err := l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", From: from, To: to}, by)
			if err != nil {
				t.Fatal(err)
			}
			sameGroups(t, gs, countsByRef(acme, by))
		}
		gs, err := l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", From: from, To: to}, ledger.GroupBy{IP: true})
		if got := groupsOf(t, gs); err != nil || len(got) != 3 || got[ledger.Group{KeyIP: "192.0.2.1"}].Counts.Requests != 2 ||
			got[ledger.Group{KeyIP: ""}].Counts.Requests != 2 {
			t.Fatalf("acme's groups by ip = %+v, %v; want 192.0.2.1 2, 2001:db8::/64 1, none 2", gs, err)
		}
		gs, err = l.TotalCountsBy(ctx, ledger.SpendQuery{From: from, To: to}, ledger.GroupBy{Attrs: true})
		if got := groupsOf(t, gs); err != nil || len(got) != 4 || got[ledger.Group{KeyAttrs: "project=a"}].Counts.Requests != 3 {
			t.Fatalf("every tenant's groups by attributes = %+v, %v; want project=a 3 and 3 others", gs, err)
		}
	})
}

// TestCountsByKeyDesc: CountsBy and TotalCountsBy grouped by the
// descriptor counters an entry records (Entry.KeyDesc) select only the
// entries that record some, on both stores, and answer one group per
// counter, its line's amount summed over the entries (of one entry each,
// Group.Entries 1, and no counts or charge): a reservation failed
// without an HTTP status counts none, a settlement keeps the
// reservation's KeyDesc. An entry reads back with it, up to MaxKeyDesc
// bytes and no longer.
func TestCountsByKeyDesc(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		reserve := func(id, tenant, desc string) {
			t.Helper()
			countsReserve(ctx, t, l, id, func(e *ledger.Entry) { e.Tenant, e.KeyDesc = tenant, desc })
		}
		const a, b = "search\t2\t10\t60000000000\t0\t0\t{acme}:search\t1", "tok\t0\t5\t1\t0\t0\t{acme}:x%09y\t7"
		reserve("d1", "acme", a)
		reserve("d2", "acme", a)
		reserve("d3", "acme", a+"\n"+b)
		countsSettle(ctx, t, l, settlement("d3", 0)) // a settlement keeps the reservation's counters
		reserve("d4", "acme", a)
		countsSettle(ctx, t, l, ledger.Entry{RequestID: "d4", Status: ledger.StatusFailed}) // never reached its upstream
		reserve("d5", "acme", "")
		reserve("g1", "globex", a)
		flush(t, l)

		e := ledger.Entry{RequestID: "too-long", Tenant: "acme", Decision: "allow", Status: ledger.StatusReserved, Requests: 1,
			CreatedAt: t0, KeyDesc: strings.Repeat("a", ledger.MaxKeyDesc+1)}
		if err := l.Reserve(ctx, e); !errors.Is(err, ledger.ErrInvalid) {
			t.Fatalf("an entry of %d bytes of descriptor counters: %v; want ErrInvalid", len(e.KeyDesc), err)
		}
		if e, ok, err := l.Lookup(ctx, "d3"); err != nil || !ok || e.KeyDesc != a+"\n"+b {
			t.Fatalf("d3 read back: %q, %v, %v; want its descriptor counters", e.KeyDesc, ok, err)
		}
		from, to := t0.Add(-time.Hour), t0.Add(time.Hour)
		counter := func(line string, n int64) ledger.Group {
			return ledger.Group{KeyDesc: line[:strings.LastIndexByte(line, '\t')+1] + strconv.FormatInt(n, 10), Entries: 1}
		}
		gs, err := l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", From: from, To: to}, ledger.GroupBy{Desc: true})
		if err != nil {
			t.Fatal(err)
		}
		// d1, d2 and d3 once each on a's counter, d3 7 on b's.
		if want := []ledger.Group{counter(a, 3), counter(b, 7)}; !sameSet(gs, want) {
			t.Fatalf("acme's groups by descriptor counters = %+v; want %+v", gs, want)
		}
		gs, err = l.TotalCountsBy(ctx, ledger.SpendQuery{From: from, To: to}, ledger.GroupBy{Desc: true})
		if want := []ledger.Group{counter(a, 4), counter(b, 7)}; err != nil || !sameSet(gs, want) {
			t.Fatalf("every tenant's groups by descriptor counters = %+v, %v; want %+v", gs, err, want)
		}
	})
}

// sameSet reports whether gs are the groups of want, in any order.
func sameSet(gs, want []ledger.Group) bool {
	if len(gs) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.Contains(gs, w) {
			return false
		}
	}
	return true
}
