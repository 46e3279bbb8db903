package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/examples"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/rls"
)

// demoClient is one tenant's traffic in the demo.
type demoClient struct {
	tenant, key string
	perSecond   float64
	models      []string
	maxTokens   int
}

// demoTally is what one tenant got, as its client saw it.
type demoTally struct {
	admitted, friction, limited, budget, other int
}

// demo runs costgate and the simulator in process, drives traffic from
// three tenants and prints a live table; then it keeps the proxy and the
// dashboard serving until ctx ends (Ctrl-C), unless --exit.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 20*time.Second, "how long to drive traffic")
	listen := fs.String("listen", "", "data plane address (default: the demo config's, or a free port)")
	adminListen := fs.String("admin-listen", "", "admin address (default: the demo config's, or a free port)")
	exit := fs.Bool("exit", false, "exit when the traffic ends, instead of serving the proxy and the dashboard until Ctrl-C")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Parsed without the environment's defaults: the demo is
	// self-contained (in-memory store, embedded ledger), whatever REDIS_URL
	// and DATABASE_URL say.
	cfg, err := config.Parse(examples.DemoConfig())
	if err != nil {
		return fmt.Errorf("demo config: %w", err)
	}
	cfg.WithPolicyFS(examples.DemoPolicies())
	// The demo's keys and admin token are published: the addresses asked
	// for are checked as serve checks them (loopback only).
	if *listen != "" {
		cfg.Listen = *listen
	}
	if *adminListen != "" {
		cfg.AdminListen = *adminListen
	}
	if tok := os.Getenv("COSTGATE_ADMIN_TOKEN"); tok != "" {
		cfg.AdminToken = tok // the published token gives way to the operator's own
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	dir, err := os.MkdirTemp("", "costgate-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.DataDir = dir

	srv, err := proxy.Open(ctx, cfg, proxy.Options{})
	if err != nil {
		return err
	}
	defer srv.Close()
	data, err := listenOr(*listen, cfg.Listen)
	if err != nil {
		return err
	}
	admin, err := listenOr(*adminListen, cfg.AdminListen)
	if err != nil {
		data.Close()
		return err
	}
	dataSrv := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	adminSrv := &http.Server{Handler: srv.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
	go dataSrv.Serve(data)
	go adminSrv.Serve(admin)
	defer adminSrv.Close()
	defer dataSrv.Close()

	base := "http://" + data.Addr().String()
	fmt.Fprintf(stdout, "costgate demo: proxy on %s, simulator upstream in process\n", base)
	until := "until you press Ctrl-C"
	if *exit {
		until = "until the traffic ends"
	}
	fmt.Fprintf(stdout, "dashboard: http://%s/admin/#token=%s (serves %s)\n\n", admin.Addr(), cfg.AdminToken, until)
	fmt.Fprint(stdout, demoLegend)
	httpc := &http.Client{Timeout: 10 * time.Second}
	if err := demoReserve(ctx, stdout, httpc, base, "cg-demo-acme"); err != nil {
		return err
	}
	if err := demoRLS(ctx, stdout, srv); err != nil {
		return err
	}

	clients := []demoClient{
		{tenant: "acme", key: "cg-demo-acme", perSecond: 3, models: []string{"gpt-4o-mini", "gpt-4o"}, maxTokens: 128},
		{tenant: "globex", key: "cg-demo-globex", perSecond: 6, models: []string{"gpt-4o"}, maxTokens: 256},
		{tenant: "initech", key: "cg-demo-initech", perSecond: 2, models: []string{"gpt-4o", "gpt-4.1"}, maxTokens: 512},
	}
	var mu sync.Mutex
	tallies := map[string]*demoTally{}
	for _, c := range clients {
		tallies[c.tenant] = &demoTally{}
	}
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			tick := time.NewTicker(time.Duration(float64(time.Second) / c.perSecond))
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-runCtx.Done():
					return
				case <-tick.C:
				}
				status, friction := demoRequest(runCtx, httpc, base, c, i)
				mu.Lock()
				t := tallies[c.tenant]
				switch {
				case status == http.StatusOK && friction:
					t.friction++
				case status == http.StatusOK:
					t.admitted++
				case status == http.StatusTooManyRequests:
					t.limited++
				case status == http.StatusPaymentRequired:
					t.budget++
				case status != 0:
					t.other++
				}
				mu.Unlock()
			}
		})
	}

	// The table asks the admin API for each tenant's spend, so it prints a
	// copy of the tallies rather than holding the clients up.
	show := func() {
		mu.Lock()
		snap := make(map[string]demoTally, len(tallies))
		for n, t := range tallies {
			snap[n] = *t
		}
		mu.Unlock()
		printDemoTable(ctx, stdout, httpc, "http://"+admin.Addr().String(), cfg.AdminToken, clients, snap)
	}
	every := time.NewTicker(2 * time.Second)
	defer every.Stop()
loop:
	for {
		select {
		case <-runCtx.Done():
			break loop
		case <-every.C:
			show()
		}
	}
	wg.Wait()
	// The last table reads the ledger: every request settled, and its
	// entry applied (the spool writes its store in batches), so that none
	// shows as still reserved.
	_ = srv.WaitIdle(ctx)
	_ = srv.Ledger().Flush(ctx)
	show()
	if !*exit && ctx.Err() == nil {
		fmt.Fprintf(stdout, "The traffic has stopped. The proxy (%s) and the dashboard (http://%s/admin/#token=%s) keep serving until you press Ctrl-C.\n",
			base, admin.Addr(), cfg.AdminToken)
		<-ctx.Done()
	}
	fmt.Fprintf(stdout, "\nThe demo's ledger was in %s (removed now). Run `costgate serve` to keep going with the quickstart.\n", dir)
	return nil
}

// demoReserve shows the reserve/settle API: a caller that costgate does
// not proxy reserves an estimate, calls its API itself, and settles what
// it used, from the same budget as the tenant's proxied requests.
func demoReserve(ctx context.Context, w io.Writer, c *http.Client, base, key string) error {
	call := func(path, body string) (map[string]any, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("demo: %s answered %d: %v", path, resp.StatusCode, out)
		}
		return out, nil
	}
	fmt.Fprintln(w, "The reserve/settle API, for calls costgate does not proxy (same limits, budgets and ledger):")
	r, err := call("/v1/costgate/reserve", `{"cost":{"tokens":2000},"model":"gpt-4o-mini"}`)
	if err != nil {
		return err
	}
	est, _ := r["estimate"].(map[string]any)
	fmt.Fprintf(w, "  POST /v1/costgate/reserve  2000 tokens of gpt-4o-mini  -> reserved $%v\n", est["cost_usd"])
	st, err := call("/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"input_tokens":1200,"output_tokens":300}}`, r["reservation_id"]))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  POST /v1/costgate/settle   1200 in, 300 out             -> charged  $%v\n\n", st["cost_usd"])
	return nil
}

// demoRLS shows Envoy's rate limit service on the same gate: one
// metered search call of acme, priced per hit into the same budget and
// ledger.
func demoRLS(ctx context.Context, w io.Writer, srv *proxy.Server) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	rs := rls.New(srv.Gate(), rls.Options{})
	go rs.Serve(ln)
	defer rs.GracefulStop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{
		Domain: "costgate", HitsAddend: 1,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "tenant", Value: "acme"}, {Key: "generic_key", Value: "search"}}}},
	})
	if err != nil {
		return fmt.Errorf("demo: rate limit service: %w", err)
	}
	fmt.Fprintln(w, "Envoy's rate limit service (gRPC), on the same gate:")
	fmt.Fprintf(w, "  ShouldRateLimit domain=costgate [tenant=acme, generic_key=search] hits 1 -> %s, $0.005 into acme's budget\n\n", resp.GetOverallCode())
	return nil
}

// demoLegend says what the table's columns count.
const demoLegend = `admitted: served without friction; friction: served with friction applied (not counted in admitted);
429 limited, 402 budget: refused; other: any other answer.
settled: today's cost of the finished requests, as billed; reserved: the estimates that requests in flight
hold, settled (usually lower) to their actual cost when they end. Their sum is what budgets see.

`

// demoRequest sends one chat completion; status 0 means the demo ended.
func demoRequest(ctx context.Context, c *http.Client, base string, dc demoClient, i int) (status int, friction bool) {
	body, _ := json.Marshal(map[string]any{
		"model":      dc.models[i%len(dc.models)],
		"max_tokens": dc.maxTokens,
		"messages": []map[string]string{
			{"role": "system", "content": "You are a concise assistant."},
			{"role": "user", "content": fmt.Sprintf("Question %d from %s: how much does a token cost? (%d)", i, dc.tenant, rand.IntN(1000))},
		},
	})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return 0, false
	}
	req.Header.Set("Authorization", "Bearer "+dc.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Costgate-Friction") != ""
}

func printDemoTable(ctx context.Context, w io.Writer, c *http.Client, admin, token string, clients []demoClient, tallies map[string]demoTally) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s\n", time.Now().Format("15:04:05"))
	fmt.Fprintln(tw, "tenant\tadmitted\tfriction\t429 limited\t402 budget\tother\tsettled today\treserved\t")
	names := make([]string, 0, len(clients))
	for _, cl := range clients {
		names = append(names, cl.tenant)
	}
	sort.Strings(names)
	for _, n := range names {
		t := tallies[n]
		settled, reserved := demoSpend(ctx, c, admin, token, n)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t\n", n, t.admitted, t.friction, t.limited, t.budget, t.other, settled, reserved)
	}
	tw.Flush()
	fmt.Fprintln(w)
}

// demoSpend asks the admin API for a tenant's ledger entries of today, as
// an operator would, and sums apart the actual cost of the finished ones
// and the estimates that the ones in flight hold.
func demoSpend(ctx context.Context, c *http.Client, admin, token, tenant string) (settled, reserved string) {
	today := time.Now().UTC().Format(time.DateOnly)
	q := url.Values{"tenant": {tenant}, "from": {today}, "to": {today}, "format": {"json"}}
	req, _ := http.NewRequestWithContext(ctx, "GET", admin+"/admin/v1/ledger?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return "?", "?"
	}
	defer resp.Body.Close()
	var entries []ledger.Entry
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&entries) != nil {
		return "?", "?"
	}
	var s, r costmodel.NanoUSD
	for _, e := range entries {
		if e.Status == ledger.StatusReserved {
			r += e.EstimatedCost
		} else {
			s += e.Charge()
		}
	}
	return s.String(), r.String()
}

// listenOr listens on addr, or on preferred, or on a free loopback port
// when preferred is taken.
func listenOr(addr, preferred string) (net.Listener, error) {
	if addr != "" {
		return net.Listen("tcp", addr)
	}
	if l, err := net.Listen("tcp", preferred); err == nil {
		return l, nil
	}
	return net.Listen("tcp", "127.0.0.1:0")
}
