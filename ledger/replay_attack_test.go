package ledger_test

// Attacks on the replay of the spool: the "applied" file is a hint, and
// replay from before it must be idempotent, recovery markers included.

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// TestLedAtkLostHintReplaysOldMarkers: a node restarted twice (two
// recovery markers in its spool's one segment), then killed while a
// stream's last extension was still in the spool, and its "applied" hint
// lost (a hint: losing it only costs time). The next Open replays the
// segment from its first record, the markers of the earlier runs
// included, which the store has applied already: they must not recover the
// last run's reservations before its later records are applied. The
// stream is recovered once, at its last extension and at the recovery of
// the run that found it open, never before it was created.
func TestLedAtkLostHintReplaysOldMarkers(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		var clock atomic.Int64 // Unix µs: the flusher reads it while the test moves it
		clock.Store(t0.UnixMicro())
		cfg.Now = func() time.Time { return time.UnixMicro(clock.Load()).UTC() }
		for range 2 { // runs 1 and 2: a marker each, then a clean close
			l := open(t, cfg)
			flush(t, l)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			clock.Add(time.Hour.Microseconds())
		}

		cfg.BatchDelay = time.Minute // the extension below stays in the spool
		l := open(t, cfg)
		created := cfg.Now().Add(time.Minute)
		if err := l.Reserve(ctx, reservation("stream", created)); err != nil {
			t.Fatal(err)
		}
		flush(t, l)
		ledAtkExtend(t, l, "stream", created, 712, 7_000, 3)
		if e, ok, err := l.Lookup(ctx, "stream"); err != nil || !ok || e.EstimatedCost != 3_000 {
			t.Fatalf("stream before the crash: %+v %v %v; want reserved at 3000, its extension in the spool only", e, ok, err)
		}
		crashed := cfg
		crashed.Dir = ledAtkSnapshot(t, cfg.Dir)
		if err := os.Remove(filepath.Join(crashed.Dir, "spool", "applied")); err != nil {
			t.Fatal(err)
		}

		clock.Add(time.Hour.Microseconds())
		recoveredAt := cfg.Now()
		l2 := open(t, crashed)
		flush(t, l2)
		s, ok, err := l2.Lookup(ctx, "stream")
		if err != nil || !ok {
			t.Fatalf("stream after the replay: %v %v", ok, err)
		}
		if s.Status != ledger.StatusRecovered || s.ActualCost != 7_000 || s.EstimatedCost != 7_000 ||
			s.Actual.OutputTokens != 712 || s.Actual.WebSearchRequests != 3 {
			t.Errorf("stream after the replay: %s, estimate %d, actual %d (%d output tokens, %d web searches); want recovered at its extension, 7000 (712, 3)",
				s.Status, s.EstimatedCost, s.ActualCost, s.Actual.OutputTokens, s.Actual.WebSearchRequests)
		}
		if !s.SettledAt.Equal(recoveredAt) {
			t.Errorf("stream created at %s recovered at %s; want at the Open that found it open, %s", s.CreatedAt, s.SettledAt, recoveredAt)
		}
		for _, p := range []string{"day", "month"} {
			if sp, err := l2.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: p, At: created}); err != nil || sp != 7_000 {
				t.Errorf("Spend(%s) after the replay = %d, %v; want 7000", p, sp, err)
			}
		}
	})
}

// TestLedAtkRecoveredLiveStreamKeepsItsExtension: an operator recovers a
// node that is in fact alive (RecoverNode, a time past its last request),
// while one of its streams is in flight; the stream's guard then extends
// the reservation, and the node dies before the settlement. A recovered
// entry is charged at its estimate, and the estimate is what the limits
// were debited: the extension recorded after the recovery raises it, as it
// would have raised the reservation, and the node's restart keeps it.
func TestLedAtkRecoveredLiveStreamKeepsItsExtension(t *testing.T) {
	// PostgreSQL only: the embedded store has one node at a time, its Dir's.
	t.Parallel()
	cfg := postgresConfig(t)
	ctx := context.Background()
	now := t0.Add(time.Hour)
	cfg.Now = func() time.Time { return now }
	a := open(t, cfg)
	if err := a.Reserve(ctx, reservation("stream", t0)); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	admin := open(t, ledger.Config{DSN: cfg.DSN, Admin: true, Now: cfg.Now})
	if n, err := admin.RecoverNode(ctx, ownNode(t, cfg.Dir), now); err != nil || n != 1 {
		t.Fatalf("RecoverNode = %d, %v, want 1", n, err)
	}
	ledAtkExtend(t, a, "stream", t0, 712, 7_000, 3)
	flush(t, a)
	check := func(when string) {
		t.Helper()
		s, ok, err := admin.Lookup(ctx, "stream")
		if err != nil || !ok {
			t.Fatalf("stream %s: %v %v", when, ok, err)
		}
		if s.Status != ledger.StatusRecovered || s.EstimatedCost != 7_000 || s.ActualCost != 7_000 ||
			s.Actual.OutputTokens != 712 || s.Actual.WebSearchRequests != 3 || s.Actual != s.Estimated {
			t.Errorf("stream %s: %s, estimate %d, actual %d (%d output tokens, %d web searches); want recovered at its extension, 7000 (712, 3)",
				when, s.Status, s.EstimatedCost, s.ActualCost, s.Actual.OutputTokens, s.Actual.WebSearchRequests)
		}
		if sp, err := admin.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day", At: t0}); err != nil || sp != 7_000 {
			t.Errorf("Spend %s = %d, %v; want 7000", when, sp, err)
		}
	}
	check("after its extension")
	if err := a.Close(); err != nil { // the node dies before the settlement
		t.Fatal(err)
	}
	flush(t, open(t, cfg))
	check("after the node's restart")
}

// TestLedAtkTimeInAZonePastYear9999: the ledger refuses times past the
// year 9999, which JSON cannot write; a time of 9999-12-31 in a zone west
// of UTC is in the year 10000 once stored in UTC. Reserve and Settle must
// refuse it too: stored, it made every JSON and CloudEvents export of the
// tenant fail, its other entries with it.
func TestLedAtkTimeInAZonePastYear9999(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		l := open(t, cfg)
		late := time.Date(9999, 12, 31, 23, 30, 0, 0, time.FixedZone("-01", -3600))
		if err := l.Reserve(ctx, reservation("near", t0)); err != nil {
			t.Fatal(err)
		}
		far := reservation("far", late)
		if err := l.Reserve(ctx, far); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("Reserve created at %s (%s in UTC): %v, want ErrInvalid", late, late.UTC(), err)
		}
		s := settlement("far-settled", 5)
		s.Tenant, s.CreatedAt, s.SettledAt = "acme", t0, late
		if err := l.Settle(ctx, s); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("Settle settled at %s (%s in UTC): %v, want ErrInvalid", late, late.UTC(), err)
		}
		flush(t, l)
		for _, f := range []string{ledger.FormatJSON, ledger.FormatCloudEvents, ledger.FormatCSV} {
			if err := l.Export(ctx, io.Discard, ledger.Query{Tenant: "acme"}, f); err != nil {
				t.Errorf("Export %s: %v", f, err)
			}
		}
	})
}
