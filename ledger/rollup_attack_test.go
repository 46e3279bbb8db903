package ledger_test

// Attacks on the spend roll-up (ledger_spend, which Spend, KeySpend and
// Summary read, and budgets and billing with them) and on the query and
// export API: the roll-up must equal the sum of the entries' charges after
// every path that writes an entry, and a query must return exactly the
// entries it selects.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"

	_ "modernc.org/sqlite"
)

// rollupAtkRow is one row of the roll-up, or what it should be.
type rollupAtkRow struct {
	tenant, scope string
	grain         int
	bucket        int64 // Unix microseconds
}

type rollupAtkSum struct{ cost, entries int64 }

// rollupAtkScopes are the roll-up scopes an entry of user and key counts in.
func rollupAtkScopes(user, key string) []string {
	return []string{"", "u:" + user, "k:" + key, "uk:" + strconv.Itoa(len(user)) + ":" + user + key}
}

// rollupAtkCheck reads the store of cfg directly and checks that every
// roll-up row is the sum of the charges, and the count, of the entries it
// covers, and that no entry is missing from it.
func rollupAtkCheck(t *testing.T, cfg ledger.Config) {
	t.Helper()
	ctx := context.Background()
	type entry struct {
		tenant, user, key string
		created           int64
		cost              int64
	}
	var es []entry
	got := map[rollupAtkRow]rollupAtkSum{}
	if cfg.DSN != "" {
		conn, err := pgx.Connect(ctx, cfg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, "SELECT tenant, user_id, key_id, created_at, cost FROM ledger_entries")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var e entry
			var at time.Time
			if err := rows.Scan(&e.tenant, &e.user, &e.key, &at, &e.cost); err != nil {
				t.Fatal(err)
			}
			e.created = at.UnixMicro()
			es = append(es, e)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows, err = conn.Query(ctx, "SELECT tenant, scope, grain, bucket, cost, entries FROM ledger_spend")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k rollupAtkRow
			var v rollupAtkSum
			var at time.Time
			var grain int16
			if err := rows.Scan(&k.tenant, &k.scope, &grain, &at, &v.cost, &v.entries); err != nil {
				t.Fatal(err)
			}
			k.grain, k.bucket = int(grain), at.UnixMicro()
			got[k] = v
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	} else {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(cfg.Dir, "ledger.db")+"?mode=ro&_pragma=busy_timeout(10000)")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		rows, err := db.QueryContext(ctx, "SELECT tenant, user_id, key_id, created_at, cost FROM ledger_entries")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var e entry
			if err := rows.Scan(&e.tenant, &e.user, &e.key, &e.created, &e.cost); err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
		}
		rows.Close()
		rows, err = db.QueryContext(ctx, "SELECT tenant, scope, grain, bucket, cost, entries FROM ledger_spend")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k rollupAtkRow
			var v rollupAtkSum
			if err := rows.Scan(&k.tenant, &k.scope, &k.grain, &k.bucket, &v.cost, &v.entries); err != nil {
				t.Fatal(err)
			}
			got[k] = v
		}
		rows.Close()
	}
	want := map[rollupAtkRow]rollupAtkSum{}
	for _, e := range es {
		at := time.UnixMicro(e.created).UTC()
		quarter := at.Truncate(15 * time.Minute).UnixMicro()
		day := time.Date(at.Year(), at.Month(), at.Day(), 0, 0, 0, 0, time.UTC).UnixMicro()
		for _, scope := range rollupAtkScopes(e.user, e.key) {
			for _, k := range []rollupAtkRow{{e.tenant, scope, 0, quarter}, {e.tenant, scope, 1, day}} {
				v := want[k]
				v.cost += e.cost
				v.entries++
				want[k] = v
			}
		}
	}
	for k, w := range want {
		if g := got[k]; g != w {
			t.Errorf("roll-up %+v = %+v, want the entries' %+v", k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok && g != (rollupAtkSum{}) {
			t.Errorf("roll-up %+v = %+v, but no entry is in it", k, g)
		}
	}
}

// rollupAtkEntries returns every entry of tenant, by request id.
func rollupAtkEntries(t *testing.T, l *ledger.Ledger, tenant string) map[string]ledger.Entry {
	t.Helper()
	out := map[string]ledger.Entry{}
	for _, e := range all(t, l, ledger.Query{Tenant: tenant}) {
		if _, dup := out[e.RequestID]; dup {
			t.Fatalf("entry %s listed twice", e.RequestID)
		}
		out[e.RequestID] = e
	}
	return out
}

// rollupAtkSpendAgrees checks that Spend and Summary of the days of es and
// of their month equal the sum of the charges of the entries created in
// them.
func rollupAtkSpendAgrees(t *testing.T, l *ledger.Ledger, tenant string, es map[string]ledger.Entry) {
	t.Helper()
	ctx := context.Background()
	for _, e := range es {
		for _, period := range []string{"day", "month"} {
			from, to, err := ledger.Period(period, e.CreatedAt, time.UTC)
			if err != nil {
				t.Fatal(err)
			}
			var want costmodel.NanoUSD
			var n int64
			for _, o := range es {
				if !o.CreatedAt.Before(from) && o.CreatedAt.Before(to) {
					want += o.Charge()
					n++
				}
			}
			sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: tenant, Period: period, At: e.CreatedAt})
			if err != nil || sp != want {
				t.Errorf("Spend(%s of %s) = %d, %v; want %d", period, e.CreatedAt, sp, err, want)
			}
			sum, err := l.Summary(ctx, period, e.CreatedAt)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(sum, func(s ledger.TenantSpend) bool { return s.Tenant == tenant })
			if i < 0 || sum[i].Spend != want || sum[i].Entries != n {
				t.Errorf("Summary(%s of %s) = %+v; want %s at %d over %d entries", period, e.CreatedAt, sum, tenant, want, n)
			}
		}
	}
}

// TestRollupAttackEveryWritePath drives each way an entry is written or
// changed, in one batch and across batches, through a reopen (recovery at
// the estimate, then a late settlement), and through a full replay of the
// spool (a crash between the store's commit and the applied hint): after
// each phase the roll-up must equal the entries, and Spend and Summary
// their sum.
func TestRollupAttackEveryWritePath(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.BatchDelay = -1
		// Created in the last microsecond of a month, settled in the
		// next: charged to the month and day of its creation.
		edge := time.Date(2026, 3, 31, 23, 59, 59, 999999000, time.UTC)
		cfg.Now = func() time.Time { return edge.Add(2 * time.Hour) }
		l := open(t, cfg)
		res := func(id string, at time.Time, est costmodel.NanoUSD) {
			t.Helper()
			e := reservation(id, at)
			e.EstimatedCost = est
			e.User, e.KeyID = "u-"+id[:1], "k-"+id[len(id)-1:]
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		set := func(id string, status ledger.Status, cost costmodel.NanoUSD) {
			t.Helper()
			e := settlement(id, cost)
			e.Status = status
			// A settlement naming another tenant, user and key must not
			// move the charge: they stay the reservation's.
			e.Tenant, e.User, e.KeyID = "evil", "mallory", "stolen"
			if err := l.Settle(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		check := func(phase string) {
			t.Helper()
			flush(t, l)
			t.Run(phase, func(t *testing.T) {
				rollupAtkCheck(t, cfg)
				es := rollupAtkEntries(t, l, "acme")
				if len(rollupAtkEntries(t, l, "evil")) != 0 {
					t.Errorf("a settlement created entries of the tenant it named")
				}
				rollupAtkSpendAgrees(t, l, "acme", es)
			})
		}

		// One batch: reserve and settle up, down, twice, failed, expired.
		res("a1", t0, 3_000)
		set("a1", "", 5_000)
		res("b2", t0, 3_000)
		set("b2", "", 1_000)
		set("b2", "", 9_999_999) // the first settlement wins
		res("c3", t0.Add(20*time.Minute), 3_000)
		set("c3", ledger.StatusFailed, 0)
		res("d4", t0, 3_000)
		set("d4", ledger.StatusExpired, 3_000)
		res("e5", edge, 7_000)
		check("one batch")

		// Across batches: settlement of an entry already stored, a
		// settlement of a final entry, a reservation replayed.
		set("e5", "", 11_000)
		flush(t, l)
		set("e5", "", 1)
		res("a1", t0, 123_456)
		res("f6", t0.Add(-24*time.Hour), 2_000)
		flush(t, l)
		set("f6", "", 2_500)
		// A settlement without a reservation records the entry whole.
		s := settlement("g7", 4_000)
		s.Tenant, s.User, s.KeyID, s.CreatedAt = "acme", "u-g", "k-7", t0.Add(time.Hour)
		if err := l.Settle(ctx, s); err != nil {
			t.Fatal(err)
		}
		res("h8", t0.Add(3*time.Hour), 6_000) // left open
		res("i9", t0.Add(4*time.Hour), 8_000) // left open, settled late
		check("across batches")

		// A reopen recovers h8 and i9 at their estimate; a settlement of
		// i9 after the recovery still wins.
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l = open(t, cfg)
		check("recovered")
		set("i9", "", 500)
		check("late settlement")

		// The store has everything; the applied hint says nothing is in
		// it: the whole spool is replayed onto the store.
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfg.Dir, "spool", "applied"), []byte("0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		l = open(t, cfg)
		check("replayed")
		if e := rollupAtkEntries(t, l, "acme")["i9"]; e.Status != ledger.StatusSettled || e.ActualCost != 500 {
			t.Errorf("i9 after replay: %s at %d, want settled at 500", e.Status, e.ActualCost)
		}
		if e := rollupAtkEntries(t, l, "acme")["e5"]; e.ActualCost != 11_000 || !e.CreatedAt.Equal(edge) {
			t.Errorf("e5 after replay: %+v, want created %s and charged 11000", e, edge)
		}
	})
}

// rollupAtkSaturated records, for tenant, one entry settled at the largest
// cost at each of times.
func rollupAtkSaturated(t *testing.T, l *ledger.Ledger, tenant string, times ...time.Time) {
	t.Helper()
	for i, at := range times {
		e := reservation(fmt.Sprintf("%s-max-%d", tenant, i), at)
		e.Tenant, e.HTTPStatus, e.ActualCost = tenant, 200, math.MaxInt64
		if err := l.Settle(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
}

// rollupAtkSatSum is the sum of the charges of es, saturating at the
// largest cost.
func rollupAtkSatSum(es []ledger.Entry) costmodel.NanoUSD {
	var s costmodel.NanoUSD
	for _, e := range es {
		if e.Charge() > math.MaxInt64-s {
			return math.MaxInt64
		}
		s += e.Charge()
	}
	return s
}

// TestRollupAttackSaturatedMonth: the roll-up saturates a bucket at the
// largest cost rather than failing the batch (an upstream that reports
// absurd usage is charged the largest cost). Reading a month whose days
// each hold such a bucket must saturate as well (or be exact): an error
// there makes every budget read of the tenant fail (Spend answers 0 from
// this node's records, which the gate takes as the spend) and, through
// Summary, the reconciliation and billing of every other tenant.
func TestRollupAttackSaturatedMonth(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.Now = func() time.Time { return t0.Add(time.Hour) }
		l := open(t, cfg)
		rollupAtkSaturated(t, l, "acme", t0, t0.Add(-24*time.Hour))
		ok := reservation("beta-1", t0)
		ok.Tenant = "beta"
		if err := l.Reserve(ctx, ok); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		want := rollupAtkSatSum(all(t, l, ledger.Query{Tenant: "acme"}))
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0})
		if err != nil || sp != want {
			t.Errorf("Spend(acme, month) = %d, %v; want %d", sp, err, want)
		}
		sum, err := l.Summary(ctx, "month", t0)
		if err != nil {
			t.Fatalf("Summary(month) fails for every tenant: %v", err)
		}
		if len(sum) != 2 || sum[0].Spend != want || sum[1].Tenant != "beta" || sum[1].Spend != ok.EstimatedCost {
			t.Errorf("Summary(month) = %+v; want acme at %d, beta at %d", sum, want, ok.EstimatedCost)
		}
	})
}

// TestRollupAttackSaturatedRangeWraps: Spend over a range that starts
// inside a bucket (a budget's window since a reset) adds the entries of
// that partial bucket to the roll-up's buckets after it. With the roll-up
// saturated, the sum must saturate too (or be exact), never wrap to a
// negative spend, which a limiter restoring its counter reads as nothing
// spent (gate clamps it to 0).
func TestRollupAttackSaturatedRangeWraps(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.Now = func() time.Time { return t0.Add(time.Hour) }
		l := open(t, cfg)
		bucket := t0.Truncate(15 * time.Minute)
		from := bucket.Add(time.Minute) // inside a bucket
		if err := l.Reserve(ctx, reservation("head", from.Add(time.Second))); err != nil {
			t.Fatal(err)
		}
		rollupAtkSaturated(t, l, "acme", bucket.Add(20*time.Minute))
		flush(t, l)
		want := rollupAtkSatSum(all(t, l, ledger.Query{Tenant: "acme"}))
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", From: from, To: bucket.Add(time.Hour)})
		if err != nil || sp != want {
			t.Errorf("Spend over [%s, +1h) = %d, %v; want %d, never negative", from, sp, err, want)
		}
		ks, err := l.KeySpend(ctx, "acme", from, bucket.Add(time.Hour))
		if err != nil || ks["k1"] != want {
			t.Errorf("KeySpend over [%s, +1h) = %v, %v; want k1 at %d", from, ks, err, want)
		}
	})
}

// TestRollupAttackTenantFilterIsExact: a tenant filter is an equality, not
// a pattern or a case-insensitive match: a name with LIKE wildcards, other
// case, padding, NUL or invalid UTF-8 selects none of another tenant's
// entries (neither in a page, nor in an export, nor in Spend).
func TestRollupAttackTenantFilterIsExact(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		for _, tenant := range []string{"acme", "acme_corp", "a%b"} {
			e := reservation("r-"+tenant, t0)
			e.Tenant = tenant
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		for _, probe := range []string{"%", "_", "acm%", "acm_", "acme%", "acme_", "ACME", "Acme", "acme ", " acme",
			"a_b", "a%", "acme\x00", "acme\x00_corp", "acm\xe9", "\xff"} {
			p, err := l.Entries(ctx, ledger.Query{Tenant: probe})
			if err != nil {
				// Refusing a name no tenant can have is fine; what
				// must not happen is another tenant's entry.
				continue
			}
			for _, e := range p.Entries {
				t.Errorf("tenant %q selects %s's entry %s", probe, e.Tenant, e.RequestID)
			}
			if sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: probe, Period: "day", At: t0}); err == nil && sp != 0 {
				t.Errorf("Spend(%q) = %d, want 0", probe, sp)
			}
		}
	})
}

// TestRollupAttackPagesAtOneInstant: many entries created in the same
// microsecond, with ids that differ in case, punctuation and non-ASCII
// letters, are each listed exactly once whatever the page size, in the
// order of one large page, and none is lost at a range boundary.
func TestRollupAttackPagesAtOneInstant(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		ids := []string{"a", "A", "b", "B", "a-b", "ab", "a_b", "a b", "a:b", "a%b", "é", "e", "E", "z", "Z",
			"10", "9", "1:0", "ä", "Ä", "ß", "ss", "'", "=1", "+1", "-1", "@1", "\u00a0"}
		for i, id := range ids {
			e := reservation(id, t0)
			e.EstimatedCost = costmodel.NanoUSD(i + 1)
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		before := reservation("before", t0.Add(-time.Microsecond))
		after := reservation("after", t0.Add(time.Microsecond))
		for _, e := range []ledger.Entry{before, after} {
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		p, err := l.Entries(ctx, ledger.Query{Tenant: "acme", From: t0, To: t0.Add(time.Microsecond), Limit: ledger.MaxLimit})
		if err != nil {
			t.Fatal(err)
		}
		var order []string
		for _, e := range p.Entries {
			order = append(order, e.RequestID)
		}
		if len(order) != len(ids) || p.Next != "" {
			t.Fatalf("one page of [t0, t0+1µs) = %q (next %q), want the %d ids of t0", order, p.Next, len(ids))
		}
		for size := 1; size <= 7; size++ {
			var got []string
			q := ledger.Query{Tenant: "acme", From: t0, To: t0.Add(time.Microsecond), Limit: size}
			for {
				p, err := l.Entries(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range p.Entries {
					got = append(got, e.RequestID)
				}
				if p.Next == "" {
					break
				}
				q.Cursor = p.Next
			}
			if !slices.Equal(got, order) {
				t.Errorf("pages of %d: %q, want %q", size, got, order)
			}
		}
		var sum costmodel.NanoUSD
		for _, e := range p.Entries {
			sum += e.Charge()
		}
		if want := costmodel.NanoUSD(len(ids) * (len(ids) + 1) / 2); sum != want {
			t.Errorf("charges of the page sum to %d, want %d", sum, want)
		}
		if _, err := l.Entries(ctx, ledger.Query{Tenant: "acme", Limit: ledger.MaxLimit + 1}); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("a limit past MaxLimit: %v, want ErrInvalid", err)
		}
	})
}

// TestRollupAttackHugeEstimateErasesSpend: a reservation whose estimate is
// valid on its own (costmodel and the reserve API refuse only a cost that
// reaches math.MaxInt64; a tenant that no budget caps may reserve
// {"cost":{"usd":"9223372035.999999999"}}) lands in a bucket that already
// holds spend, and settles at zero in a later batch. The spend already in
// the bucket must still be there: the roll-up must equal its entries
// after the settlement, however large the estimate in between.
func TestRollupAttackHugeEstimateErasesSpend(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.BatchDelay = -1
		cfg.Now = func() time.Time { return t0.Add(time.Hour) }
		l := open(t, cfg)
		paid := reservation("paid", t0)
		if err := l.Reserve(ctx, paid); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, settlement("paid", 5_000)); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		huge := reservation("huge", t0.Add(time.Second))
		huge.EstimatedCost = math.MaxInt64 - 1
		// Refusing the reservation (the request is then not forwarded)
		// holds too.
		if err := l.Reserve(ctx, huge); err == nil {
			flush(t, l) // the upstream takes longer than a batch to refuse it
			refused := settlement("huge", 0)
			refused.Status, refused.HTTPStatus, refused.Actual = ledger.StatusFailed, 400, costmodel.Usage{}
			if err := l.Settle(ctx, refused); err != nil {
				t.Fatal(err)
			}
			flush(t, l)
		} else if !errors.Is(err, ledger.ErrInvalid) {
			t.Fatal(err)
		}
		for _, period := range []string{"day", "month"} {
			sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: period, At: t0})
			if err != nil || sp != 5_000 {
				t.Errorf("Spend(%s) = %d, %v; want 5000 (the paid entry)", period, sp, err)
			}
		}
		sum, err := l.Summary(ctx, "day", t0)
		if err != nil || len(sum) != 1 || sum[0].Spend != 5_000 {
			t.Errorf("Summary(day) = %+v, %v; want acme at 5000", sum, err)
		}
		rollupAtkCheck(t, cfg)
	})
}

// TestRollupAttackLocalPeriodEdges: in a time zone other than UTC, an
// entry created in the last microsecond of a local day or month counts in
// it and one created in the first microsecond of the next does not, on a
// day of 25 hours (DST ends) and 23 hours (DST starts) as on any other,
// in zones offset by whole hours and by 45 minutes.
func TestRollupAttackLocalPeriodEdges(t *testing.T) {
	zones := []string{"America/New_York", "Pacific/Chatham", "Australia/Lord_Howe", "Asia/Kathmandu"}
	days := [][3]int{{2026, 11, 1}, {2026, 3, 8}, {2026, 4, 5}, {2026, 10, 4}, {2026, 9, 27}, {2026, 4, 30}, {2026, 2, 28}}
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		type at struct {
			zone string
			t    time.Time
			cost costmodel.NanoUSD
		}
		var es []at
		n := 0
		for _, name := range zones {
			z, err := time.LoadLocation(name)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range days {
				start := time.Date(d[0], time.Month(d[1]), d[2], 0, 0, 0, 0, z)
				end := start.AddDate(0, 0, 1)
				for _, tm := range []time.Time{start.Add(-time.Microsecond), start, end.Add(-time.Microsecond), end} {
					n++
					e := reservation(fmt.Sprintf("%s-%d", name, n), tm)
					e.Tenant, e.EstimatedCost = name, costmodel.NanoUSD(n*1_009)
					if err := l.Reserve(ctx, e); err != nil {
						t.Fatal(err)
					}
					es = append(es, at{name, tm, e.EstimatedCost})
				}
			}
		}
		flush(t, l)
		for _, name := range zones {
			z, _ := time.LoadLocation(name)
			rcfg := cfg
			rcfg.ReadOnly, rcfg.TimeZone = true, z
			r := open(t, rcfg)
			for _, e := range es {
				if e.zone != name {
					continue
				}
				for _, period := range []string{"day", "month"} {
					from, to, err := ledger.Period(period, e.t, z)
					if err != nil {
						t.Fatal(err)
					}
					var want costmodel.NanoUSD
					for _, o := range es {
						if o.zone == name && !o.t.Before(from) && o.t.Before(to) {
							want += o.cost
						}
					}
					got, err := r.Spend(ctx, ledger.SpendQuery{Tenant: name, Period: period, At: e.t})
					if err != nil || got != want {
						t.Errorf("%s: Spend(%s of %s) = %d, %v; want %d", name, period, e.t.In(z), got, err, want)
					}
					sum, err := r.Summary(ctx, period, e.t)
					if err != nil {
						t.Fatal(err)
					}
					i := slices.IndexFunc(sum, func(s ledger.TenantSpend) bool { return s.Tenant == name })
					if (want != 0) != (i >= 0) || i >= 0 && sum[i].Spend != want {
						t.Errorf("%s: Summary(%s of %s) = %+v, want %d", name, period, e.t.In(z), sum, want)
					}
				}
			}
		}
	})
}
