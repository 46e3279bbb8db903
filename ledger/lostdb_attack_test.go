package ledger_test

// Attacks on the embedded ledger's file at start: a data dir whose spool
// was applied to an embedded ledger must not start a fresh, empty one when
// that file is gone or empty, forgetting the spend the spool no longer
// holds (its segments before the applied position are deleted).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/ledger"
)

// lostEntries is how many entries of $0.000005 spendLost records.
const lostEntries = 400

// spendLost records lostEntries entries of acme's, each reserved and
// settled at $0.000005: with small segments, the spool deletes the
// applied ones.
func spendLost(t *testing.T, l *ledger.Ledger) {
	t.Helper()
	ctx := context.Background()
	for i := range lostEntries {
		id := fmt.Sprintf("lost-%d", i)
		if err := l.Reserve(ctx, reservation(id, t0)); err != nil {
			t.Fatal(err)
		}
		if err := l.Settle(ctx, settlement(id, 5_000)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLedAtkEmbeddedFileLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(path string) error
	}{
		{"removed", func(path string) error {
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(path + suffix); err != nil && !os.IsNotExist(err) {
					return err
				}
			}
			return nil
		}},
		{"emptied", func(path string) error {
			os.Remove(path + "-wal")
			os.Remove(path + "-shm")
			return os.Truncate(path, 0)
		}},
		// The file alone, without the WAL that held every page written
		// since it was made (SQLite checkpoints at 1,000 pages): its first
		// page, no schema.
		{"without its WAL", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// Small segments, so that the applied ones are deleted.
			cfg := ledger.Config{Dir: dir, SegmentSize: 64 << 10, Now: func() time.Time { return t0.Add(time.Hour) }}
			l := open(t, cfg)
			ctx := context.Background()
			const n = lostEntries
			spendLost(t, l)
			if tc.lose == nil {
				// A copy of the data dir, the database without its WAL,
				// taken while the ledger runs.
				flush(t, l)
				to := ledAtkSnapshot(t, dir)
				if err := os.Remove(filepath.Join(to, "ledger.db-wal")); err != nil {
					t.Fatal(err)
				}
				l.Close()
				dir, cfg.Dir = to, to
			} else {
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if err := tc.lose(filepath.Join(dir, "ledger.db")); err != nil {
					t.Fatal(err)
				}
			}

			cfg.Logf = t.Logf
			l2, err := ledger.Open(ctx, cfg)
			if err == nil {
				defer l2.Close()
				flush(t, l2)
				sp, _ := l2.Spend(ctx, ledger.SpendQuery{Tenant: "acme", From: t0.Add(-time.Hour), To: t0.Add(time.Hour)})
				got := len(all(t, l2, ledger.Query{Tenant: "acme"}))
				t.Fatalf("Open started a fresh embedded ledger where the spool had applied %d entries ($%.6f): it holds %d entries, spend $%.6f",
					n, float64(n*5_000)/1e9, got, float64(sp)/1e9)
			}
			t.Logf("Open: %v", err)
			// The refused Open made nothing that a second one would take
			// for the ledger.
			if l3, err := ledger.Open(ctx, cfg); err == nil {
				l3.Close()
				t.Fatal("a second Open started a fresh embedded ledger")
			}
		})
	}
}

// TestLedAtkPostgresDatabaseLost: the same with PostgreSQL. A node whose
// spool was applied to the database finds it recreated empty (dropped
// and made again, restored from the wrong backup, a DSN pointed at a new
// one): before, Open migrated a fresh ledger, and every budget restored
// from it counted none of the 400 entries' spend. Refused at Open when
// the server answers; when it does not, the flusher refuses it and
// writes nothing there.
func TestLedAtkPostgresDatabaseLost(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := pgtest.NewPrivate(t)
	cfg := ledger.Config{Dir: dir, DSN: p.URL(), SegmentSize: 64 << 10, Logf: t.Logf,
		Now: func() time.Time { return t0.Add(time.Hour) }}
	l := open(t, cfg)
	const n = lostEntries
	spendLost(t, l)
	flush(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "DROP SCHEMA public CASCADE; CREATE SCHEMA public"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	if l2, err := ledger.Open(ctx, cfg); err == nil {
		defer l2.Close()
		flush(t, l2)
		sp, _ := l2.Spend(ctx, ledger.SpendQuery{Tenant: "acme", From: t0.Add(-time.Hour), To: t0.Add(time.Hour)})
		t.Fatalf("Open migrated a fresh ledger where the spool had applied %d entries ($%.6f): spend $%.6f",
			n, float64(n*5_000)/1e9, float64(sp)/1e9)
	} else {
		t.Logf("Open: %v", err)
	}

	// The server down at Open: the store opens, and its flusher refuses
	// the database once it answers.
	p.Stop()
	l3, err := ledger.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open with the server down: %v", err)
	}
	defer l3.Close()
	p.Start()
	if err := l3.Reserve(ctx, reservation("after", t0)); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := l3.Flush(fctx); err == nil {
		t.Fatal("Flush wrote to a database without the ledger's schema")
	}
	if st := l3.Stats(); st.StoreErr == nil || !strings.Contains(st.StoreErr.Error(), "no ledger schema") {
		t.Errorf("store error %v, want the database refused", st.StoreErr)
	}
	conn, err = pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var tables int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables); err != nil || tables != 0 {
		t.Errorf("the refused database has %d tables (%v), want none", tables, err)
	}
}
