package ledger_test

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// countsByRef is what CountsBy should answer for the entries es, grouped
// by by: each group's Entry.Counts and Entry.Charge summed, keyed by its
// columns, the route and model the limiter keyed the entry by.
func countsByRef(es []ledger.Entry, by ledger.GroupBy) map[ledger.Group]ledger.Group {
	pick := func(on bool, v string) string {
		if on {
			return v
		}
		return ""
	}
	out := map[ledger.Group]ledger.Group{}
	for _, e := range es {
		k := ledger.Group{User: pick(by.User, e.User), KeyID: pick(by.KeyID, e.KeyID), Route: pick(by.Route, cmp.Or(e.KeyRoute, e.Route)),
			Upstream: pick(by.Upstream, e.Upstream), Model: pick(by.Model, cmp.Or(e.KeyModel, e.Model)), Region: pick(by.Region, e.Region), Plan: pick(by.Plan, e.Plan),
			KeyIP: pick(by.IP, e.KeyIP), KeyAttrs: pick(by.Attrs, e.KeyAttrs), KeyDesc: pick(by.Desc, e.KeyDesc)}
		if by.Desc && e.KeyDesc == "" {
			continue // a read by descriptor counters selects the entries that record some
		}
		g := out[k]
		g.User, g.KeyID, g.Route, g.Upstream, g.Model, g.Region, g.Plan = k.User, k.KeyID, k.Route, k.Upstream, k.Model, k.Region, k.Plan
		g.KeyIP, g.KeyAttrs, g.KeyDesc = k.KeyIP, k.KeyAttrs, k.KeyDesc
		if (e.Decision == "allow" || e.Decision == "soft" || e.Decision == "") && (e.Status != ledger.StatusFailed || e.HTTPStatus != 0) {
			g.Entries++
		}
		n := e.Counts()
		g.Counts.Requests += n.Requests
		g.Counts.InputTokens += n.InputTokens
		g.Counts.OutputTokens += n.OutputTokens
		g.Charge += e.Charge()
		out[k] = g
	}
	return out
}

// groupsOf keys gs by their columns, and fails on a group seen twice.
func groupsOf(t *testing.T, gs []ledger.Group) map[ledger.Group]ledger.Group {
	t.Helper()
	out := map[ledger.Group]ledger.Group{}
	for _, g := range gs {
		k := ledger.Group{User: g.User, KeyID: g.KeyID, Route: g.Route, Upstream: g.Upstream, Model: g.Model, Region: g.Region, Plan: g.Plan,
			KeyIP: g.KeyIP, KeyAttrs: g.KeyAttrs, KeyDesc: g.KeyDesc}
		if _, dup := out[k]; dup {
			t.Fatalf("group %+v answered twice", k)
		}
		out[k] = g
	}
	return out
}

// sameGroups requires gs to be the groups of want, each equal to want's
// of its key (see groupsOf).
func sameGroups(t *testing.T, gs []ledger.Group, want map[ledger.Group]ledger.Group) {
	t.Helper()
	got := groupsOf(t, gs)
	if len(got) != len(want) {
		t.Fatalf("groups = %+v; want %+v", gs, want)
	}
	for k, w := range want {
		g := got[k]
		// The wants written out leave the entries out (refGroups checks them).
		g.Entries, g.PendingEntries, w.Entries, w.PendingEntries = 0, 0, 0, 0
		if g != w {
			t.Errorf("group %+v = %+v; want %+v", k, got[k], w)
		}
	}
}

// refGroups requires gs, CountsBy's answer, to be the groups of sel
// grouped by by, groups of them, each as sel's entries add up.
func refGroups(t *testing.T, gs []ledger.Group, sel []ledger.Entry, by ledger.GroupBy, groups int) {
	t.Helper()
	want, got := countsByRef(sel, by), groupsOf(t, gs)
	if len(got) != groups || len(want) != groups {
		t.Fatalf("%d groups (%d in the entries), want %d: %+v", len(got), len(want), groups, gs)
	}
	for k, w := range want {
		if g := got[k]; g != w {
			t.Errorf("group %+v = %+v; the entries add up to %+v", k, g, w)
		}
	}
}

// inRegion is the entries of es recorded in region; all of them for
// region "".
func inRegion(es []ledger.Entry, region string) []ledger.Entry {
	var sel []ledger.Entry
	for _, e := range es {
		if region == "" || e.Region == region {
			sel = append(sel, e)
		}
	}
	return sel
}

// TestCountsByModelRouteAndUpstream: CountsBy answers, on both stores,
// one group per distinct value of the columns it groups by among the
// entries the query selects, each with what its entries counted on a
// limiter (Entry.Counts: a refusal and a cancelled request count no
// request) and their charge (Entry.Charge, whatever the decision), as
// the entries read back add up; the range is exact; the most requests
// come first. An entry is in the group of the model and route the
// limiter keyed it by (Entry.KeyModel, KeyRoute): a downgraded request
// in its asked model's, a named reserve API request in the API's route's,
// and a settlement that names a model names its key model with it.
func TestCountsByModelRouteAndUpstream(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		reserve := func(id, user, model, route string, edit func(*ledger.Entry)) {
			t.Helper()
			countsReserve(ctx, t, l, id, func(e *ledger.Entry) {
				e.User, e.KeyID, e.Model, e.Route = user, "k-"+user, model, route
				if edit != nil {
					edit(e)
				}
			})
		}
		settle := func(e ledger.Entry) { t.Helper(); countsSettle(ctx, t, l, e) }
		reserve("a1", "ann", "gpt-4o", "chat", nil)
		settle(settlement("a1", 2_000))
		reserve("a2", "ann", "gpt-4o", "chat", nil) // open: its estimate
		reserve("a3", "ann", "gpt-4o-mini", "chat", nil)
		settle(settlement("a3", 500))
		reserve("a4", "ann", "gpt-4o-mini", "embed", func(e *ledger.Entry) { e.Upstream = "azure" })
		reserve("b1", "bob", "gpt-4o", "chat", func(e *ledger.Entry) { e.Requests = 60 })
		reserve("b2", "bob", "gpt-4o", "chat", nil)
		settle(ledger.Entry{RequestID: "b2", Status: ledger.StatusFailed}) // cancelled: no request
		reserve("h1", "bob", "gpt-4o", "chat", func(e *ledger.Entry) { e.Decision = "hard" })
		settle(settlement("h1", 700)) // charged, counted nowhere
		// Served by gpt-4o-mini, keyed by gpt-4o.
		reserve("d1", "ann", "gpt-4o-mini", "chat", func(e *ledger.Entry) { e.KeyModel = "gpt-4o" })
		// Named "summary", keyed by the API's route, "chat" here.
		reserve("n1", "bob", "gpt-4o", "summary", func(e *ledger.Entry) { e.KeyRoute = "chat" })
		// Reserved as gpt-4o by its alias, settled as served by gpt-4o-mini
		// when asked for gpt-4o.
		reserve("s1", "ann", "gpt-4o-2024-08-06", "chat", func(e *ledger.Entry) { e.KeyModel = "gpt-4o" })
		s1 := settlement("s1", 100)
		s1.Model, s1.KeyModel = "gpt-4o-mini", "gpt-4o"
		settle(s1)
		reserve("g1", "ann", "gpt-4o", "chat", func(e *ledger.Entry) { e.Tenant = "globex" })
		reserve("old", "ann", "gpt-4o", "chat", func(e *ledger.Entry) { e.CreatedAt = t0.Add(-2 * time.Hour) })
		flush(t, l)

		from, to := t0.Add(-time.Hour), t0.Add(time.Hour)
		entries := all(t, l, ledger.Query{Tenant: "acme", From: from, To: to})
		for _, c := range []struct {
			name   string
			q      ledger.SpendQuery
			by     ledger.GroupBy
			groups int
		}{
			{"tenant and model", ledger.SpendQuery{Tenant: "acme"}, ledger.GroupBy{Model: true}, 2},
			{"user and model", ledger.SpendQuery{Tenant: "acme"}, ledger.GroupBy{User: true, Model: true}, 3},
			{"key and route", ledger.SpendQuery{Tenant: "acme"}, ledger.GroupBy{KeyID: true, Route: true}, 3},
			{"upstream", ledger.SpendQuery{Tenant: "acme"}, ledger.GroupBy{Upstream: true}, 2},
			{"everything", ledger.SpendQuery{Tenant: "acme"}, ledger.GroupBy{User: true, KeyID: true, Route: true, Upstream: true, Model: true}, 4},
			{"one user by model", ledger.SpendQuery{Tenant: "acme", User: "ann"}, ledger.GroupBy{Model: true}, 2},
			{"no grouping", ledger.SpendQuery{Tenant: "acme"}, ledger.GroupBy{}, 1},
		} {
			t.Run(c.name, func(t *testing.T) {
				c.q.From, c.q.To = from, to
				gs, err := l.CountsBy(ctx, c.q, c.by)
				if err != nil {
					t.Fatal(err)
				}
				var sel []ledger.Entry
				for _, e := range entries {
					if c.q.User == "" || e.User == c.q.User {
						sel = append(sel, e)
					}
				}
				refGroups(t, gs, sel, c.by, c.groups)
				if !slices.IsSortedFunc(gs, func(a, b ledger.Group) int { return int(b.Counts.Requests - a.Counts.Requests) }) {
					t.Errorf("groups not most requests first: %+v", gs)
				}
			})
		}
		// bob's gpt-4o: 60 requests and the named one (the cancelled and
		// the refused count none), the refusal's charge all the same.
		gs, err := l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", User: "bob", From: from, To: to}, ledger.GroupBy{Model: true})
		if err != nil || len(gs) != 1 || gs[0].Counts.Requests != 61 || gs[0].Charge != 3_000+0+700+3_000 {
			t.Fatalf("bob's groups = %+v, %v", gs, err)
		}
		// ann's gpt-4o: a1, a2, the downgraded d1 and the settled s1.
		gs, err = l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", User: "ann", From: from, To: to}, ledger.GroupBy{Model: true, Route: true})
		if g := groupsOf(t, gs)[ledger.Group{Model: "gpt-4o", Route: "chat"}]; err != nil || g.Counts.Requests != 4 || g.Charge != 2_000+3_000+3_000+100 {
			t.Fatalf("ann's gpt-4o on chat = %+v, %v; want a1, a2, d1 and s1", g, err)
		}
		if gs, err := l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", From: t0.Add(time.Microsecond), To: to}, ledger.GroupBy{Model: true}); err != nil || len(gs) != 0 {
			t.Fatalf("CountsBy after the entries = %+v, %v; want none", gs, err)
		}
	})
}

// TestCountsByWhileTheStoreIsDown: with PostgreSQL stopped, CountsBy
// answers from the last read of the same query plus this node's records
// spooled since, in each record's group (a settlement in the group of
// its reservation), each group's part from the spool in its Pending
// fields, with a *LocalSpendError; a query never read says its store
// part is unknown. Once the store is back, it answers what the local
// answer said.
func TestCountsByWhileTheStoreIsDown(t *testing.T) {
	l, pg, ctx := storeDownLedger(t, ledger.Config{})
	reserve := func(id, user, model string) {
		t.Helper()
		countsReserve(ctx, t, l, id, func(e *ledger.Entry) { e.User, e.KeyID, e.Model = user, "k-"+user, model })
	}
	settle := func(e ledger.Entry) { t.Helper(); countsSettle(ctx, t, l, e) }
	month := ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0}
	byModel := ledger.GroupBy{User: true, Model: true}
	reserve("a1", "ann", "gpt-4o")
	settle(settlement("a1", 1_000))
	flush(t, l)
	if gs, err := l.CountsBy(ctx, month, byModel); err != nil || len(gs) != 1 {
		t.Fatalf("CountsBy before the outage = %+v, %v", gs, err)
	}

	pg.Stop()
	reserve("a2", "ann", "gpt-4o")
	settle(settlement("a2", 2_000)) // reserved and settled in the spool: its actual usage
	reserve("a3", "ann", "gpt-4o-mini")
	reserve("b1", "bob", "gpt-4o")
	settled := ledger.Counts{Requests: 1, InputTokens: 90, OutputTokens: 150}
	open := ledger.Counts{Requests: 1, InputTokens: 100, OutputTokens: 200}
	twice := ledger.Counts{Requests: 2, InputTokens: 180, OutputTokens: 300}
	want := map[ledger.Group]ledger.Group{
		{User: "ann", Model: "gpt-4o"}:      {User: "ann", Model: "gpt-4o", Counts: twice, Charge: 3_000, PendingCounts: settled, PendingCharge: 2_000},
		{User: "ann", Model: "gpt-4o-mini"}: {User: "ann", Model: "gpt-4o-mini", Counts: open, Charge: 3_000, PendingCounts: open, PendingCharge: 3_000},
		{User: "bob", Model: "gpt-4o"}:      {User: "bob", Model: "gpt-4o", Counts: open, Charge: 3_000, PendingCounts: open, PendingCharge: 3_000},
	}
	gs, err := l.CountsBy(ctx, month, byModel)
	var le *ledger.LocalSpendError
	if !errors.As(err, &le) || le.Unknown || le.Err == nil {
		t.Fatalf("CountsBy with the store down = %+v, %v; want a *LocalSpendError, the store's part known", gs, err)
	}
	sameGroups(t, gs, want)
	// A query never read: only what the store lacks, and unknown.
	gs, err = l.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0}, ledger.GroupBy{Model: true})
	if !errors.As(err, &le) || !le.Unknown || len(gs) != 2 {
		t.Fatalf("CountsBy of a query never read = %+v, %v; want the spool's two models, unknown", gs, err)
	}

	pg.Start()
	flush(t, l)
	gs, err = l.CountsBy(ctx, month, byModel)
	if err != nil {
		t.Fatal(err)
	}
	for k, w := range want {
		w.PendingCounts, w.PendingCharge = ledger.Counts{}, 0
		g := groupsOf(t, gs)[k]
		g.Entries = 0 // the want written out leaves it out
		if g != w {
			t.Errorf("after the outage, group %+v = %+v; want %+v", k, g, w)
		}
	}
}

// TestCountsByRefusesBadQueries: CountsBy refuses, as Counts does, a
// query without a tenant or with a filter no entry can have.
func TestCountsByRefusesBadQueries(t *testing.T) {
	l := open(t, ledger.Config{Dir: t.TempDir()})
	for _, q := range []ledger.SpendQuery{
		{Period: "day"},
		{Tenant: "acme\x00", Period: "day"},
		{Tenant: "acme", From: t0, To: t0},
	} {
		if _, err := l.CountsBy(context.Background(), q, ledger.GroupBy{Model: true}); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("CountsBy(%+v) = %v; want ErrInvalid", q, err)
		}
	}
}

// TestTotalCountsByEveryTenant: TotalCountsBy answers, on both stores,
// what CountsBy answers of one tenant for every tenant's entries
// together: one group per distinct value of the columns it groups by,
// each with what its entries of any tenant counted on a limiter and
// their charge, as the entries read back add up, an entry in the group
// of the model and route the limiter keyed it by; the range is exact,
// and a region selects that region's entries.
func TestTotalCountsByEveryTenant(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		reserve := func(id, tenant, model, route string, edit func(*ledger.Entry)) {
			t.Helper()
			countsReserve(ctx, t, l, id, func(e *ledger.Entry) {
				e.Tenant, e.Model, e.Route = tenant, model, route
				if edit != nil {
					edit(e)
				}
			})
		}
		settle := func(e ledger.Entry) { t.Helper(); countsSettle(ctx, t, l, e) }
		reserve("a1", "acme", "gpt-4o", "chat", nil)
		settle(settlement("a1", 2_000))
		reserve("a2", "acme", "gpt-4o-mini", "chat", nil)
		reserve("g1", "globex", "gpt-4o", "chat", func(e *ledger.Entry) { e.Requests = 60 })
		reserve("g2", "globex", "gpt-4o", "embed", func(e *ledger.Entry) { e.Region = "us" })
		reserve("g3", "globex", "gpt-4o", "chat", nil)
		settle(ledger.Entry{RequestID: "g3", Status: ledger.StatusFailed}) // cancelled: no request
		reserve("h1", "initech", "gpt-4o", "chat", func(e *ledger.Entry) { e.Decision = "hard" })
		settle(settlement("h1", 700)) // charged, counted nowhere
		// Served by gpt-4o-mini, keyed by gpt-4o; named, keyed by chat.
		reserve("d1", "initech", "gpt-4o-mini", "summary", func(e *ledger.Entry) { e.KeyModel, e.KeyRoute = "gpt-4o", "chat" })
		reserve("old", "acme", "gpt-4o", "chat", func(e *ledger.Entry) { e.CreatedAt = t0.Add(-2 * time.Hour) })
		flush(t, l)

		from, to := t0.Add(-time.Hour), t0.Add(time.Hour)
		entries := all(t, l, ledger.Query{From: from, To: to})
		for _, c := range []struct {
			name   string
			region string
			by     ledger.GroupBy
			groups int
		}{
			{"model", "", ledger.GroupBy{Model: true}, 2},
			{"route", "", ledger.GroupBy{Route: true}, 2},
			{"model and route", "", ledger.GroupBy{Model: true, Route: true}, 3},
			{"upstream", "", ledger.GroupBy{Upstream: true}, 1},
			{"nothing", "", ledger.GroupBy{}, 1},
			{"model in eu", "eu", ledger.GroupBy{Model: true}, 2},
			{"nothing in us", "us", ledger.GroupBy{}, 1},
		} {
			t.Run(c.name, func(t *testing.T) {
				gs, err := l.TotalCountsBy(ctx, ledger.SpendQuery{Region: c.region, From: from, To: to}, c.by)
				if err != nil {
					t.Fatal(err)
				}
				sel := inRegion(entries, c.region)
				refGroups(t, gs, sel, c.by, c.groups)
			})
		}
		// gpt-4o: a1, g1's 60, g2, d1 (the cancelled and the refused
		// count none), the refusal's charge all the same.
		gs, err := l.TotalCountsBy(ctx, ledger.SpendQuery{From: from, To: to}, ledger.GroupBy{Model: true})
		if g := groupsOf(t, gs)[ledger.Group{Model: "gpt-4o"}]; err != nil || g.Counts.Requests != 63 || g.Charge != 2_000+3_000+3_000+0+700+3_000 {
			t.Fatalf("every tenant's gpt-4o = %+v, %v; want a1, g1's 60, g2 and d1", g, err)
		}
		if gs, err := l.TotalCountsBy(ctx, ledger.SpendQuery{From: t0.Add(time.Microsecond), To: to}, ledger.GroupBy{Model: true}); err != nil || len(gs) != 0 {
			t.Fatalf("TotalCountsBy after the entries = %+v, %v; want none", gs, err)
		}
	})
}

// TestTotalCountsByWhileTheStoreIsDown: with PostgreSQL stopped,
// TotalCountsBy answers as CountsBy does: the last read of the same query
// plus this node's records spooled since, of every tenant, each group's
// part from the spool in its Pending fields, with a *LocalSpendError; a
// query never read says its store part is unknown.
func TestTotalCountsByWhileTheStoreIsDown(t *testing.T) {
	l, pg, ctx := storeDownLedger(t, ledger.Config{})
	reserve := func(id, tenant, model string) {
		t.Helper()
		countsReserve(ctx, t, l, id, func(e *ledger.Entry) { e.Tenant, e.Model = tenant, model })
	}
	day := ledger.SpendQuery{Period: "day", At: t0}
	byModel := ledger.GroupBy{Model: true}
	reserve("a1", "acme", "gpt-4o")
	countsSettle(ctx, t, l, settlement("a1", 1_000))
	flush(t, l)
	if gs, err := l.TotalCountsBy(ctx, day, byModel); err != nil || len(gs) != 1 {
		t.Fatalf("TotalCountsBy before the outage = %+v, %v", gs, err)
	}

	pg.Stop()
	reserve("g1", "globex", "gpt-4o")
	reserve("b1", "beta", "gpt-4o-mini")
	open := ledger.Counts{Requests: 1, InputTokens: 100, OutputTokens: 200}
	want := map[ledger.Group]ledger.Group{
		{Model: "gpt-4o"}: {Model: "gpt-4o", Counts: ledger.Counts{Requests: 2, InputTokens: 190, OutputTokens: 350},
			Charge: 4_000, PendingCounts: open, PendingCharge: 3_000},
		{Model: "gpt-4o-mini"}: {Model: "gpt-4o-mini", Counts: open, Charge: 3_000, PendingCounts: open, PendingCharge: 3_000},
	}
	gs, err := l.TotalCountsBy(ctx, day, byModel)
	var le *ledger.LocalSpendError
	if !errors.As(err, &le) || le.Unknown || le.Err == nil {
		t.Fatalf("TotalCountsBy with the store down = %+v, %v; want a *LocalSpendError, the store's part known", gs, err)
	}
	sameGroups(t, gs, want)
	// A query never read: only what the store lacks, and unknown.
	gs, err = l.TotalCountsBy(ctx, day, ledger.GroupBy{})
	if !errors.As(err, &le) || !le.Unknown || len(gs) != 1 || gs[0].Counts.Requests != 2 {
		t.Fatalf("TotalCountsBy of a query never read = %+v, %v; want the spool's two requests, unknown", gs, err)
	}
	// A tenant's read is not every tenant's.
	if gs, err = l.CountsBy(ctx, ledger.SpendQuery{Tenant: "beta", Period: "day", At: t0}, byModel); !errors.As(err, &le) || len(gs) != 1 || gs[0].Model != "gpt-4o-mini" {
		t.Fatalf("beta's CountsBy with the store down = %+v, %v; want its own record only", gs, err)
	}
}

// TestTotalCountsByRefusesBadQueries: TotalCountsBy refuses a query that
// names a tenant, a user or a key (CountsBy's), a region no entry can
// have, and an empty range.
func TestTotalCountsByRefusesBadQueries(t *testing.T) {
	l := open(t, ledger.Config{Dir: t.TempDir()})
	for _, q := range []ledger.SpendQuery{
		{Tenant: "acme", Period: "day"},
		{User: "ann", Period: "day"},
		{KeyID: "k1", Period: "day"},
		{Region: "eu\x00", Period: "day"},
		{From: t0, To: t0},
		{Period: "week"},
	} {
		if _, err := l.TotalCountsBy(context.Background(), q, ledger.GroupBy{Model: true}); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("TotalCountsBy(%+v) = %v; want ErrInvalid", q, err)
		}
	}
}
