package rls_test

// A call that costs nothing and counts only on descriptor limits is a
// ledger tally: its counters join an entry of its shape and second (see
// ledger.Tally), where it wrote an entry of its own. These tests hold a
// restore after a loss to every such call all the same: at once (the
// tallies not yet ticked), after the ledger's Flush, and after the death
// of the process that tallied them.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// TestMain runs the test binary as tallyChild when RLS_TALLY_CHILD names
// a configuration file, and as the tests otherwise.
func TestMain(m *testing.M) {
	if path := os.Getenv("RLS_TALLY_CHILD"); path != "" {
		tallyChild(path)
		return
	}
	os.Exit(m.Run())
}

// tallyChild serves the configuration at path until it is killed,
// printing its address once it listens.
func tallyChild(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	cfg, err := config.Parse(b)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	g, err := gate.Open(context.Background(), cfg, gate.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	fmt.Println(ln.Addr().String())
	rls.New(g, rls.Options{}).Serve(ln)
}

// tallyEntries counts acme's ledger entries.
func (e *env) acmeEntries(t *testing.T) int {
	t.Helper()
	page, err := e.g.Ledger().Entries(context.Background(), ledger.Query{Tenant: "acme", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(page.Entries)
}

// TestTallyAtkLossBeforeAndAfterFlush: acme spends 6 of its 10 searches;
// Redis loses its data before the ledger was flushed (the tallies not yet
// in entries): 4 are left, 2 spent; Redis loses its data again after a
// Flush: 2 left. The 8 calls are a few aggregate entries, not 8: before,
// an entry each. On both ledger stores.
func TestTallyAtkLossBeforeAndAfterFlush(t *testing.T) {
	for _, store := range []string{"embedded", "postgres"} {
		t.Run(store, func(t *testing.T) {
			awayFromDayEnd(time.Minute)
			srv := redistest.New(t)
			yaml := fmt.Sprintf(descLossConfig, "sliding_window", "fail_open") + fmt.Sprintf(
				"\ndata_dir: %q\nstore: {redis: %q, timeout: 5s, queue_timeout: 5s}\n", t.TempDir(), srv.URL)
			if store == "postgres" {
				yaml += fmt.Sprintf("ledger: {dsn: %q}\n", pgtest.New(t))
			}
			cfg, err := config.Parse([]byte(yaml))
			if err != nil {
				t.Fatal(err)
			}
			e := &env{redis: srv}
			e.open(t, cfg, rls.Options{})
			ctx := context.Background()
			for range 6 {
				if r := e.ask(t, "edge", 1, search()); r.GetOverallCode() != OK {
					t.Fatalf("a search of the first 6: %s", codes_(r))
				}
			}
			if err := e.redis.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				if r := e.ask(t, "edge", 1, search()); r.GetOverallCode() != OK {
					t.Fatalf("search %d of the 4 left after a loss before Flush: %s", 7+i, codes_(r))
				}
			}
			if err := e.g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := e.redis.Client(t).FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if n := e.admitted(t, search); n != 2 {
				t.Fatalf("after a loss after Flush: %d searches admitted of the 2 left", n)
			}
			if err := e.g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if n := e.acmeEntries(t); n > 5 {
				t.Errorf("%d ledger entries for acme's 10 searches; want their aggregates, a few", n)
			}
		})
	}
}

// TestTallyAtkCrash: a process that tallied 6 of acme's 10 searches is
// killed (SIGKILL: no Close, perhaps no tick); the next one, on the same
// data dir, has 4 left after the loss of the counters (its memory store
// starts empty; Redis is flushed). The 6 calls are fewer entries than
// calls.
func TestTallyAtkCrash(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		awayFromDayEnd(time.Minute)
		yaml := fmt.Sprintf(descLossConfig, "fixed_window", "fail_open") + fmt.Sprintf("\ndata_dir: %q\n", t.TempDir())
		var srv *redistest.Server
		if redis {
			srv = redistest.New(t)
			yaml += fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}\n", srv.URL)
		}
		path := t.TempDir() + "/costgate.yaml"
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "RLS_TALLY_CHILD="+path)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killed := false
		t.Cleanup(func() {
			if !killed {
				cmd.Process.Kill()
				cmd.Wait()
			}
		})
		addr, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			t.Fatalf("the child's address: %v", err)
		}
		child := &env{}
		child.dial(t, strings.TrimSpace(addr))
		for range 6 {
			if r := child.ask(t, "edge", 1, search()); r.GetOverallCode() != OK {
				t.Fatalf("a search of the first 6: %s", codes_(r))
			}
		}
		cmd.Process.Kill() // SIGKILL
		cmd.Wait()
		killed = true

		cfg, err := config.Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		e := &env{redis: srv}
		e.open(t, cfg, rls.Options{})
		if redis {
			if err := e.redis.Client(t).FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if n := e.admitted(t, search); n != 4 {
			t.Fatalf("after a crash and the loss of the counters: %d searches admitted of the 4 left", n)
		}
		if err := e.g.Ledger().Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := e.acmeEntries(t); n >= 10 {
			t.Errorf("%d ledger entries for acme's 10 searches; want their aggregates, fewer", n)
		}
	})
}
