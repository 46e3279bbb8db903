package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// reserveCall posts body to path with key on handler h and returns the
// status and the decoded answer.
func reserveCall(t testing.TB, h http.Handler, key, path, body string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var out map[string]any
	json.Unmarshal(w.Body.Bytes(), &out)
	return w.Code, out
}

func errCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// TestReserveAttacks: a tenant that wants to pay less or spend another's
// reservation gets a clear 4xx, and nothing is charged or refunded for it.
func TestReserveAttacks(t *testing.T) {
	s := newStack(t, "", `
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`)
	h := s.srv.Handler()
	const acme, globex = "cg-test-acme", "cg-test-globex"
	code, r := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.40"}}`)
	if code != 200 {
		t.Fatalf("reserve: %d %v", code, r)
	}
	id, _ := r["reservation_id"].(string)
	cases := []struct {
		name, key, path, body string
		status                int
		code                  string
	}{
		{"unknown field", acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.1"},"discount":1}`, 400, "invalid_body"},
		{"negative tokens", acme, "/v1/costgate/reserve", `{"cost":{"tokens":-5}}`, 400, "invalid_cost"},
		{"negative dollars", acme, "/v1/costgate/reserve", `{"cost":{"usd":"-0.5"}}`, 400, "invalid_cost"},
		{"dollars with ten decimals", acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.0000000001"}}`, 400, "invalid_cost"},
		{"tokens twice", acme, "/v1/costgate/reserve", `{"cost":{"tokens":5,"input_tokens":5}}`, 400, "invalid_cost"},
		{"overflowing tokens", acme, "/v1/costgate/reserve", `{"cost":{"tokens":99999999999999999999}}`, 400, "invalid_body"},
		{"cost and body", acme, "/v1/costgate/reserve", `{"cost":{"tokens":5},"kind":"chat","body":{}}`, 400, "invalid_body"},
		{"unknown upstream", acme, "/v1/costgate/reserve", `{"upstream":"nope"}`, 400, "unknown_upstream"},
		{"ttl too long", acme, "/v1/costgate/reserve", `{"ttl":"100h"}`, 400, "invalid_ttl"},
		{"two values", acme, "/v1/costgate/reserve", `{} {}`, 400, "invalid_body"},
		{"no key", "", "/v1/costgate/reserve", `{}`, 401, "invalid_api_key"},
		{"another tenant settles", globex, "/v1/costgate/settle", `{"reservation_id":"` + id + `","usage":{"usd":"0"}}`, 404, "unknown_reservation"},
		{"another tenant releases", globex, "/v1/costgate/release", `{"reservation_id":"` + id + `"}`, 404, "unknown_reservation"},
		{"forged id", acme, "/v1/costgate/settle", `{"reservation_id":"rsv_eyJpIjoieCJ9.AAAA","usage":{"usd":"0"}}`, 404, "unknown_reservation"},
		{"negative usage", acme, "/v1/costgate/settle", `{"reservation_id":"` + id + `","usage":{"output_tokens":-1}}`, 400, "invalid_usage"},
		{"requests settled", acme, "/v1/costgate/settle", `{"reservation_id":"` + id + `","usage":{"requests":0}}`, 400, "invalid_usage"},
		{"no usage", acme, "/v1/costgate/settle", `{"reservation_id":"` + id + `"}`, 400, "invalid_body"},
		{"bad status", acme, "/v1/costgate/settle", `{"reservation_id":"` + id + `","usage":{},"status":"free"}`, 400, "invalid_status"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out := reserveCall(t, h, tc.key, tc.path, tc.body)
			if code != tc.status || errCode(out) != tc.code {
				t.Errorf("%d %v; want %d %s", code, out, tc.status, tc.code)
			}
		})
	}
	// The reservation survived every attack: the owner settles it once.
	code, out := reserveCall(t, h, acme, "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":{"usd":"0.30"}}`)
	if code != 200 || out["cost_usd"] != "0.300000000" || out["already_settled"] != false {
		t.Fatalf("settle: %d %v", code, out)
	}
	code, out = reserveCall(t, h, acme, "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":{"usd":"0.01"}}`)
	if code != 200 || out["cost_usd"] != "0.300000000" || out["already_settled"] != true {
		t.Fatalf("second settle: %d %v; want the first's $0.30", code, out)
	}
	// $0.30 of $1.00 spent: 0.70 fits, 0.71 does not.
	if code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.71"}}`); code != 402 {
		t.Errorf("over the budget: %d %v", code, out)
	}
	if code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.70"}}`); code != 200 {
		t.Errorf("the rest of the budget: %d %v", code, out)
	}
	s.srv.WaitIdle(context.Background())
	if err := s.srv.Ledger().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spent, err := s.srv.Ledger().Spend(context.Background(), ledger.SpendQuery{Tenant: "acme", Period: "day"})
	if err != nil || spent != 1_000_000_000 {
		t.Errorf("ledger spend %v (%v), want $1.00: $0.30 settled and $0.70 reserved", spent, err)
	}
}

// FuzzReserveBody: no reserve or settle body crashes or hangs the API, and
// each gets an answer with a status the API documents.
func FuzzReserveBody(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"cost":{"requests":2,"tokens":10,"usd":"0.01"}}`, `{"kind":"chat","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}}`,
		`{"cost":{"usd":"1e9"}}`, `{"ttl":"-1s"}`, `{"route":"\u0000"}`, `[]`, `null`, `{"cost":null}`, `{"reservation_id":"rsv_.","usage":{}}`,
	} {
		f.Add(seed)
	}
	s := newStack(f, "", "")
	h := s.srv.Handler()
	ok := map[int]bool{200: true, 400: true, 402: true, 403: true, 404: true, 409: true, 410: true, 413: true, 429: true, 503: true}
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/costgate/reserve", "/v1/costgate/settle", "/v1/costgate/release"} {
			done := make(chan int, 1)
			go func() {
				code, _ := reserveCall(t, h, "cg-test-acme", path, body)
				done <- code
			}()
			select {
			case code := <-done:
				if !ok[code] {
					t.Errorf("%s %q: status %d", path, body, code)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s %q: no answer in 10 s", path, body)
			}
		}
	})
}

// BenchmarkReservePair compares, in one run and on each store, the CPU of
// a reserve/settle pair over HTTP (request parsing, handler, JSON, signed
// id) with the limiter and ledger stages of one proxied request: what the
// proxy does for it besides forwarding, in its order and by the stages its
// metrics name (identify, estimate, debit and policy, ledger, settle; see
// stages), and with the gate's calls alone (gateCalls: the estimate given,
// no usage to read).
func BenchmarkReservePair(b *testing.B) {
	for _, store := range []string{"memory", "redis"} {
		b.Run(store, func(b *testing.B) { benchReservePair(b, store) })
	}
}

// benchWriter is a ResponseWriter reused from one request to the next, as
// net/http reuses a connection's buffers: a fresh header map for each
// answer (net/http makes one too), the body's buffer kept. Its read and
// write deadlines are set on a real TCP connection, as net/http's
// response sets them on its own: without them http.ResponseController
// answers each call with a new error, a cost the server never pays.
type benchWriter struct {
	h    http.Header
	code int
	body bytes.Buffer
	conn net.Conn
}

func (w *benchWriter) SetReadDeadline(t time.Time) error  { return w.conn.SetReadDeadline(t) }
func (w *benchWriter) SetWriteDeadline(t time.Time) error { return w.conn.SetWriteDeadline(t) }

func (w *benchWriter) Header() http.Header { return w.h }

func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *benchWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

func (w *benchWriter) reset() {
	w.h, w.code = make(http.Header), 0
	w.body.Reset()
}

// loopbackConn is one end of a TCP connection on loopback, closed with
// the benchmark.
func loopbackConn(b *testing.B) net.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); peer.Close() })
	return c
}

// reservationID is the reservation id in a reserve answer, found as a
// caller that wants only it would (the id is base64url and a dot: no
// escapes).
func reservationID(answer []byte) string {
	const key = `"reservation_id":"`
	i := bytes.Index(answer, []byte(key))
	if i < 0 {
		return ""
	}
	rest := answer[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

func benchReservePair(b *testing.B, store string) {
	redisURL := ""
	if store == "redis" {
		redisURL = redistest.New(b).URL
	}
	s := newStack(b, redisURL, `
limits:
  - {name: rpm, dimensions: [tenant], unit: requests, rate: 1000000000, period: 1m}
  - {name: tpm, dimensions: [tenant, model], unit: tokens, rate: 1000000000, period: 1m}
budgets:
  - {name: daily, scope: tenant, amount: "1000000"}
`)
	h := s.srv.Handler()
	type conn struct {
		br *bufio.Reader
		w  benchWriter
	}
	// conns are what a server keeps per connection and reuses from one
	// request to the next: the buffered reader (httptest.NewRequest would
	// allocate 4 KiB for each request) and the answer's buffer.
	tcp := loopbackConn(b)
	conns := sync.Pool{New: func() any { return &conn{br: bufio.NewReader(nil), w: benchWriter{conn: tcp}} }}
	const head = " HTTP/1.1\r\nHost: costgate\r\nAuthorization: Bearer cg-test-acme\r\nContent-Type: application/json\r\nContent-Length: "
	serve := func(b *testing.B, path, body string, check func(code int, answer []byte)) {
		c := conns.Get().(*conn)
		defer conns.Put(c)
		c.br.Reset(strings.NewReader("POST " + path + head + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
		req, err := http.ReadRequest(c.br)
		if err != nil {
			b.Fatal(err)
		}
		req.RemoteAddr = "192.0.2.1:1234"
		c.w.reset()
		h.ServeHTTP(&c.w, req)
		check(c.w.code, c.w.body.Bytes())
	}
	// pair is one reserve/settle pair as a caller makes it. The caller
	// reads only the reservation id from the answer: decoding the rest is
	// its CPU, not costgate's.
	pair := func(b *testing.B) {
		var id string
		serve(b, "/v1/costgate/reserve", `{"cost":{"tokens":100},"model":"gpt-4o-mini"}`, func(code int, answer []byte) {
			if id = reservationID(answer); code != 200 || id == "" {
				b.Fatalf("reserve: %d %s", code, answer)
			}
		})
		serve(b, "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":{"input_tokens":80,"output_tokens":10}}`, func(code int, answer []byte) {
			if code != 200 {
				b.Fatalf("settle: %d %s", code, answer)
			}
		})
	}
	g := s.srv.Gate()
	ctx := context.Background()
	// proxied is one proxied request's limiter and ledger stages, as
	// proxy.Server.serve runs them: identify, prefilter, estimate (the
	// request's body read by the estimator: model, tokens of the prompt,
	// max_tokens), reserve (debit and policy), record, the settlement as
	// soon as the answer's usage is read from it (parse, price, the
	// ledger's record), report, and the settlement on the gate's
	// goroutine, which settled waits for at the end of a block (its CPU
	// counts). With estimate false it is the gate's calls alone: the
	// estimate and the usage given.
	var settled sync.WaitGroup
	proxied := func(b *testing.B, estimate bool) {
		c := g.Identify("cg-test-acme")
		req := &gate.Request{ID: gate.NewID(), Caller: c, Route: "/v1/chat/completions", Upstream: "openai", Requests: 1}
		if d, refused := g.Prefilter(req); refused {
			b.Fatalf("refused: %+v", d)
		}
		req.Estimate = costmodel.Estimate{Model: "gpt-4o-mini", Usage: costmodel.Usage{InputTokens: 100}, Cost: 15000}
		if estimate {
			est, err := c.Estimator().Estimate(costmodel.ChatCompletions, []byte(benchRequest))
			if err != nil {
				b.Fatal(err)
			}
			req.Estimate = est
		}
		res, d := g.Reserve(ctx, req)
		if res == nil {
			b.Fatalf("refused: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			b.Fatal(d)
		}
		ch := gate.Charge{Usage: costmodel.Usage{InputTokens: 80, OutputTokens: 10}, Cost: 18000, HTTPStatus: 200}
		if estimate {
			u, model, err := costmodel.ParseResponse(costmodel.ChatCompletions, []byte(benchReply))
			if err != nil {
				b.Fatal(err)
			}
			ch = gate.Charge{Usage: u, Cost: res.Price(model, u), Model: model, HTTPStatus: 200}
		}
		if err := res.Bill(ctx, ch, false); err != nil {
			b.Fatal(err)
		}
		res.Report(200)
		settled.Add(1)
		res.SettleLater(func() gate.Charge { return ch }, settled.Done)
	}
	stages := func(b *testing.B) { proxied(b, true) }
	gateCalls := func(b *testing.B) { proxied(b, false) }
	// Warm up every path first (the tokenizer's one-time load, pools,
	// prepared statements), so that none pays for it in its CPU.
	for range 100 {
		pair(b)
		stages(b)
		gateCalls(b)
	}
	// drain waits for the work a block left behind (the settlements on
	// the gate's goroutines, the ledger's writes of its entries), so
	// that each block's CPU counts its own and not the last block's.
	drain := func(b *testing.B) {
		settled.Wait()
		if err := s.srv.Ledger().Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	drain(b)
	// report reports the CPU per operation of the pairs, the stages and
	// the gate's calls, and the pair's ratio to each.
	report := func(b *testing.B, n float64, pairCPU, stagesCPU, gateCPU int64) {
		b.ReportMetric(float64(pairCPU)/n, "pair-cpu-ns")
		b.ReportMetric(float64(stagesCPU)/n, "stages-cpu-ns")
		b.ReportMetric(float64(gateCPU)/n, "gate-cpu-ns")
		b.ReportMetric(float64(pairCPU)/float64(stagesCPU), "pair/stages")
		b.ReportMetric(float64(pairCPU)/float64(gateCPU), "pair/gate")
	}
	// alternating runs blocks of pairs, of stages and of the gate's calls
	// in turn, so that a machine's drift during the run weighs on all
	// alike.
	b.Run("alternating", func(b *testing.B) {
		const block = 100
		var cpu [3]int64
		for b.Loop() {
			for i, f := range []func(*testing.B){pair, stages, gateCalls} {
				t0 := processCPU()
				for range block {
					f(b)
				}
				drain(b)
				cpu[i] += processCPU() - t0
			}
		}
		report(b, float64(block*b.N), cpu[0], cpu[1], cpu[2])
	})
	// concurrent is alternating with 8 callers at once, as a service
	// sees them: their Redis calls share script calls, the pairs' as the
	// stages'.
	b.Run("concurrent", func(b *testing.B) {
		const callers, each = 8, 25
		var cpu [3]int64
		for b.Loop() {
			for i, f := range []func(*testing.B){pair, stages, gateCalls} {
				t0 := processCPU()
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						for range each {
							f(b)
						}
					})
				}
				wg.Wait()
				drain(b)
				cpu[i] += processCPU() - t0
			}
		}
		report(b, float64(callers*each*b.N), cpu[0], cpu[1], cpu[2])
	})
	b.Run("http_pair", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			pair(b)
		}
	})
	b.Run("proxy_stages", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			stages(b)
		}
		settled.Wait()
	})
}

// reportCPU reports the process's CPU time per operation (user and
// system, all threads) as cpu-ns/op: on Redis, ns/op is mostly the wait
// for its answers, which costs no CPU here.
func reportCPU(b *testing.B) func() {
	start := processCPU()
	return func() {
		b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
	}
}

// TestReserveNamesAreNoFreshAllowance: limits keyed by route or model
// cannot be dodged through the reserve API by naming a new route or a
// made-up model each time.
func TestReserveNamesAreNoFreshAllowance(t *testing.T) {
	s := newStack(t, "", `
limits:
  - {name: per-route, dimensions: [tenant, route], unit: requests, rate: 2, period: 1h}
  - {name: per-model, dimensions: [tenant, model], unit: requests, rate: 3, period: 1h}
`)
	h := s.srv.Handler()
	for i, want := range []int{200, 200, 429} {
		body := fmt.Sprintf(`{"route":"made-up-%d"}`, i)
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", body); code != want {
			t.Errorf("route made-up-%d: %d %v; want %d", i, code, out, want)
		}
	}
	if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"model":"gpt-4o-mini-made-up"}`); code != 400 || errCode(out) != "unknown_model" {
		t.Errorf("a made-up model: %d %v; want 400 unknown_model", code, out)
	}
	// A route costgate serves is its own allowance, as on the proxy.
	for i, want := range []int{200, 200, 429} {
		code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"route":"/v1/embeddings","model":"gpt-4o-mini"}`)
		if code != want {
			t.Errorf("embeddings %d: %d %v; want %d", i, code, out, want)
		}
	}
}

// TestReserveAttributes: a reservation's custom attributes key the limits
// that name them and reach the policies; bad ones are 400.
func TestReserveAttributes(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: `
limits:
  - {name: per-job, dimensions: [tenant, attr.job], unit: requests, rate: 1, period: 1h}
`, policies: fstest.MapFS{"jobs.rego": {Data: []byte(`package costgate.policies.jobs

import rego.v1

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 403, "reason": "job nightly-export is switched off"} if {
	input.request.attributes.job == "nightly-export"
}
`)}}})
	h := s.srv.Handler()
	reserve := func(attrs string) (int, string) {
		code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"attributes":`+attrs+`}`)
		return code, errCode(out)
	}
	for _, tc := range []struct {
		attrs string
		code  int
		err   string
	}{
		{`{"job":"a"}`, 200, ""},
		{`{"job":"a"}`, 429, "per-job"},
		{`{"job":"b"}`, 200, ""},
		{`{"job":"nightly-export"}`, 403, "jobs"},
		{`{"Job":"a"}`, 400, "invalid_attributes"},
		{`{"job":"x:attr.job=y"}`, 400, "invalid_attributes"},
		{`{"job":"` + strings.Repeat("x", 201) + `"}`, 400, "invalid_attributes"},
	} {
		if code, err := reserve(tc.attrs); code != tc.code || (tc.err != "" && err != tc.err) {
			t.Errorf("attributes %s: %d %s; want %d %s", tc.attrs, code, err, tc.code, tc.err)
		}
	}
}

// TestSettleOutlivesTheCaller: a settle or a release whose caller hangs
// up at once (its request's context ended) still settles: a tenant that
// cuts the connection after sending its usage is charged all of it, on
// the limits as in the ledger.
func TestSettleOutlivesTheCaller(t *testing.T) {
	s := newStack(t, redistest.New(t).URL, `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000, period: 1h}
`)
	h := s.srv.Handler()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	call := func(path, body string) int {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)).WithContext(gone)
		req.Header.Set("Authorization", "Bearer cg-test-acme")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	reserve := func() string {
		code, r := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":100}}`)
		if code != 200 {
			t.Fatalf("reserve: %d %v", code, r)
		}
		id, _ := r["reservation_id"].(string)
		return id
	}
	a, b := reserve(), reserve()
	if code := call("/v1/costgate/settle", `{"reservation_id":"`+a+`","usage":{"input_tokens":300}}`); code != 200 {
		t.Fatalf("settle with the caller gone: %d", code)
	}
	if code := call("/v1/costgate/release", `{"reservation_id":"`+b+`"}`); code != 200 {
		t.Fatalf("release with the caller gone: %d", code)
	}
	g := s.srv.Gate()
	res, d := g.Reserve(context.Background(), &gate.Request{Caller: g.Identify("cg-test-acme"), Route: "/x", States: true,
		Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
	if res != nil {
		res.Cancel(context.Background())
	}
	if len(d.Limits) != 1 || d.Limits[0].Remaining != 1000-300-1 {
		t.Fatalf("tpm after a settle of 300 and a release: %+v; want 300 used", d.Limits)
	}
}

// TestReserveFrictionNotes: the reserve API names the friction it passes
// on as the proxy does: every warning with each policy that asked for
// it, and an action whose policy is not known by itself with the
// deciding policy, never with an empty one.
func TestReserveFrictionNotes(t *testing.T) {
	pols := fstest.MapFS{
		"pace.rego": {Data: []byte(`package costgate.policies.pace

decision := {"outcome": "soft", "reason": "pace", "friction": {"delay_ms": 1, "warning": "slow down"}}
`)},
		"nudge.rego": {Data: []byte(`package costgate.policies.nudge

decision := {"outcome": "soft", "reason": "nudge", "friction": {"warning": "mind the budget", "cap_max_tokens": 8}}
`)},
	}
	s := newStackWith(t, stackOptions{policies: pols, extra: roomyLimits})
	req := httptest.NewRequest(http.MethodPost, "/v1/costgate/reserve", strings.NewReader(`{"cost":{"tokens":10}}`))
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	w := httptest.NewRecorder()
	s.srv.Handler().ServeHTTP(w, req)
	if w.Code != 200 {
		t.Fatalf("reserve: %d %s", w.Code, w.Body)
	}
	got := w.Header().Get("Costgate-Friction")
	t.Logf("Costgate-Friction: %s", got)
	for _, want := range []string{`delay; policy="pace"`, `warn; policy="pace"`, `warn; policy="nudge"`, `cap_max_tokens; policy="nudge"`} {
		if !strings.Contains(got, want) {
			t.Errorf("Costgate-Friction %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, `policy=""`) {
		t.Errorf("Costgate-Friction %q names an empty policy", got)
	}
}
