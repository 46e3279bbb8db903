package ledger_test

// The shared suite: every test here runs on both stores, the embedded SQLite
// file and a real PostgreSQL database.

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the time zone tests must not depend on the machine's zoneinfo

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/ledger"
)

type storeKind struct {
	name string
	// config returns a Config for a new, empty ledger.
	config func(t *testing.T) ledger.Config
}

func stores() []storeKind {
	return []storeKind{
		{"embedded", func(t *testing.T) ledger.Config {
			return ledger.Config{Dir: t.TempDir()}
		}},
		{"postgres", postgresConfig},
	}
}

// postgresConfig returns a Config for a new, empty ledger in PostgreSQL.
func postgresConfig(t *testing.T) ledger.Config {
	return ledger.Config{Dir: t.TempDir(), DSN: pgtest.New(t)}
}

// forEachStore runs f once per store.
func forEachStore(t *testing.T, f func(t *testing.T, cfg ledger.Config)) {
	for _, s := range stores() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			f(t, s.config(t))
		})
	}
}

func open(t *testing.T, cfg ledger.Config) *ledger.Ledger {
	t.Helper()
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	l, err := ledger.Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func flush(t *testing.T, l *ledger.Ledger) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := l.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// all returns every entry q selects, following the pages.
func all(t *testing.T, l *ledger.Ledger, q ledger.Query) []ledger.Entry {
	t.Helper()
	var out []ledger.Entry
	for {
		p, err := l.Entries(context.Background(), q)
		if err != nil {
			t.Fatalf("Entries: %v", err)
		}
		out = append(out, p.Entries...)
		if p.Next == "" {
			return out
		}
		q.Cursor = p.Next
	}
}

var t0 = time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC)

func reservation(id string, at time.Time) ledger.Entry {
	return ledger.Entry{
		RequestID: id, Tenant: "acme", User: "ann", KeyID: "k1", Route: "chat", Upstream: "openai",
		Model: "gpt-4o", Region: "eu", Decision: "allow", Policy: "p1", Friction: "",
		HTTPStatus: 0, Requests: 1,
		Estimated: costmodel.Usage{InputTokens: 100, CachedInputTokens: 10, CacheWriteTokens: 5, OutputTokens: 200, ReasoningTokens: 7, Units: 1,
			// The usage the integer columns do not hold (est_extra).
			CacheWrite1hTokens: 2, AudioInputTokens: 3, WebSearchRequests: 1, ContainerGB: 1, ServiceTier: "flex", Speed: "fast"},
		EstimatedCost: 3_000,
		CreatedAt:     at,
	}
}

func settlement(id string, cost costmodel.NanoUSD) ledger.Entry {
	return ledger.Entry{
		RequestID: id, HTTPStatus: 200,
		Actual: costmodel.Usage{InputTokens: 90, CachedInputTokens: 9, CacheWriteTokens: 4, OutputTokens: 150, ReasoningTokens: 6, Units: 1,
			CacheWrite1hTokens: 1, AudioOutputTokens: 4, WebSearchRequests: 2, FileSearchCalls: 3, ContainerGB: 1,
			ServiceTier: "priority", InferenceGeo: "us", Speed: "fast"},
		ActualCost: cost,
	}
}

func TestReserveSettleRoundTrip(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		now := t0.Add(time.Hour)
		cfg.Now = func() time.Time { return now }
		l := open(t, cfg)
		ctx := context.Background()
		r := reservation("req-1", t0)
		if err := l.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		got := all(t, l, ledger.Query{Tenant: "acme"})
		want := r
		want.Status = ledger.StatusReserved
		want.CreatedAt = t0.Truncate(time.Microsecond)
		if len(got) != 1 || !equal(got[0], want) {
			t.Fatalf("after Reserve:\n got %+v\nwant %+v", got, want)
		}

		s := settlement("req-1", 2_500)
		s.Model = "gpt-4o-mini" // a downgrade chosen by friction
		s.Friction = "downgrade"
		if err := l.Settle(ctx, s); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		got = all(t, l, ledger.Query{Tenant: "acme"})
		want.Status, want.HTTPStatus = ledger.StatusSettled, 200
		want.Actual, want.ActualCost = s.Actual, 2_500
		want.Model, want.Friction = "gpt-4o-mini", "downgrade"
		want.SettledAt = now
		if len(got) != 1 || !equal(got[0], want) {
			t.Fatalf("after Settle:\n got %+v\nwant %+v", got, want)
		}
		if c := got[0].Charge(); c != 2_500 {
			t.Fatalf("Charge = %d, want 2500", c)
		}
	})
}

func equal(a, b ledger.Entry) bool {
	return a.CreatedAt.Equal(b.CreatedAt) && a.SettledAt.Equal(b.SettledAt) &&
		func() bool {
			a.CreatedAt, b.CreatedAt, a.SettledAt, b.SettledAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			return a == b
		}()
}

func TestIdempotentByRequestID(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		at := time.Now()
		for range 3 {
			if err := l.Reserve(ctx, reservation("dup", at)); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l) // the retries land in different batches from the settlements
		for _, c := range []costmodel.NanoUSD{1_000, 9_999, 5} {
			if err := l.Settle(ctx, settlement("dup", c)); err != nil {
				t.Fatal(err)
			}
		}
		// A late retry of the reservation must not reopen the entry.
		if err := l.Reserve(ctx, reservation("dup", at)); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		got := all(t, l, ledger.Query{})
		if len(got) != 1 || got[0].Status != ledger.StatusSettled || got[0].ActualCost != 1_000 {
			t.Fatalf("got %+v, want one settled entry charged 1000 (the first settlement)", got)
		}
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil {
			t.Fatal(err)
		}
		if sp != 1_000 {
			t.Fatalf("Spend = %d, want 1000", sp)
		}
	})
}

func TestSettleInTheSameBatchAsReserve(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		at := time.Now()
		for i := range 50 {
			id := fmt.Sprintf("r%02d", i)
			if err := l.Reserve(ctx, reservation(id, at)); err != nil {
				t.Fatal(err)
			}
			if err := l.Settle(ctx, settlement(id, costmodel.NanoUSD(i))); err != nil {
				t.Fatal(err)
			}
			if err := l.Settle(ctx, settlement(id, 1_000_000)); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)
		got := all(t, l, ledger.Query{Tenant: "acme"})
		if len(got) != 50 {
			t.Fatalf("%d entries, want 50", len(got))
		}
		var sum costmodel.NanoUSD
		for _, e := range got {
			if e.Status != ledger.StatusSettled {
				t.Fatalf("%s is %s", e.RequestID, e.Status)
			}
			sum += e.Charge()
		}
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "month"})
		if err != nil {
			t.Fatal(err)
		}
		if want := costmodel.NanoUSD(49 * 50 / 2); sum != want || sp != want {
			t.Fatalf("sum of entries %d, Spend %d, want %d", sum, sp, want)
		}
	})
}

func TestSettleWithoutReservationAndFailed(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		at := time.Now()
		whole := reservation("whole", at)
		whole.Actual, whole.ActualCost, whole.HTTPStatus = whole.Estimated, 42, 200
		if err := l.Settle(ctx, whole); err != nil {
			t.Fatal(err)
		}
		if err := l.Reserve(ctx, reservation("err", at)); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, ledger.Entry{RequestID: "err", Status: ledger.StatusFailed, HTTPStatus: 503}); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		got := all(t, l, ledger.Query{Tenant: "acme"})
		byID := map[string]ledger.Entry{}
		for _, e := range got {
			byID[e.RequestID] = e
		}
		if e := byID["whole"]; e.Status != ledger.StatusSettled || e.ActualCost != 42 || e.Model != "gpt-4o" || e.EstimatedCost != 3_000 {
			t.Errorf("whole = %+v", e)
		}
		if e := byID["err"]; e.Status != ledger.StatusFailed || e.ActualCost != 0 || e.HTTPStatus != 503 || e.Charge() != 0 {
			t.Errorf("err = %+v", e)
		}
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil {
			t.Fatal(err)
		}
		if sp != 42 {
			t.Fatalf("Spend = %d, want 42", sp)
		}
	})
}

func TestEntriesPagesAndFilters(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		// 250 entries of acme, several per microsecond so that the cursor's
		// tie-break on request id matters, and 10 of another tenant.
		for i := range 250 {
			e := reservation(fmt.Sprintf("a%03d", 249-i), t0.Add(time.Duration(i/3)*time.Second))
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 10 {
			e := reservation(fmt.Sprintf("b%03d", i), t0)
			e.Tenant = "globex"
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, l)

		p, err := l.Entries(ctx, ledger.Query{Tenant: "acme", Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Entries) != 100 || p.Next == "" {
			t.Fatalf("first page: %d entries, next %q", len(p.Entries), p.Next)
		}
		got := all(t, l, ledger.Query{Tenant: "acme", Limit: 7})
		if len(got) != 250 {
			t.Fatalf("%d entries over all pages, want 250", len(got))
		}
		seen := map[string]bool{}
		for i, e := range got {
			if seen[e.RequestID] || e.Tenant != "acme" {
				t.Fatalf("entry %d: %s repeated or of tenant %s", i, e.RequestID, e.Tenant)
			}
			seen[e.RequestID] = true
			if i > 0 {
				prev := got[i-1]
				if e.CreatedAt.Before(prev.CreatedAt) || (e.CreatedAt.Equal(prev.CreatedAt) && e.RequestID <= prev.RequestID) {
					t.Fatalf("entries %d and %d out of order", i-1, i)
				}
			}
		}
		ranged := all(t, l, ledger.Query{Tenant: "acme", From: t0.Add(10 * time.Second), To: t0.Add(20 * time.Second)})
		if len(ranged) != 30 {
			t.Fatalf("%d entries in [10s, 20s), want 30", len(ranged))
		}
		if n := len(all(t, l, ledger.Query{})); n != 260 {
			t.Fatalf("%d entries of all tenants, want 260", n)
		}
		for _, q := range []ledger.Query{{Limit: -1}, {Limit: ledger.MaxLimit + 1}, {Cursor: "!!"}} {
			if _, err := l.Entries(ctx, q); !errors.Is(err, ledger.ErrInvalid) {
				t.Errorf("Entries(%+v) error %v, want ErrInvalid", q, err)
			}
		}
	})
}

func TestSpendPeriodsInTimeZone(t *testing.T) {
	kolkata, err := time.LoadLocation("Asia/Kolkata") // UTC+05:30
	if err != nil {
		t.Fatal("time zone data (embedded by time/tzdata):", err)
	}
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		cfg.TimeZone = kolkata
		l := open(t, cfg)
		ctx := context.Background()
		// Midnight of 1 April in Kolkata is 18:30 UTC on 31 March.
		midnight := time.Date(2026, 4, 1, 0, 0, 0, 0, kolkata)
		type row struct {
			id, user, key string
			at            time.Time
			cost          costmodel.NanoUSD
			settle        bool
		}
		rows := []row{
			{"m1", "ann", "k1", midnight.Add(-time.Microsecond), 1, true}, // 31 March, in March
			{"m2", "bob", "k2", midnight.Add(-20 * 24 * time.Hour), 10, true},
			{"a1", "ann", "k1", midnight, 100, true}, // first instant of April
			{"a2", "bob", "k1", midnight.Add(23*time.Hour + 59*time.Minute), 1_000, true},
			{"a3", "ann", "k2", midnight.Add(24 * time.Hour), 10_000, true}, // 2 April
			{"a4", "ann", "k1", midnight.Add(30 * time.Minute), 0, false},   // reserved: counts its estimate, 3000
		}
		for _, r := range rows {
			e := reservation(r.id, r.at)
			e.User, e.KeyID = r.user, r.key
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
			if r.settle {
				if err := l.Settle(ctx, settlement(r.id, r.cost)); err != nil {
					t.Fatal(err)
				}
			}
		}
		flush(t, l)
		for _, c := range []struct {
			name string
			q    ledger.SpendQuery
			want costmodel.NanoUSD
		}{
			{"march", ledger.SpendQuery{Tenant: "acme", Period: "month", At: midnight.Add(-time.Hour)}, 11},
			{"31 march", ledger.SpendQuery{Tenant: "acme", Period: "day", At: midnight.Add(-time.Hour)}, 1},
			{"1 april", ledger.SpendQuery{Tenant: "acme", Period: "day", At: midnight.Add(time.Hour)}, 100 + 1_000 + 3_000},
			{"april", ledger.SpendQuery{Tenant: "acme", Period: "month", At: midnight.Add(72 * time.Hour)}, 100 + 1_000 + 10_000 + 3_000},
			{"april ann", ledger.SpendQuery{Tenant: "acme", User: "ann", Period: "month", At: midnight}, 100 + 10_000 + 3_000},
			{"april k1", ledger.SpendQuery{Tenant: "acme", KeyID: "k1", Period: "month", At: midnight}, 100 + 1_000 + 3_000},
			{"april ann k1", ledger.SpendQuery{Tenant: "acme", User: "ann", KeyID: "k1", Period: "month", At: midnight}, 100 + 3_000},
			{"other tenant", ledger.SpendQuery{Tenant: "globex", Period: "month", At: midnight}, 0},
		} {
			got, err := l.Spend(ctx, c.q)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if got != c.want {
				t.Errorf("%s: Spend = %d, want %d", c.name, got, c.want)
			}
		}
		other := reservation("g1", midnight.Add(time.Hour))
		other.Tenant = "globex"
		if err := l.Reserve(ctx, other); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		sum, err := l.Summary(ctx, "month", midnight)
		if err != nil {
			t.Fatal(err)
		}
		want := []ledger.TenantSpend{{Tenant: "acme", Spend: 100 + 1_000 + 10_000 + 3_000, Entries: 4}, {Tenant: "globex", Spend: 3_000, Entries: 1}}
		if fmt.Sprint(sum) != fmt.Sprint(want) {
			t.Errorf("Summary(april) = %v, want %v", sum, want)
		}
		if _, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "week"}); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("period week: %v, want ErrInvalid", err)
		}
	})
}

func TestRecoveryAtReopen(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		at := time.Now()
		if err := l.Reserve(ctx, reservation("open", at)); err != nil {
			t.Fatal(err)
		}
		if err := l.Reserve(ctx, reservation("done", at)); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, settlement("done", 7)); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		// A clean Close leaves "open" reserved; the next Open of the same Dir
		// knows that no settlement can come any more.
		l2 := open(t, cfg)
		if err := l2.Reserve(ctx, reservation("new", at)); err != nil {
			t.Fatal(err)
		}
		flush(t, l2)
		byID := map[string]ledger.Entry{}
		for _, e := range all(t, l2, ledger.Query{}) {
			byID[e.RequestID] = e
		}
		if e := byID["open"]; e.Status != ledger.StatusRecovered || e.ActualCost != e.EstimatedCost || e.Actual != e.Estimated || e.SettledAt.IsZero() {
			t.Errorf("open = %+v, want recovered at its estimate", e)
		}
		if e := byID["done"]; e.Status != ledger.StatusSettled || e.ActualCost != 7 {
			t.Errorf("done = %+v", e)
		}
		if e := byID["new"]; e.Status != ledger.StatusReserved {
			t.Errorf("new = %+v, a reservation of the running process must stay reserved", e)
		}
		sp, err := l2.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil {
			t.Fatal(err)
		}
		if sp != 3_000+7+3_000 {
			t.Fatalf("Spend = %d, want %d", sp, 3_000+7+3_000)
		}
	})
}

func TestConcurrentSettlementsExact(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		const n = 1000
		at := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				id := fmt.Sprintf("c%04d", i)
				e := reservation(id, at)
				e.User = fmt.Sprintf("u%d", i%7)
				e.EstimatedCost = 5_000
				if err := l.Reserve(ctx, e); err != nil {
					errs <- err
					return
				}
				// Every settlement is sent twice, racing with itself.
				var inner sync.WaitGroup
				for range 2 {
					inner.Go(func() {
						if err := l.Settle(ctx, settlement(id, costmodel.NanoUSD(i+1))); err != nil {
							errs <- err
						}
					})
				}
				inner.Wait()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		flush(t, l)
		got := all(t, l, ledger.Query{Tenant: "acme", Limit: ledger.MaxLimit})
		if len(got) != n {
			t.Fatalf("%d entries, want %d", len(got), n)
		}
		var sum costmodel.NanoUSD
		for _, e := range got {
			if e.Status != ledger.StatusSettled {
				t.Fatalf("%s is %s", e.RequestID, e.Status)
			}
			sum += e.Charge()
		}
		want := costmodel.NanoUSD(n * (n + 1) / 2)
		sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil {
			t.Fatal(err)
		}
		var users costmodel.NanoUSD
		for u := range 7 {
			s, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", User: fmt.Sprintf("u%d", u), Period: "day"})
			if err != nil {
				t.Fatal(err)
			}
			users += s
		}
		if sum != want || sp != want || users != want {
			t.Fatalf("sum of entries %d, Spend %d, sum of users' spend %d; want %d", sum, sp, users, want)
		}
	})
}

func TestExport(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		cfg.EventSource = "costgate-test"
		l := open(t, cfg)
		ctx := context.Background()
		e := reservation("x1", t0)
		e.Tenant = `a,"b"` // a name that CSV must quote
		e.Requests = 3     // an RLS call of hits_addend 3: billing meters 3 requests
		if err := l.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, settlement("x1", 1_234_567_891)); err != nil {
			t.Fatal(err)
		}
		e2 := reservation("x2", t0.Add(time.Second))
		e2.Tenant = e.Tenant
		if err := l.Reserve(ctx, e2); err != nil { // still reserved
			t.Fatal(err)
		}
		flush(t, l)
		q := ledger.Query{Tenant: e.Tenant}

		var buf bytes.Buffer
		if err := l.Export(ctx, &buf, q, "csv"); err != nil {
			t.Fatal(err)
		}
		recs, err := csv.NewReader(&buf).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 3 || strings.Join(recs[0], ",") != strings.Join(ledger.CSVHeader, ",") {
			t.Fatalf("csv: %q", recs)
		}
		col := map[string]string{}
		for i, h := range recs[0] {
			col[h] = recs[1][i]
		}
		if col["tenant"] != e.Tenant || col["charge_usd"] != "1.234567891" || col["charge_nanousd"] != "1234567891" ||
			col["status"] != "settled" || col["output_tokens"] != "150" || col["created_at"] != "2026-03-14T15:09:26.535897Z" || col["requests"] != "3" {
			t.Fatalf("csv row: %v", col)
		}

		buf.Reset()
		if err := l.Export(ctx, &buf, q, "json"); err != nil {
			t.Fatal(err)
		}
		var es []ledger.Entry
		if err := json.Unmarshal(buf.Bytes(), &es); err != nil {
			t.Fatalf("json: %v\n%s", err, buf.String())
		}
		if len(es) != 2 || es[0].ActualCost != 1_234_567_891 || es[0].Requests != 3 || es[1].Status != ledger.StatusReserved {
			t.Fatalf("json: %+v", es)
		}

		buf.Reset()
		if err := l.Export(ctx, &buf, q, "cloudevents"); err != nil {
			t.Fatal(err)
		}
		var evs []map[string]any
		if err := json.Unmarshal(buf.Bytes(), &evs); err != nil {
			t.Fatalf("cloudevents: %v\n%s", err, buf.String())
		}
		if len(evs) != 1 {
			t.Fatalf("cloudevents: %d events, want 1 (the reserved entry is not usage yet)", len(evs))
		}
		ev := evs[0]
		data, _ := ev["data"].(map[string]any)
		if ev["specversion"] != "1.0" || ev["id"] != "x1" || ev["source"] != "costgate-test" || ev["type"] != ledger.CloudEventType ||
			ev["subject"] != e.Tenant || ev["time"] != "2026-03-14T15:09:26.535897Z" || ev["datacontenttype"] != "application/json" ||
			data["cost_usd"] != "1.234567891" || data["cost_nanousd"] != float64(1_234_567_891) || data["input_tokens"] != float64(90) ||
			data["requests"] != float64(3) {
			t.Fatalf("cloudevent: %v", ev)
		}
		if err := l.Export(ctx, &buf, q, "xml"); !errors.Is(err, ledger.ErrInvalid) {
			t.Fatalf("format xml: %v, want ErrInvalid", err)
		}
	})
}

func TestInvalidEntries(t *testing.T) {
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	for name, c := range map[string]struct {
		settle bool
		e      ledger.Entry
	}{
		"no request id":    {false, ledger.Entry{Tenant: "a"}},
		"negative cost":    {false, ledger.Entry{RequestID: "r", EstimatedCost: -1}},
		"negative tokens":  {true, ledger.Entry{RequestID: "r", Actual: costmodel.Usage{OutputTokens: -1}}},
		"long field":       {false, ledger.Entry{RequestID: "r", Model: strings.Repeat("m", 5000)}},
		"settle recovered": {true, ledger.Entry{RequestID: "r", Status: ledger.StatusRecovered}},
		"nul in model":     {false, ledger.Entry{RequestID: "r", Model: "gpt\x00"}},
		"bad utf-8 user":   {true, ledger.Entry{RequestID: "r", User: "\xff\xfe"}},
		"http status":      {true, ledger.Entry{RequestID: "r", HTTPStatus: 1000}},
		"year 1":           {false, ledger.Entry{RequestID: "r", CreatedAt: time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)}},
		// The spool stores a zero time as 0 µs: the epoch would read back
		// as no time, and PostgreSQL refuses a NULL created_at for good.
		"epoch":             {false, ledger.Entry{RequestID: "r", CreatedAt: time.Unix(0, 0)}},
		"epoch after micro": {false, ledger.Entry{RequestID: "r", CreatedAt: time.Unix(0, 500)}},
		"settled at epoch":  {true, ledger.Entry{RequestID: "r", SettledAt: time.Unix(0, 0)}},
		// A settlement above MaxCost is charged MaxCost; a reservation is
		// refused.
		"estimate above MaxCost": {false, ledger.Entry{RequestID: "r", EstimatedCost: ledger.MaxCost + 1}},
	} {
		var err error
		if c.settle {
			err = l.Settle(ctx, c.e)
		} else {
			err = l.Reserve(ctx, c.e)
		}
		if !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]ledger.Config{
		"no dir":                     {},
		"mysql":                      {Dir: "d", DSN: "mysql://x"},
		"tiny spool":                 {Dir: "d", SpoolLimit: 10},
		"retry inverted":             {Dir: "d", RetryMin: time.Second, RetryMax: time.Millisecond},
		"huge batch":                 {Dir: "d", BatchSize: 1 << 20},
		"admin and read-only":        {DSN: "postgres://h/db", Admin: true, ReadOnly: true},
		"admin embedded without dir": {Admin: true},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
	for _, c := range []ledger.Config{{Dir: "d", DSN: "postgres://h/db"}, {DSN: "postgres://h/db", Admin: true}} {
		if err := c.Validate(); err != nil {
			t.Errorf("valid config %+v: %v", c, err)
		}
	}
}

func TestDirIsLocked(t *testing.T) {
	cfg := ledger.Config{Dir: t.TempDir()}
	open(t, cfg)
	if l, err := ledger.Open(context.Background(), cfg); err == nil {
		l.Close()
		t.Fatal("a second Open of the same Dir succeeded")
	}
}

func TestReadOnlyBesideAWriter(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		w := open(t, cfg)
		if err := w.Reserve(ctx, reservation("ro", t0)); err != nil {
			t.Fatal(err)
		}
		flush(t, w)
		rcfg := cfg
		rcfg.ReadOnly = true
		r := open(t, rcfg) // the Dir is locked by w: a writer could not open
		got := all(t, r, ledger.Query{Tenant: "acme"})
		if len(got) != 1 || got[0].RequestID != "ro" {
			t.Fatalf("read-only sees %+v", got)
		}
		if err := r.Reserve(ctx, reservation("x", t0)); !errors.Is(err, ledger.ErrReadOnly) {
			t.Fatalf("Reserve on read-only: %v, want ErrReadOnly", err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSpoolFullRefusesReservationsNotSettlements(t *testing.T) {
	// A store that never answers: everything stays in the spool.
	l := open(t, ledger.Config{
		Dir: t.TempDir(), DSN: "postgres://nobody@127.0.0.1:1/none?connect_timeout=1",
		SpoolLimit: 1 << 20, CloseTimeout: time.Millisecond, Logf: func(string, ...any) {},
	})
	ctx := context.Background()
	var err error
	n := 0
	for ; n < 100_000; n++ {
		if err = l.Reserve(ctx, reservation(fmt.Sprintf("f%d", n), t0)); err != nil {
			break
		}
	}
	if !errors.Is(err, ledger.ErrSpoolFull) {
		t.Fatalf("after %d reservations: %v, want ErrSpoolFull", n, err)
	}
	if n < 1000 {
		t.Fatalf("spool full after only %d reservations of a 1 MiB limit", n)
	}
	if err := l.Settle(ctx, settlement("f0", 1)); err != nil {
		t.Fatalf("Settle with the spool full: %v; settlements of admitted requests must be kept", err)
	}
	if st := l.Stats(); st.Pending <= 1<<20 {
		t.Fatalf("stats %+v, want more than the limit pending", st)
	}
	fctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := l.Flush(fctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with the store down: %v, want the deadline", err)
	}
}

// TestSpendMatchesEntries checks the roll-up against its definition: the
// spend of a period is the sum of the charges of the entries created in it,
// for random entries, scopes, periods and time zones with offsets of whole,
// half and quarter hours.
func TestSpendMatchesEntries(t *testing.T) {
	var zones []*time.Location
	for _, name := range []string{"UTC", "Asia/Kolkata", "America/New_York", "Asia/Kathmandu", "Pacific/Chatham"} {
		z, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal("time zone data (embedded by time/tzdata):", err)
		}
		zones = append(zones, z)
	}
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		rng := rand.New(rand.NewPCG(1, 2))
		l := open(t, cfg)
		ctx := context.Background()
		start := time.Date(2026, 1, 30, 0, 0, 0, 0, time.UTC)
		var es []ledger.Entry
		for i := range 2000 {
			e := reservation(fmt.Sprintf("e%d", i), start.Add(time.Duration(rng.Int64N(int64(70*24*time.Hour)))))
			// An entry may name no user, no key or neither (an RLS
			// call's names neither): the roll-up keeps only the scopes
			// a read asks for.
			e.User, e.KeyID = []string{"", "u0", "u1", "u2"}[rng.IntN(4)], []string{"", "k0", "k1", "k2"}[rng.IntN(4)]
			e.Region = []string{"", "eu", "us"}[rng.IntN(3)]
			e.EstimatedCost = costmodel.NanoUSD(rng.IntN(10_000))
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatal(err)
			}
			e.Status = ledger.StatusReserved
			if rng.IntN(4) > 0 {
				s := settlement(e.RequestID, costmodel.NanoUSD(rng.IntN(10_000)))
				if err := l.Settle(ctx, s); err != nil {
					t.Fatal(err)
				}
				e.Status, e.ActualCost = ledger.StatusSettled, s.ActualCost
			}
			es = append(es, e)
		}
		flush(t, l)
		// A read-only ledger per time zone reads the same store.
		readers := make([]*ledger.Ledger, len(zones))
		for i, z := range zones {
			rcfg := cfg
			rcfg.ReadOnly, rcfg.TimeZone = true, z
			readers[i] = open(t, rcfg)
		}
		for range 100 {
			zi := rng.IntN(len(zones))
			z, l := zones[zi], readers[zi]
			q := ledger.SpendQuery{
				Tenant: "acme", Period: []string{"day", "month"}[rng.IntN(2)],
				At: start.Add(time.Duration(rng.Int64N(int64(70 * 24 * time.Hour)))),
			}
			if rng.IntN(2) == 0 {
				q.User = fmt.Sprintf("u%d", rng.IntN(3))
			}
			if rng.IntN(2) == 0 {
				q.KeyID = fmt.Sprintf("k%d", rng.IntN(3))
			}
			if rng.IntN(3) == 0 {
				q.Region = []string{"eu", "us"}[rng.IntN(2)]
			}
			from, to, err := ledger.Period(q.Period, q.At, z)
			if err != nil {
				t.Fatal(err)
			}
			var want costmodel.NanoUSD
			for _, e := range es {
				if !e.CreatedAt.Before(from) && e.CreatedAt.Before(to) &&
					(q.User == "" || q.User == e.User) && (q.KeyID == "" || q.KeyID == e.KeyID) &&
					(q.Region == "" || q.Region == e.Region) {
					want += e.Charge()
				}
			}
			got, err := l.Spend(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("%s: Spend(%+v) = %d, want %d", z, q, got, want)
			}
		}
		// Ranges from any time to a 15-minute boundary: each key's spend,
		// and the tenant's.
		for range 100 {
			from := start.Add(time.Duration(rng.Int64N(int64(60 * 24 * time.Hour))))
			to := from.Add(time.Duration(1 + rng.Int64N(int64(10*24*time.Hour))))
			to = to.Truncate(15 * time.Minute) // entries fall anywhere: to must be a bucket's edge to be exact
			if !to.After(from) {
				to = from.Truncate(15 * time.Minute).Add(15 * time.Minute)
			}
			want, wantUsers := map[string]costmodel.NanoUSD{}, map[string]costmodel.NanoUSD{}
			var total costmodel.NanoUSD
			for _, e := range es {
				if !e.CreatedAt.Before(from) && e.CreatedAt.Before(to) {
					if e.KeyID != "" { // KeySpend leaves out the entries of no key
						want[e.KeyID] += e.Charge()
					}
					wantUsers[e.User] += e.Charge() // and UserSpend's "" is no user's
					total += e.Charge()
				}
			}
			for _, m := range []map[string]costmodel.NanoUSD{want, wantUsers} {
				for k, v := range m {
					if v == 0 {
						delete(m, k)
					}
				}
			}
			got, err := readers[0].KeySpend(ctx, "acme", from, to)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, want) {
				t.Fatalf("KeySpend(%s, %s) = %v, want %v", from, to, got, want)
			}
			gotUsers, err := readers[0].UserSpend(ctx, "acme", from, to)
			if err != nil {
				t.Fatal(err)
			}
			maps.DeleteFunc(gotUsers, func(_ string, v costmodel.NanoUSD) bool { return v == 0 })
			if !maps.Equal(gotUsers, wantUsers) {
				t.Fatalf("UserSpend(%s, %s) = %v, want %v", from, to, gotUsers, wantUsers)
			}
			sp, err := readers[0].Spend(ctx, ledger.SpendQuery{Tenant: "acme", From: from, To: to})
			if err != nil || sp != total {
				t.Fatalf("Spend over [%s, %s) = %d, %v; want %d", from, to, sp, err, total)
			}
		}
		if _, err := l.KeySpend(ctx, "acme", start, start); !errors.Is(err, ledger.ErrInvalid) {
			t.Fatalf("KeySpend over an empty range: %v, want ErrInvalid", err)
		}
	})
}

func TestFailedOpenReleasesTheDir(t *testing.T) {
	dir := t.TempDir()
	// A directory where the embedded database file should be: the store
	// cannot open, after the lock and the spool were taken.
	if err := os.Mkdir(filepath.Join(dir, "ledger.db"), 0o700); err != nil {
		t.Fatal(err)
	}
	if l, err := ledger.Open(context.Background(), ledger.Config{Dir: dir}); err == nil {
		l.Close()
		t.Fatal("Open succeeded with a directory for the database file")
	}
	if err := os.Remove(filepath.Join(dir, "ledger.db")); err != nil {
		t.Fatal(err)
	}
	l := open(t, ledger.Config{Dir: dir}) // fails if the lock or the spool were kept
	if err := l.Reserve(context.Background(), reservation("after", t0)); err != nil {
		t.Fatal(err)
	}
	flush(t, l)
}

// TestLookup reads one entry by its request id as the store holds it:
// open, then settled; an id the store lacks, or that no entry can have,
// is none.
func TestLookup(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		if err := l.Reserve(ctx, reservation("req-look", t0)); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		if e, ok, err := l.Lookup(ctx, "req-look"); err != nil || !ok || e.Status != ledger.StatusReserved || e.Tenant != "acme" {
			t.Fatalf("after Reserve: %+v %v %v", e, ok, err)
		}
		if err := l.Settle(ctx, settlement("req-look", 1234)); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		if e, ok, err := l.Lookup(ctx, "req-look"); err != nil || !ok || e.Status != ledger.StatusSettled || e.ActualCost != 1234 || e.Actual.OutputTokens != 150 {
			t.Fatalf("after Settle: %+v %v %v", e, ok, err)
		}
		for _, id := range []string{"req-none", "req-\x00", "req-\xff"} {
			if e, ok, err := l.Lookup(ctx, id); err != nil || ok {
				t.Errorf("Lookup(%q) = %+v %v %v, want none", id, e, ok, err)
			}
		}
	})
}
