package ledger_test

// The crash test: a child process (this test binary, re-executed) reserves
// and settles under load until it is killed with SIGKILL; it reports each
// request on stdout once Reserve has returned (the request is admitted) and
// once Settle has returned. After two such runs on the same Dir, the ledger
// must hold exactly one entry per admitted request, each either settled at
// its actual cost or, when its settlement was never recorded, recovered at
// its estimate.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

const crashLag = 8 // a child worker settles each request this many requests later

// crashCost is the actual cost a child settles request seq of worker w at.
func crashCost(w, seq int) costmodel.NanoUSD { return costmodel.NanoUSD(1_000 + seq%997 + w) }

func crashID(prefix string, w, seq int) string { return fmt.Sprintf("%s-%d-%d", prefix, w, seq) }

func parseCrashID(id string) (prefix string, w, seq int, err error) {
	parts := strings.Split(id, "-")
	if len(parts) != 3 {
		return "", 0, 0, fmt.Errorf("bad id %q", id)
	}
	if w, err = strconv.Atoi(parts[1]); err != nil {
		return "", 0, 0, err
	}
	seq, err = strconv.Atoi(parts[2])
	return parts[0], w, seq, err
}

// TestMain runs the test binary as the child process of TestCrashSIGKILL
// or TestCrashAfterSettleDurable when LEDGER_CRASH_CHILD is set, and as the
// tests otherwise.
func TestMain(m *testing.M) {
	switch os.Getenv("LEDGER_CRASH_CHILD") {
	case "1":
		crashChild()
		return
	case "durable":
		durableChild()
		return
	}
	os.Exit(m.Run())
}

// crashChild reserves and settles requests on four workers, reporting each
// on stdout, until the parent kills it.
func crashChild() {
	prefix := os.Getenv("LEDGER_CRASH_PREFIX")
	l, err := ledger.Open(context.Background(), ledger.Config{
		Dir: os.Getenv("LEDGER_CRASH_DIR"), DSN: os.Getenv("LEDGER_CRASH_DSN"),
		Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(3)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				id := crashID(prefix, w, seq)
				e := reservation(id, t0.Add(time.Duration(seq)*time.Microsecond))
				e.EstimatedCost = 5_000
				if err := l.Reserve(ctx, e); err != nil {
					fmt.Fprintln(os.Stderr, "reserve:", err)
					os.Exit(3)
				}
				fmt.Printf("R %s\n", id)
				if seq >= crashLag {
					id := crashID(prefix, w, seq-crashLag)
					if err := l.Settle(ctx, settlement(id, crashCost(w, seq-crashLag))); err != nil {
						fmt.Fprintln(os.Stderr, "settle:", err)
						os.Exit(3)
					}
					fmt.Printf("S %s\n", id)
				}
			}
		})
	}
	wg.Wait()
}

// runCrashChild runs a child until it has admitted killAfter requests, kills
// it with SIGKILL, and records what it reported.
func runCrashChild(t *testing.T, cfg ledger.Config, prefix string, killAfter int, admitted, settled map[string]bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LEDGER_CRASH_CHILD=1", "LEDGER_CRASH_PREFIX="+prefix,
		"LEDGER_CRASH_DIR="+cfg.Dir, "LEDGER_CRASH_DSN="+cfg.DSN)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	n := 0
	for sc.Scan() {
		kind, id, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue // the test framework's own output
		}
		switch kind {
		case "R":
			admitted[id] = true
			if n++; n == killAfter {
				cmd.Process.Kill() // SIGKILL
			}
		case "S":
			settled[id] = true
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != -1 {
		t.Fatalf("child %s: %v, want killed by SIGKILL after %d admissions (admitted %d)\n%s", prefix, err, killAfter, n, stderr.String())
	}
}

func TestCrashSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test in -short mode")
	}
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		admitted, settled := map[string]bool{}, map[string]bool{}
		// Two runs on the same Dir: the second recovers the first while it
		// is under load itself, and is killed in turn.
		runCrashChild(t, cfg, "a", 1500, admitted, settled)
		runCrashChild(t, cfg, "b", 1500, admitted, settled)

		l := open(t, cfg)
		flush(t, l)
		entries := all(t, l, ledger.Query{Limit: ledger.MaxLimit})
		seen := map[string]bool{}
		var sum costmodel.NanoUSD
		counts := map[ledger.Status]int{}
		for _, e := range entries {
			if seen[e.RequestID] {
				t.Fatalf("%s twice", e.RequestID)
			}
			seen[e.RequestID] = true
			_, w, seq, err := parseCrashID(e.RequestID)
			if err != nil {
				t.Fatalf("entry the child never made: %v", err)
			}
			counts[e.Status]++
			sum += e.Charge()
			switch e.Status {
			case ledger.StatusSettled:
				if e.ActualCost != crashCost(w, seq) {
					t.Errorf("%s settled at %d, want %d", e.RequestID, e.ActualCost, crashCost(w, seq))
				}
			case ledger.StatusRecovered:
				if settled[e.RequestID] {
					t.Errorf("%s was settled (Settle returned) but is recovered at its estimate", e.RequestID)
				}
				if e.ActualCost != e.EstimatedCost || e.Actual != e.Estimated {
					t.Errorf("%s recovered at %d, want its estimate %d", e.RequestID, e.ActualCost, e.EstimatedCost)
				}
			default:
				t.Errorf("%s is %s after recovery", e.RequestID, e.Status)
			}
		}
		missing := 0
		for id := range admitted {
			if !seen[id] {
				missing++
				if missing < 5 {
					t.Errorf("admitted request %s has no entry", id)
				}
			}
		}
		if missing > 0 {
			t.Fatalf("%d of %d admitted requests have no entry", missing, len(admitted))
		}
		if counts[ledger.StatusRecovered] == 0 {
			t.Fatalf("no entry was recovered (%v): the kill did not catch requests in flight, so the test proved nothing", counts)
		}
		sp, err := l.Spend(context.Background(), ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0})
		if err != nil {
			t.Fatal(err)
		}
		if sp != sum {
			t.Fatalf("Spend = %d, want the sum of the entries' charges %d", sp, sum)
		}
		t.Logf("admitted %d, entries %d %v", len(admitted), len(entries), counts)
	})
}
