package rls_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// descLossConfig gives acme descriptor limits of its own, none of which
// costs money or counts on a limit of its plan: 10 searches a day (a
// plain descriptor), 5 requests a day per project (a wildcard: the value
// is the request's) and 1,000 tokens a day, each of the algorithm %[1]s.
// Its fail-closed ones are %[2]s.
const descLossConfig = `
admin_token: t
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - key: generic_key
              value: search
              on_store_failure: %[2]s
              rate_limit: {name: search, unit: day, requests_per_unit: 10, algorithm: %[1]s}
            - key: project
              on_store_failure: %[2]s
              rate_limit: {name: per-project, unit: day, requests_per_unit: 5, algorithm: %[1]s}
            - key: tokens
              hits: tokens
              on_store_failure: %[2]s
              rate_limit: {name: tok, unit: day, requests_per_unit: 1000, algorithm: %[1]s}
`

// descAlgorithms are the algorithms a descriptor limit takes.
var descAlgorithms = []string{"fixed_window", "sliding_window", "token_bucket", "gcra", "sliding_log"}

func search() *commonv3.RateLimitDescriptor { return d("tenant", "acme", "generic_key", "search") }
func project(p string) *commonv3.RateLimitDescriptor {
	return d("tenant", "acme", "project", p)
}

// admitted asks for desc (one hit) until it is refused, at most 50 times,
// and returns how many were admitted.
func (e *env) admitted(t *testing.T, desc func() *commonv3.RateLimitDescriptor) int {
	t.Helper()
	for n := range 50 {
		if e.ask(t, "edge", 1, desc()).GetOverallCode() != OK {
			return n
		}
	}
	return 50
}

// descLossEnv opens descLossConfig for algo on Redis, away from the end
// of the day (the tests spend and check in one day's window).
func descLossEnv(t *testing.T, algo string) *env {
	t.Helper()
	awayFromDayEnd(time.Minute)
	return newEnv(t, fmt.Sprintf(descLossConfig, algo, "fail_open"), true, rls.Options{})
}

// TestDescLossAtkPlainDescriptor: acme spends 6 of its 10 searches a day,
// then Redis loses its data (FLUSHALL). 4 are left. Before, the
// descriptor's counter came back empty: 10 more were admitted.
func TestDescLossAtkPlainDescriptor(t *testing.T) {
	for _, algo := range descAlgorithms {
		t.Run(algo, func(t *testing.T) {
			e := descLossEnv(t, algo)
			for range 6 {
				if r := e.ask(t, "edge", 1, search()); r.GetOverallCode() != OK {
					t.Fatalf("a search of the first 6: %s", codes_(r))
				}
			}
			loseRedis(t, e)
			if n := e.admitted(t, search); n != 4 {
				t.Fatalf("after Redis lost its data: %d searches admitted of the 4 acme had left", n)
			}
		})
	}
}

// TestDescLossAtkWildcardDescriptor: a descriptor whose value is the
// request's (a project) has a counter per value: acme spends 3 of project
// a's 5 and 1 of b's; after the loss a has 2 left and b 4 (before, 5
// each). The loss is found by b's request: a's counter, which that
// request does not name, comes back too.
func TestDescLossAtkWildcardDescriptor(t *testing.T) {
	for _, algo := range descAlgorithms {
		t.Run(algo, func(t *testing.T) {
			e := descLossEnv(t, algo)
			for _, p := range []string{"a", "a", "a", "b"} {
				if r := e.ask(t, "edge", 1, project(p)); r.GetOverallCode() != OK {
					t.Fatalf("project %s: %s", p, codes_(r))
				}
			}
			loseRedis(t, e)
			if n := e.admitted(t, func() *commonv3.RateLimitDescriptor { return project("b") }); n != 4 {
				t.Fatalf("after the loss: %d admitted on project b, which had 4 left", n)
			}
			if n := e.admitted(t, func() *commonv3.RateLimitDescriptor { return project("a") }); n != 2 {
				t.Fatalf("after the loss: %d admitted on project a, which had 2 left", n)
			}
		})
	}
}

// TestDescLossAtkSeveralDescriptors: one request of hits_addend 2 names a
// search and project a (2 hits each), another request 3 on project a; a
// charge of 600 tokens after. After the loss: 8 searches left, none on
// project a, and 400 tokens (a check finds room after 399 more are
// charged, none after 400). Before: 10, 5 and 1,000.
func TestDescLossAtkSeveralDescriptors(t *testing.T) {
	for _, algo := range descAlgorithms {
		t.Run(algo, func(t *testing.T) {
			e := descLossEnv(t, algo)
			if r := e.ask(t, "edge", 2, search(), project("a")); r.GetOverallCode() != OK {
				t.Fatalf("2 hits on a search and project a: %s", codes_(r))
			}
			if r := e.ask(t, "edge", 0, hits(3, project("a"))); r.GetOverallCode() != OK {
				t.Fatalf("3 hits on project a: %s", codes_(r))
			}
			if r := e.ask(t, "edge", 0, hits(600, d("tenant", "acme", "tokens", "x"))); r.GetOverallCode() != OK {
				t.Fatalf("600 tokens: %s", codes_(r))
			}
			loseRedis(t, e)
			tok := func(n uint64) *commonv3.RateLimitDescriptor { return hits(n, d("tenant", "acme", "tokens", "x")) }
			// A descriptor in tokens is Envoy's two phases: a check of 0
			// hits needs room for one token, a charge counts what was
			// served.
			for _, step := range []struct {
				charge uint64
				want   rlsv3.RateLimitResponse_Code
			}{{0, OK}, {399, OK}, {1, OVER}} {
				if step.charge > 0 {
					if r := e.ask(t, "edge", 0, tok(step.charge)); r.GetOverallCode() != OK {
						t.Fatalf("after the loss, a charge of %d tokens: %s", step.charge, codes_(r))
					}
				}
				if r := e.ask(t, "edge", 0, tok(0)); r.GetOverallCode() != step.want {
					t.Fatalf("after the loss and %d tokens more, a check: %s, want %s", step.charge, codes_(r), step.want)
				}
			}
			if n := e.admitted(t, search); n != 8 {
				t.Fatalf("after the loss: %d searches admitted of the 8 left", n)
			}
			if n := e.admitted(t, func() *commonv3.RateLimitDescriptor { return project("a") }); n != 0 {
				t.Fatalf("after the loss: %d admitted on project a, which had none left", n)
			}
		})
	}
}

// TestDescLossAtkHitsAddend: one call of hits_addend 7 on the searches
// leaves 3 after the loss, where it left 10.
func TestDescLossAtkHitsAddend(t *testing.T) {
	for _, algo := range descAlgorithms {
		t.Run(algo, func(t *testing.T) {
			e := descLossEnv(t, algo)
			if r := e.ask(t, "edge", 7, search()); r.GetOverallCode() != OK {
				t.Fatalf("7 hits: %s", codes_(r))
			}
			loseRedis(t, e)
			if n := e.admitted(t, search); n != 3 {
				t.Fatalf("after the loss: %d searches admitted of the 3 left", n)
			}
		})
	}
}

// TestDescLossAtkRestartOnMemory: the embedded default (the in-memory
// store, the embedded ledger in data_dir) loses every counter at a
// restart; acme's 6 searches come back from the ledger: 4 left. Before,
// 10.
func TestDescLossAtkRestartOnMemory(t *testing.T) {
	for _, algo := range descAlgorithms {
		t.Run(algo, func(t *testing.T) {
			e := restartedAfterSix(t, fmt.Sprintf(descLossConfig, algo, "fail_open"), search)
			if n := e.admitted(t, search); n != 4 {
				t.Fatalf("after a restart: %d searches admitted of the 4 left", n)
			}
		})
	}
}

// restartedAfterSix opens yaml on the embedded default (the in-memory
// store, the embedded ledger in a data_dir), away from the end of the
// day, asks for desc 6 times, closes it (which loses every counter) and
// opens it again.
func restartedAfterSix(t *testing.T, yaml string, desc func() *commonv3.RateLimitDescriptor) *env {
	t.Helper()
	awayFromDayEnd(time.Minute)
	cfg, err := config.Parse([]byte(yaml + "\ndata_dir: " + t.TempDir() + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{}
	e.open(t, cfg, rls.Options{})
	for range 6 {
		if r := e.ask(t, "edge", 1, desc()); r.GetOverallCode() != OK {
			t.Fatalf("a request of the first 6: %s", codes_(r))
		}
	}
	if err := e.g.Close(); err != nil {
		t.Fatal(err)
	}
	e = &env{}
	e.open(t, cfg, rls.Options{})
	return e
}

// TestDescLossAtkLedgerDown: on PostgreSQL, acme spends 6 searches; with
// the database down, Redis loses its data: the restore answers from this
// node's last read and its records since. A first loss is read while the
// database answers (2 spent), then the database stops, 4 more are spent,
// and Redis loses its data again: 4 left, both postures. A new process
// that never read the count, the database down: a fail-closed limit is
// UNAVAILABLE (Envoy's failure_mode_deny decides), a fail-open one
// answers.
func TestDescLossAtkLedgerDown(t *testing.T) {
	for _, posture := range []string{"fail_open", "fail_closed"} {
		t.Run(posture, func(t *testing.T) {
			awayFromDayEnd(2 * time.Minute)
			srv, pg := redistest.New(t), pgtest.NewPrivate(t)
			yaml := fmt.Sprintf(descLossConfig, "fixed_window", posture) + fmt.Sprintf(
				"\ndata_dir: %q\nstore: {redis: %q, timeout: 5s, queue_timeout: 5s}\nledger: {dsn: %q}\n", t.TempDir(), srv.URL, pg.URL())
			cfg, err := config.Parse([]byte(yaml))
			if err != nil {
				t.Fatal(err)
			}
			e := &env{redis: srv}
			e.open(t, cfg, rls.Options{})
			for range 2 {
				if r := e.ask(t, "edge", 1, search()); r.GetOverallCode() != OK {
					t.Fatalf("a search of the first 2: %s", codes_(r))
				}
			}
			loseRedis(t, e)
			if r := e.ask(t, "edge", 1, search()); r.GetOverallCode() != OK { // the read, the database up
				t.Fatalf("the 3rd search, after the first loss: %s", codes_(r))
			}
			pg.Stop()
			for range 3 {
				if r := e.ask(t, "edge", 1, search()); r.GetOverallCode() != OK {
					t.Fatalf("a search with the database down: %s", codes_(r))
				}
			}
			if err := e.redis.Client(t).FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			if n := e.admitted(t, search); n != 4 {
				t.Fatalf("the database down, after the second loss: %d searches admitted of the 4 left", n)
			}
			// A new process, which never read the count.
			pg.Start()
			if err := e.g.Ledger().Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := e.g.Close(); err != nil {
				t.Fatal(err)
			}
			e = &env{redis: srv}
			e.open(t, cfg, rls.Options{})
			pg.Stop()
			if err := e.redis.Client(t).FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1,
				Descriptors: []*commonv3.RateLimitDescriptor{search()}})
			if posture == "fail_open" {
				if err != nil {
					t.Fatalf("fail-open, the database down and the count never read: %v", err)
				}
				return
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("fail-closed, the database down and the count never read: %v %s, want UNAVAILABLE", err, codes_(resp))
			}
			pg.Start()
			for end := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				_, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
					Descriptors: []*commonv3.RateLimitDescriptor{hits(0, search())}})
				if err == nil {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("the database back for 20 s: %v", err)
				}
			}
			if n := e.admitted(t, search); n != 0 {
				t.Fatalf("the database back: %d searches admitted of the none left", n)
			}
		})
	}
}

// TestDescLossForgetRecordsNothing: a descriptor limit set to
// on_data_loss: forget is the operator's choice of envoyproxy/ratelimit's
// economics: its calls write no ledger entry, and its counter starts
// empty after a loss (one more window), while a limit left at restore,
// in the same request tree, comes back at what was spent.
func TestDescLossForgetRecordsNothing(t *testing.T) {
	cfg := strings.Replace(fmt.Sprintf(descLossConfig, "fixed_window", "fail_open"),
		"rate_limit: {name: search,", "on_data_loss: forget\n              rate_limit: {name: search,", 1)
	e := newEnv(t, cfg, true, rls.Options{})
	for range 6 {
		if r := e.ask(t, "edge", 1, search()); r.GetOverallCode() != OK {
			t.Fatalf("a search of the first 6: %s", codes_(r))
		}
	}
	for range 3 {
		if r := e.ask(t, "edge", 1, project("a")); r.GetOverallCode() != OK {
			t.Fatalf("project a: %s", codes_(r))
		}
	}
	loseRedis(t, e)
	page, err := e.g.Ledger().Entries(context.Background(), ledger.Query{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	// Project a's 3 calls are tallies (ledger.Tally): counted in the
	// entries of their second, not an entry each.
	recorded := map[string]int64{}
	for _, en := range page.Entries {
		for _, line := range strings.Split(en.KeyDesc, "\n") {
			f := strings.Split(line, "\t")
			n, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
			recorded[f[0]] += n
		}
	}
	if recorded["per-project"] != 3 || recorded["search"] != 0 {
		t.Errorf("acme's ledger entries record %v; want project a's 3 calls on per-project: the forgotten searches record none", recorded)
	}
	if n := e.admitted(t, search); n != 10 {
		t.Errorf("after the loss: %d searches admitted; want a whole window again, 10", n)
	}
	if n := e.admitted(t, func() *commonv3.RateLimitDescriptor { return project("a") }); n != 2 {
		t.Errorf("after the loss: %d admitted on project a, which had 2 left", n)
	}
}
