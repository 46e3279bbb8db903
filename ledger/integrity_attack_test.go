package ledger_test

// Attacks on the ledger's integrity (every admitted request has exactly one
// entry, billed what it was told) under faults: processes killed at the
// worst moments, damaged spool files, a store that refuses a record.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// init runs the test binary as an attack child when LEDGER_ATK_CHILD is set
// (before TestMain, which knows nothing of it).
func init() {
	switch os.Getenv("LEDGER_ATK_CHILD") {
	case "":
		return
	case "unapplied":
		ledgerAtkUnappliedChild()
	case "rotate":
		ledgerAtkRotateChild()
	default:
		fmt.Fprintln(os.Stderr, "unknown child", os.Getenv("LEDGER_ATK_CHILD"))
		os.Exit(3)
	}
	os.Exit(0)
}

func ledgerAtkLogf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }

// ledgerAtkUnappliedChild opens the ledger with a batch delay of a minute,
// so that after its first batch (the recovery marker) the flusher leaves
// every record in the spool; it reserves and settles LEDGER_ATK_N requests,
// reports each, and waits to be killed: records written to the spool,
// never applied to the store.
func ledgerAtkUnappliedChild() {
	n, _ := strconv.Atoi(os.Getenv("LEDGER_ATK_N"))
	seg, _ := strconv.ParseInt(os.Getenv("LEDGER_ATK_SEG"), 10, 64)
	l, err := ledger.Open(context.Background(), ledger.Config{
		Dir: os.Getenv("LEDGER_ATK_DIR"), DSN: os.Getenv("LEDGER_ATK_DSN"), SegmentSize: seg,
		BatchDelay: time.Minute, Logf: ledgerAtkLogf,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(3)
	}
	ctx := context.Background()
	// Let the flusher apply the marker first: from then on it waits.
	if err := l.Flush(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "flush:", err)
		os.Exit(3)
	}
	time.Sleep(20 * time.Millisecond)
	for i := range n {
		id := fmt.Sprintf("u-%d", i)
		e := reservation(id, t0.Add(time.Duration(i)*time.Second))
		if err := l.Reserve(ctx, e); err != nil {
			fmt.Fprintln(os.Stderr, "reserve:", err)
			os.Exit(3)
		}
		if err := l.Settle(ctx, settlement(id, costmodel.NanoUSD(1000+i))); err != nil {
			fmt.Fprintln(os.Stderr, "settle:", err)
			os.Exit(3)
		}
		fmt.Printf("S %s\n", id)
	}
	fmt.Println("DONE x")
	select {}
}

// ledgerAtkRun runs child kind on dir until it prints a line "K ..." for
// which kill returns true (or "DONE"), then SIGKILLs it; it returns the
// lines it printed, by kind.
func ledgerAtkRun(t *testing.T, kind, dir, dsn string, env []string, kill func(kind, id string) bool) map[string][]string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LEDGER_ATK_CHILD="+kind, "LEDGER_ATK_DIR="+dir, "LEDGER_ATK_DSN="+dsn)
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	got := make(map[string][]string)
	sc := bufio.NewScanner(out)
	killed := false
	for sc.Scan() {
		k, id, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		got[k] = append(got[k], id)
		if !killed && (k == "DONE" || kill(k, id)) {
			killed = true
			cmd.Process.Kill() // SIGKILL
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != -1 {
		t.Fatalf("child %s: %v, want killed by SIGKILL\n%s", kind, err, stderr.String())
	}
	return got
}

// ledgerAtkCheckSettled checks that l holds exactly the entries u-0 to
// u-(n-1) of ledgerAtkUnappliedChild, each settled at 1000+i, and that the
// spend roll-up agrees.
func ledgerAtkCheckSettled(t *testing.T, l *ledger.Ledger, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Flush(ctx); err != nil {
		t.Fatalf("Flush after reopen: %v (the spool's records never reach the store)", err)
	}
	es := all(t, l, ledger.Query{})
	var sum costmodel.NanoUSD
	byID := make(map[string]ledger.Entry)
	for _, e := range es {
		byID[e.RequestID] = e
		sum += e.Charge()
	}
	var want costmodel.NanoUSD
	var lost []string
	for i := range n {
		id := fmt.Sprintf("u-%d", i)
		want += costmodel.NanoUSD(1000 + i)
		e, ok := byID[id]
		if !ok {
			lost = append(lost, id)
			continue
		}
		if e.Status != ledger.StatusSettled || e.ActualCost != costmodel.NanoUSD(1000+i) {
			t.Errorf("entry %s: %s at %d, want settled at %d", id, e.Status, e.ActualCost, 1000+i)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d requests admitted and settled have no entry: %v", len(lost), n, lost)
	}
	if len(es) != n || sum != want {
		t.Errorf("%d entries summing to %d, want %d summing to %d", len(es), sum, n, want)
	}
	sp, err := l.Spend(context.Background(), ledger.SpendQuery{Tenant: "acme", Period: "day", At: t0})
	if err != nil {
		t.Fatal(err)
	}
	if sp != want {
		t.Errorf("Spend(day) = %d, want %d", sp, want)
	}
}

// TestLedgerAttackAppliedHintPastEnd: a run is killed with records in the
// spool that the flusher has not applied; the "applied" file (a hint: the
// spool says losing it only costs time) is then damaged to point past the
// spool's end. Open must not clamp it to the end, which would skip every
// record still to apply and delete the sealed segments holding them: a
// hint that cannot be right is ignored, and replay (idempotent) starts at
// the first record, so that every admitted request has its entry.
func TestLedgerAttackAppliedHintPastEnd(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		const n = 20
		got := ledgerAtkRun(t, "unapplied", cfg.Dir, cfg.DSN, []string{"LEDGER_ATK_N=" + strconv.Itoa(n)},
			func(string, string) bool { return false })
		if len(got["S"]) != n {
			t.Fatalf("child settled %d of %d", len(got["S"]), n)
		}
		hint := filepath.Join(cfg.Dir, "spool", "applied")
		if err := os.WriteFile(hint, []byte("99999999999\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		ledgerAtkCheckSettled(t, open(t, cfg), n)
	})
}

// TestLedgerAttackAppliedHintMidRecord: as above, but the damaged hint
// points inside the spool, between two record boundaries. It is ignored
// too: the flusher, reading from there, would find no record and stop for
// good.
func TestLedgerAttackAppliedHintMidRecord(t *testing.T) {
	cfg := ledger.Config{Dir: t.TempDir()}
	const n = 5
	ledgerAtkRun(t, "unapplied", cfg.Dir, "", []string{"LEDGER_ATK_N=" + strconv.Itoa(n)},
		func(string, string) bool { return false })
	segs, err := filepath.Glob(filepath.Join(cfg.Dir, "spool", "*.spool"))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments %v %v", segs, err)
	}
	fi, err := os.Stat(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	// Inside the last record of the dead run.
	hint := filepath.Join(cfg.Dir, "spool", "applied")
	if err := os.WriteFile(hint, []byte(strconv.FormatInt(fi.Size()-7, 10)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ledgerAtkCheckSettled(t, open(t, cfg), n)
}

// TestLedgerAttackOversizedIDStallsPostgres: PostgreSQL's B-tree indexes
// take keys of at most about 2,700 bytes, and a batch holding an entry
// whose request id is longer would fail on every retry, stopping the
// billing of every tenant: Reserve refuses such an id (ErrInvalid, as it
// does text PostgreSQL cannot hold), and the entries around it are
// stored.
func TestLedgerAttackOversizedIDStallsPostgres(t *testing.T) {
	cfg := postgresConfig(t)
	cfg.RetryMax = 100 * time.Millisecond
	cfg.CloseTimeout = 500 * time.Millisecond
	l := open(t, cfg)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 9))
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var b strings.Builder
	for range 4000 {
		b.WriteByte(alnum[rng.IntN(len(alnum))])
	}
	long := reservation(b.String(), t0)
	if !ledger.ValidText(long.RequestID) {
		t.Fatal("the id is not valid text")
	}
	longAdmitted := l.Reserve(ctx, long) == nil
	if err := l.Reserve(ctx, reservation("ordinary", t0)); err != nil {
		t.Fatal(err)
	}
	if err := l.Settle(ctx, settlement("ordinary", 77)); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := l.Flush(fctx); err != nil {
		t.Fatalf("Flush: %v: the flusher is stuck behind the entry with a %d-byte id (Reserve accepted it: %v)",
			err, len(long.RequestID), longAdmitted)
	}
	es := all(t, l, ledger.Query{})
	want := 1
	if longAdmitted {
		want = 2
	}
	if len(es) != want {
		t.Fatalf("%d entries, want %d", len(es), want)
	}
}

// ledgerAtkRotateChild reserves and settles under a tiny segment size (a
// rotation every few records), with a clock that jumps back an hour every
// 50 requests and entries around UTC midnight, until it is killed. Each
// request is reported after Reserve ("R") and after Settle ("S").
func ledgerAtkRotateChild() {
	base := time.Date(2026, 5, 31, 23, 59, 59, 0, time.UTC)
	var ticks atomic.Int64
	now := func() time.Time {
		tick := ticks.Add(1)
		back := time.Duration(tick/50) * time.Hour
		return base.Add(time.Duration(tick)*time.Millisecond - back + time.Duration(tick%3)*time.Second)
	}
	l, err := ledger.Open(context.Background(), ledger.Config{
		Dir: os.Getenv("LEDGER_ATK_DIR"), DSN: os.Getenv("LEDGER_ATK_DSN"),
		SegmentSize: 64 << 10, BatchSize: 7, BatchDelay: -1, Now: now, Logf: ledgerAtkLogf,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(3)
	}
	ctx := context.Background()
	prefix := os.Getenv("LEDGER_ATK_PREFIX")
	for seq := 0; ; seq++ {
		id := fmt.Sprintf("%s-%d", prefix, seq)
		e := reservation(id, time.Time{}) // now: the clock above
		e.EstimatedCost = 5_000
		e.User = fmt.Sprintf("u%d", seq%3)
		if err := l.Reserve(ctx, e); err != nil {
			fmt.Fprintln(os.Stderr, "reserve:", err)
			os.Exit(3)
		}
		fmt.Printf("R %s\n", id)
		if seq%4 != 3 { // every fourth stays open
			if err := l.Settle(ctx, settlement(id, costmodel.NanoUSD(100+seq))); err != nil {
				fmt.Fprintln(os.Stderr, "settle:", err)
				os.Exit(3)
			}
			// A second settlement with another amount: only the first counts.
			if err := l.Settle(ctx, settlement(id, costmodel.NanoUSD(999_999))); err != nil {
				fmt.Fprintln(os.Stderr, "settle:", err)
				os.Exit(3)
			}
			fmt.Printf("S %s\n", id)
		}
	}
}

// TestLedgerAttackKillDuringRotation: children are killed while they
// append under a segment size that rotates every few records, with a
// clock that goes backwards, entries around UTC midnight, and duplicate
// settlements of other amounts. After the runs, every admitted request
// has exactly one entry, settled at its first settlement or recovered at
// its estimate, and the spend roll-up of each UTC day and of the tenant's
// users equals the sum of the entries.
func TestLedgerAttackKillDuringRotation(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		admitted, settled := make(map[string]bool), make(map[string]bool)
		for run, killAfter := range []int{400, 777} {
			prefix := fmt.Sprintf("k%d", run)
			n := 0
			got := ledgerAtkRun(t, "rotate", cfg.Dir, cfg.DSN, []string{"LEDGER_ATK_PREFIX=" + prefix},
				func(kind, id string) bool {
					if kind == "R" {
						n++
					}
					return n >= killAfter
				})
			for _, id := range got["R"] {
				admitted[id] = true
			}
			for _, id := range got["S"] {
				settled[id] = true
			}
		}
		l := open(t, cfg)
		flush(t, l)
		es := all(t, l, ledger.Query{})
		seen := make(map[string]bool)
		days := make(map[time.Time]costmodel.NanoUSD)
		users := make(map[string]costmodel.NanoUSD)
		for _, e := range es {
			if seen[e.RequestID] {
				t.Errorf("%s counted twice", e.RequestID)
			}
			seen[e.RequestID] = true
			var seq int
			if _, err := fmt.Sscanf(e.RequestID[strings.IndexByte(e.RequestID, '-')+1:], "%d", &seq); err != nil {
				t.Fatalf("id %q: %v", e.RequestID, err)
			}
			switch {
			case e.Status == ledger.StatusSettled:
				if e.ActualCost != costmodel.NanoUSD(100+seq) {
					t.Errorf("%s settled at %d, want its first settlement %d", e.RequestID, e.ActualCost, 100+seq)
				}
			case e.Status == ledger.StatusRecovered:
				if settled[e.RequestID] {
					t.Errorf("%s: Settle returned, yet recovered at its estimate", e.RequestID)
				}
				if e.ActualCost != 5_000 {
					t.Errorf("%s recovered at %d, want 5000", e.RequestID, e.ActualCost)
				}
			default:
				t.Errorf("%s: status %s after recovery", e.RequestID, e.Status)
			}
			day := time.Date(e.CreatedAt.Year(), e.CreatedAt.Month(), e.CreatedAt.Day(), 0, 0, 0, 0, time.UTC)
			days[day] += e.Charge()
			users[e.User] += e.Charge()
		}
		for id := range admitted {
			if !seen[id] {
				t.Errorf("%s admitted, no entry", id)
			}
		}
		if len(days) < 2 {
			t.Errorf("entries on %d UTC days, want both sides of midnight", len(days))
		}
		ctx := context.Background()
		for day, want := range days {
			sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day", At: day.Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			if sp != want {
				t.Errorf("Spend(day of %s) = %d, entries sum to %d", day.Format(time.DateOnly), sp, want)
			}
		}
		for u, want := range users {
			sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", User: u, From: t0.AddDate(-1, 0, 0), To: t0.AddDate(1, 0, 0)})
			if err != nil {
				t.Fatal(err)
			}
			if sp != want {
				t.Errorf("Spend(user %s) = %d, entries sum to %d", u, sp, want)
			}
		}
		t.Logf("%d admitted, %d settled, %d entries on %d days", len(admitted), len(settled), len(es), len(days))
	})
}

// TestLedgerAttackTruncatedSealedSegment: a run is killed with two
// segments of records not yet applied, and the first (sealed) segment is
// then cut short. Open must refuse the spool (its records cannot be
// replayed whole) rather than start and skip them.
func TestLedgerAttackTruncatedSealedSegment(t *testing.T) {
	cfg := ledger.Config{Dir: t.TempDir(), SegmentSize: 64 << 10}
	const n = 1000
	ledgerAtkRun(t, "unapplied", cfg.Dir, "", []string{"LEDGER_ATK_N=" + strconv.Itoa(n), "LEDGER_ATK_SEG=65536"},
		func(string, string) bool { return false })
	segs, err := filepath.Glob(filepath.Join(cfg.Dir, "spool", "*.spool"))
	if err != nil || len(segs) < 2 {
		t.Fatalf("segments %v %v, want at least two", segs, err)
	}
	fi, err := os.Stat(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(segs[0], fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	cfg.Logf = t.Logf
	l, err := ledger.Open(context.Background(), cfg)
	if err == nil {
		defer l.Close()
		flush(t, l)
		t.Fatalf("Open started on a spool whose sealed segment lost half its records: %d entries of %d", len(all(t, l, ledger.Query{})), n)
	}
	t.Logf("Open refused: %v", err)
}
