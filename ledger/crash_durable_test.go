package ledger_test

// The durable-settlement crash test: a child process works as the proxy
// will, calling SettleDurable as soon as the upstream's usage is known and
// the full Settle only some requests later (after the response has gone
// out). It reports "D id" once SettleDurable has returned, and is killed
// with SIGKILL right after one such report. After reopening, every request
// whose SettleDurable returned must be settled at its actual cost, in
// particular those whose later Settle never ran: none may be recovered at
// its estimate.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// durableChild reserves, settles durably at once and settles again
// crashLag requests later, on four workers, until the parent kills it.
func durableChild() {
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
	var (
		wg  sync.WaitGroup
		out sync.Mutex
	)
	report := func(kind, id string) {
		out.Lock()
		fmt.Printf("%s %s\n", kind, id)
		out.Unlock()
	}
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
				report("R", id)
				if err := l.SettleDurable(ctx, settlement(id, crashCost(w, seq))); err != nil {
					fmt.Fprintln(os.Stderr, "settle durable:", err)
					os.Exit(3)
				}
				report("D", id)
				if seq >= crashLag {
					id := crashID(prefix, w, seq-crashLag)
					if err := l.Settle(ctx, settlement(id, crashCost(w, seq-crashLag))); err != nil {
						fmt.Fprintln(os.Stderr, "settle:", err)
						os.Exit(3)
					}
					report("S", id)
				}
			}
		})
	}
	wg.Wait()
}

func TestCrashAfterSettleDurable(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test in -short mode")
	}
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		durable, settled := map[string]bool{}, map[string]bool{}
		for _, prefix := range []string{"a", "b"} {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "LEDGER_CRASH_CHILD=durable", "LEDGER_CRASH_PREFIX="+prefix,
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
					continue
				}
				switch kind {
				case "D":
					durable[id] = true
					if n++; n == 400 {
						cmd.Process.Kill() // SIGKILL, right after SettleDurable returned
					}
				case "S":
					settled[id] = true
				}
			}
			err = cmd.Wait()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != -1 {
				t.Fatalf("child %s: %v, want killed by SIGKILL (%d durable settlements)\n%s", prefix, err, n, stderr.String())
			}
		}

		l := open(t, cfg)
		flush(t, l)
		got := map[string]ledger.Entry{}
		for _, e := range all(t, l, ledger.Query{Limit: ledger.MaxLimit}) {
			got[e.RequestID] = e
		}
		gap := 0 // settled durably, but killed before the full Settle
		for id := range durable {
			_, w, seq, err := parseCrashID(id)
			if err != nil {
				t.Fatal(err)
			}
			e, ok := got[id]
			switch {
			case !ok:
				t.Errorf("%s: SettleDurable returned but there is no entry", id)
			case e.Status != ledger.StatusSettled || e.ActualCost != crashCost(w, seq):
				t.Errorf("%s: SettleDurable returned, entry %s at %d, want settled at %d", id, e.Status, e.ActualCost, crashCost(w, seq))
			}
			if !settled[id] {
				gap++
			}
		}
		if gap == 0 {
			t.Fatal("no request was killed between SettleDurable and Settle: the test proved nothing")
		}
		t.Logf("%d durable settlements, %d of them killed before their Settle", len(durable), gap)
	})
}
