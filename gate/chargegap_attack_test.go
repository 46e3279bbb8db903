package gate_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestMain runs the test binary as chargeGapChild when GATE_GAP_CHILD
// names a configuration file, and as the tests otherwise.
func TestMain(m *testing.M) {
	if path := os.Getenv("GATE_GAP_CHILD"); path != "" {
		chargeGapChild(path, os.Getenv("GATE_GAP_STEP"))
		return
	}
	os.Exit(m.Run())
}

// gapModel is the model of the charge gap tests' requests, priced by the
// default price table.
const gapModel = "gpt-4o-mini"

// gapID is the request id of the charge gap tests' one request.
const gapID = "req_0000chargegap0000000000000001"

// gapConfig gives acme a day of tokens and a day's budget, far above
// what the tests spend, on the Redis at %q (a replyHold before it), with
// the ledger in data_dir %q, on PostgreSQL when its dsn %q is not empty.
const gapConfig = `
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: tokens, dimensions: [tenant], unit: tokens, rate: 1000000, period: 24h, algorithm: fixed_window}
budgets:
  - {name: daily, scope: tenant, amount: "100.00"}
`

// gapCase is one step killed at its worst moment: the child reserves 50
// input and 100 output tokens (first extending by extend output tokens
// when not 0), records the entry, and then runs step, in which its
// limiter call on the request reaches Redis and the process dies before
// it has the answer. The upstream's actual usage is 50 input tokens and
// out output tokens. The call held is the first whose id is the request's
// followed by call: the one that charges beyond the reservation (with
// increments, the last increment's, ":x1"; a settlement's other calls may
// reach Redis apart from it).
type gapCase struct {
	name   string
	step   string
	extend int64
	out    int64
	call   string
}

// TestChargeGapAtkSettleBeyondTheEstimate: a settlement that charges
// more than the reservation holds (300 output tokens of 100 reserved; an
// RLS charge of served usage, which reserves nothing; a stream extended
// to 300 tokens and settled at 450) is killed once Redis has charged it
// and before the process has Redis's answer. After the restart on the
// same data dir the ledger must bill the upstream's usage exactly once,
// as the limits count it, and a restore after Redis loses its data must
// count it too. Before, Redis was charged first and the ledger after: the
// entry was recovered at its estimate, the tenant billed $0.0000675 of
// the $0.0001875 the upstream charged (nothing at all for the RLS charge,
// $0.0001875 of $0.0002775 for the extended stream).
func TestChargeGapAtkSettleBeyondTheEstimate(t *testing.T) {
	chargeGapAtk(t, []gapCase{
		{name: "settle", step: "settle", out: 300},
		{name: "rls-served-charge", step: "served", out: 300},
		{name: "extended-settle", step: "settle", extend: 200, out: 450, call: ":x1"},
	})
}

// TestChargeGapAtkSettleHeldBeyondTheEstimate: a held reservation (the
// reserve/settle API's) of 100 output tokens is settled at 300: the
// settlement is claimed and charged in Redis in one script call, and the
// process is killed once Redis has made it, before the process has its
// answer. After the restart the ledger must bill the 300 output tokens
// Redis counts, with no retry of the settlement to find the claim, not
// the reservation's estimate (before: $0.0000675 of the $0.0001875
// settled).
func TestChargeGapAtkSettleHeldBeyondTheEstimate(t *testing.T) {
	chargeGapAtk(t, []gapCase{{name: "held", step: "held", out: 300}})
}

// TestChargeGapAtkExtendIncrement: a stream of 100 output tokens
// reserved runs past its estimate, and its increment of 200 tokens is
// debited in Redis; the process is killed before it has Redis's answer.
// After the restart the ledger must bill the 300 output tokens the limits
// let through (the entry recovered at its extended estimate), exactly
// once. Before, the increment reached the ledger after Redis: the entry
// was recovered at 100 tokens, $0.0000675 of the $0.0001875 the limits
// counted.
func TestChargeGapAtkExtendIncrement(t *testing.T) {
	chargeGapAtk(t, []gapCase{{name: "extend", step: "extend", extend: 200, out: 300, call: ":x1"}})
}

// chargeGapAtk runs each case on the embedded ledger and on PostgreSQL.
func chargeGapAtk(t *testing.T, cases []gapCase) {
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, db := range []string{"embedded", "postgres"} {
		for _, c := range cases {
			t.Run(db+"/"+c.name, func(t *testing.T) {
				awayFromTheDayEdge(t)
				dsn := ""
				if db == "postgres" {
					dsn = pgtest.New(t)
				}
				srv := redistest.New(t)
				hold := newReplyHold(t, srv.Addr)
				dir := t.TempDir()
				path := dir + "/costgate.yaml"
				if err := os.WriteFile(path, fmt.Appendf(nil, gapConfig, dir+"/data", hold.URL(), dsn), 0o600); err != nil {
					t.Fatal(err)
				}
				runGapChild(t, path, c, hold)

				// The restart, on the same data dir, with Redis as the
				// child left it.
				g := openYAML(t, fmt.Sprintf(gapConfig, dir+"/data", srv.URL, dsn))
				ctx := context.Background()
				if err := g.Ledger().Flush(ctx); err != nil {
					t.Fatal(err)
				}
				u := costmodel.Usage{InputTokens: 50, OutputTokens: c.out}
				want := est.Cost(gapModel, u)
				if got := used(t, g)["tokens"]; got != 50+c.out {
					t.Fatalf("Redis counts %d tokens after the crash, want %d: the kill did not come after Redis charged the step", got, 50+c.out)
				}
				e, ok, err := g.Ledger().Lookup(ctx, gapID)
				if err != nil || !ok {
					t.Fatalf("the request's entry: %v %v", ok, err)
				}
				page, err := g.Ledger().Entries(ctx, ledger.Query{Tenant: "acme", Limit: 100})
				if err != nil {
					t.Fatal(err)
				}
				spent, err := g.Ledger().Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
				if err != nil {
					t.Fatal(err)
				}
				if len(page.Entries) != 1 || e.ActualCost != want || spent != want || e.Actual.OutputTokens != c.out {
					t.Fatalf("killed once Redis was charged %d output tokens: %d entries, the request's %s at %d output tokens, %s; acme spent %s; want one entry of %s",
						c.out, len(page.Entries), e.Status, e.Actual.OutputTokens, e.ActualCost, spent, want)
				}
				// Redis loses its data: the restore counts what the
				// ledger billed.
				if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if got := used(t, g); got["tokens"] != 50+c.out || got["daily"] != int64(want) {
					t.Fatalf("after a loss the limits count %v, want %d tokens and %d nano-USD", got, 50+c.out, want)
				}
			})
		}
	}
}

// runGapChild starts the child on path with c, has it run c's step once
// hold has been armed, and kills it (SIGKILL) as soon as Redis has
// answered the step's call on the request, before the child has the
// answer.
func runGapChild(t *testing.T, path string, c gapCase, hold *replyHold) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "GATE_GAP_CHILD="+path, fmt.Sprintf("GATE_GAP_STEP=%s/%d", c.step, c.extend)+fmt.Sprintf("/%d", c.out))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			cmd.Process.Kill() // SIGKILL: no Close, no deferred write
			cmd.Wait()
		}
	}
	t.Cleanup(kill)
	lines := bufio.NewReader(stdout)
	if l, err := lines.ReadString('\n'); err != nil || l != "ready\n" {
		t.Fatalf("the child before its step: %q, %v", l, err)
	}
	hold.arm(gapID + c.call)
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() {
		l, _ := lines.ReadString('\n')
		done <- l
	}()
	select {
	case <-hold.held:
		kill()
	case l := <-done:
		kill()
		t.Fatalf("the child ended its step (%q) with no call on the request reaching Redis", l)
	case <-time.After(20 * time.Second):
		kill()
		t.Fatal("no call on the request reached Redis in 20 s")
	}
}

// chargeGapChild is the child process: it opens the gate at path, makes
// the request (see gapCase), says "ready", and runs step once its parent
// says "go". step is "settle|served|extend|held/EXTEND/OUT". The parent kills
// it.
func chargeGapChild(path, step string) {
	fail := func(err any) {
		fmt.Fprintln(os.Stderr, "charge gap child:", err)
		os.Exit(3)
	}
	var kind string
	var extend, out int64
	if _, err := fmt.Sscanf(strings.ReplaceAll(step, "/", " "), "%s %d %d", &kind, &extend, &out); err != nil {
		fail(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		fail(err)
	}
	cfg, err := config.Parse(b)
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	g, err := gate.Open(ctx, cfg, gate.Options{})
	if err != nil {
		fail(err)
	}
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		fail(err)
	}
	req := &gate.Request{ID: gapID, Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions"}
	if kind == "served" {
		// The rate limit service's charge of a stream's tokens, reported
		// at its end: usage already served.
		req.Served, req.NoRequests, req.Estimate = true, true, costmodel.Estimate{Model: gapModel}
	} else {
		u := costmodel.Usage{InputTokens: 50, OutputTokens: 100}
		req.Estimate = costmodel.Estimate{Model: gapModel, Stream: true, Usage: u, Cost: est.Cost(gapModel, u)}
	}
	res, d := g.Reserve(ctx, req)
	if res == nil {
		fail(fmt.Sprintf("refused: %+v", d))
	}
	if d, ok := res.Record(ctx); !ok {
		fail(fmt.Sprintf("not recorded: %+v", d))
	}
	if kind == "held" {
		res.Hold(time.Hour) // a reserve/settle API's reservation
	}
	if kind != "extend" && extend > 0 {
		if d, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: extend}); !ok {
			fail(fmt.Sprintf("extend refused: %+v", d))
		}
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail(err)
	}
	u := costmodel.Usage{InputTokens: 50, OutputTokens: out}
	charge := gate.Charge{Usage: u, Cost: res.Price(gapModel, u), Model: gapModel, HTTPStatus: 200}
	switch kind {
	case "extend":
		res.Extend(ctx, costmodel.Usage{OutputTokens: extend})
	case "held":
		res.SettleHeld(ctx, charge)
	default:
		res.Settle(ctx, charge)
	}
	fmt.Println("done")
	select {}
}

// replyHold is a TCP proxy before a Redis that passes every call through
// until armed with a pattern; then the first call whose bytes hold the
// pattern goes to Redis, and Redis's answer to it, and every later byte
// on that connection, is kept from the client. held is closed once such
// an answer arrived: Redis has made the call, and its client waits.
type replyHold struct {
	ln      net.Listener
	target  string
	pattern atomic.Pointer[[]byte]
	held    chan struct{}
	once    sync.Once

	mu    sync.Mutex
	conns []net.Conn
}

func newReplyHold(t *testing.T, target string) *replyHold {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &replyHold{ln: ln, target: target, held: make(chan struct{})}
	go h.accept()
	t.Cleanup(func() {
		ln.Close()
		h.mu.Lock()
		for _, c := range h.conns {
			c.Close()
		}
		h.mu.Unlock()
	})
	return h
}

// URL is the proxy's redis:// URL.
func (h *replyHold) URL() string { return "redis://" + h.ln.Addr().String() }

// arm holds the answer to the next call whose bytes hold pattern.
func (h *replyHold) arm(pattern string) {
	p := []byte(pattern)
	h.pattern.Store(&p)
}

func (h *replyHold) accept() {
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", h.target)
		if err != nil {
			c.Close()
			continue
		}
		h.mu.Lock()
		h.conns = append(h.conns, c, s)
		h.mu.Unlock()
		go h.pipe(c, s)
	}
}

func (h *replyHold) pipe(c, s net.Conn) {
	var holding atomic.Bool
	go func() { // Redis to the client
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 && holding.Load() {
				h.once.Do(func() { close(h.held) })
			} else if n > 0 {
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if p := h.pattern.Load(); p != nil && bytes.Contains(buf[:n], *p) && h.pattern.CompareAndSwap(p, nil) {
				holding.Store(true)
			}
			if _, err := s.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestChargeGapAtkExtendedSettleKept: a stream of 100 output tokens
// reserved, extended by 200 in Redis, is settled at 450 while Redis
// refuses every write (its memory full): the settlement of the increment,
// which takes the 150 tokens beyond what it holds, fails. It must be kept
// and made once Redis takes writes again, before the next decision on
// the tenant, as a failed settlement of a reservation without increments
// is: the limit then counts the 500 tokens used. Before, the failure was
// only logged, and acme's tokens limit counted 350 of its 500 tokens.
func TestChargeGapAtkExtendedSettleKept(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s, breaker_failures: 1, breaker_cooldown: 20ms}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: tokens, dimensions: [tenant], unit: tokens, rate: 1000000, period: 24h, algorithm: fixed_window}
`, t.TempDir(), srv.URL))
	awayFromTheDayEdge(t)
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	u := costmodel.Usage{InputTokens: 50, OutputTokens: 100}
	res, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions",
		Estimate: costmodel.Estimate{Model: gapModel, Stream: true, Usage: u, Cost: est.Cost(gapModel, u)}})
	if res == nil || d.Degraded {
		t.Fatalf("the reservation: %+v", d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatalf("record: %+v", d)
	}
	if d, ok := res.Extend(ctx, costmodel.Usage{OutputTokens: 200}); !ok || res.Degraded() {
		t.Fatalf("the increment: %+v", d)
	}
	rc := srv.Client(t)
	if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	u.OutputTokens = 450
	res.Settle(ctx, gate.Charge{Usage: u, Cost: res.Price(gapModel, u), Model: gapModel, HTTPStatus: 200})
	if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// The next decisions on acme once the breaker lets a call through
	// (its first may be the probe, and one before it the local fallback's).
	var counted int64 = -1
	for deadline := time.Now().Add(10 * time.Second); counted < 0 && time.Now().Before(deadline); {
		_, d := g.Reserve(ctx, &gate.Request{Caller: g.Identify("cg-acme"), Route: "/v1/chat/completions", Check: true, States: true})
		if !d.Degraded && len(d.Limits) == 1 {
			counted = d.Limits[0].Capacity - d.Limits[0].Remaining
		} else {
			time.Sleep(5 * time.Millisecond) // the breaker's cooldown
		}
	}
	if counted != 500 {
		t.Fatalf("acme's tokens limit counts %d tokens once Redis takes writes again, want the 500 used", counted)
	}
}
