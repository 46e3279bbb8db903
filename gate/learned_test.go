package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// learnedPolicy shows the learned estimate the policies see as a warning.
const learnedPolicy = `package costgate.policies.show
decision := {"outcome": "soft", "reason": "shown", "friction": {"warning": sprintf("%s %s %d %d", [input.estimate.output_basis, input.estimate.output_quantile, input.estimate.output_samples, input.estimate.output_tokens])}}
`

// openLearnedGate opens a gate that reserves the learned p95 of output
// (20 samples are enough) in dir, on Redis when redisURL is set. Model m1
// costs $1 per million input tokens and $10 per million output tokens.
func openLearnedGate(t *testing.T, dir, redisURL, extra string) *gate.Gate {
	t.Helper()
	return openReserveGate(t, dir, redisURL, "p95", extra)
}

// openReserveGate is openLearnedGate with output_reserve reserve.
func openReserveGate(t *testing.T, dir, redisURL, reserve, extra string, learnedKnobs ...string) *gate.Gate {
	t.Helper()
	pol := filepath.Join(dir, "policies")
	if err := os.MkdirAll(pol, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pol, "show.rego"), []byte(learnedPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	store := ""
	if redisURL != "" {
		store = fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}\n", redisURL)
	}
	return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
%spolicies: {dir: %q}
costs:
  output_reserve: %s
  learned: {min_samples: 20, interval: 1h%s}
  prices: {m1: {input: "1.00", output: "10.00", max_output_tokens: 4096}}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
  - {name: globex, plan: small, keys: [{id: globex-key, key: cg-globex}]}
%s`, dir, store, pol, reserve, strings.Join(append([]string{""}, learnedKnobs...), ", "), extra))
}

// chatRequest is a chat request of tenant key with max_tokens maxTokens.
func chatRequest(t *testing.T, g *gate.Gate, key string, maxTokens int) *gate.Request {
	t.Helper()
	c := g.Identify(key)
	est, err := c.Estimator().Estimate(costmodel.ChatCompletions, fmt.Appendf(nil,
		`{"model":"m1","max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`, maxTokens))
	if err != nil {
		t.Fatal(err)
	}
	return &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: est}
}

// serve reserves req, records it and settles it at out output tokens.
func serve(t *testing.T, g *gate.Gate, req *gate.Request, out int64) (reserved int64, d gate.Decision) {
	t.Helper()
	ctx := context.Background()
	res, d := g.Reserve(ctx, req)
	if res == nil {
		return 0, d
	}
	if _, ok := res.Record(ctx); !ok {
		t.Fatal("record refused")
	}
	reserved = res.Request().Estimate.Usage.OutputTokens
	u := costmodel.Usage{InputTokens: req.Estimate.Usage.InputTokens, OutputTokens: out}
	res.Settle(ctx, gate.Charge{Usage: u, Cost: res.Price("m1", u), HTTPStatus: 200})
	return reserved, d
}

func TestLearnedReservationAfterEnoughSamples(t *testing.T) {
	g := openLearnedGate(t, t.TempDir(), "", "")
	// A cold key falls back to the whole output limit.
	for i := range 20 {
		reserved, d := serve(t, g, chatRequest(t, g, "cg-acme", 1000), 100+int64(i))
		if reserved != 1000 {
			t.Fatalf("request %d of a cold key reserved %d output tokens, want max_tokens 1000", i, reserved)
		}
		if w, want := d.Friction.Warning, fmt.Sprintf("limit p95 %d 1000", i); w != want {
			t.Fatalf("input.estimate of a cold key: %q, want %q", w, want)
		}
	}
	reserved, d := serve(t, g, chatRequest(t, g, "cg-acme", 1000), 100)
	if reserved < 117 || reserved > 121 { // the p95 of 100..119 is 119, within 1%
		t.Fatalf("after 20 samples reserved %d output tokens, want the p95, about 119", reserved)
	}
	if w, want := d.Friction.Warning, fmt.Sprintf("learned p95 20 %d", reserved); w != want {
		t.Fatalf("input.estimate: %q, want %q", w, want)
	}
	// Another shape, another tenant, a request without max_tokens: cold.
	for _, c := range []struct {
		key string
		max int
	}{{"cg-acme", 2000}, {"cg-globex", 1000}} {
		if reserved, _ := serve(t, g, chatRequest(t, g, c.key, c.max), 100); reserved != int64(c.max) {
			t.Errorf("%s max_tokens %d reserved %d: learned from another key", c.key, c.max, reserved)
		}
	}
	// Failed answers teach nothing.
	ctx := context.Background()
	before := g.Learned().Stats()
	req := chatRequest(t, g, "cg-globex", 1000)
	for range 30 {
		res, _ := g.Reserve(ctx, req)
		res.Settle(ctx, gate.Charge{Status: ledger.StatusFailed, HTTPStatus: 500})
		res, _ = g.Reserve(ctx, req)
		res.Settle(ctx, gate.Charge{Usage: costmodel.Usage{OutputTokens: 1}, HTTPStatus: 429})
		res, _ = g.Reserve(ctx, req)
		res.Cancel(ctx)
		res.Settle(ctx, gate.Charge{Usage: costmodel.Usage{OutputTokens: 1}, HTTPStatus: 200})
	}
	if reserved, _ := serve(t, g, req, 5); reserved != 1000 {
		t.Fatalf("globex learned from failed answers: reserved %d", reserved)
	}
	if after := g.Learned().Stats(); after.Keys != before.Keys {
		t.Logf("keys %d -> %d", before.Keys, after.Keys)
	}
}

func TestLearnedPersistsAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	g := openLearnedGate(t, dir, "", "")
	for range 40 {
		serve(t, g, chatRequest(t, g, "cg-acme", 1000), 300)
	}
	first, _ := serve(t, g, chatRequest(t, g, "cg-acme", 1000), 300)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	g2 := openLearnedGate(t, dir, "", "")
	again, _ := serve(t, g2, chatRequest(t, g2, "cg-acme", 1000), 300)
	if again != first || again > 303 {
		t.Fatalf("after a restart reserved %d, before %d", again, first)
	}
}

func TestLearnedBadFileStartsCold(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "learned.json"), []byte(`{"version":1,"relative_error":0.01,"keys":[{"tenant":`), 0o600); err != nil {
		t.Fatal(err)
	}
	g := openLearnedGate(t, dir, "", "")
	if reserved, _ := serve(t, g, chatRequest(t, g, "cg-acme", 1000), 300); reserved != 1000 {
		t.Fatalf("reserved %d from a truncated file", reserved)
	}
	if _, err := os.Stat(filepath.Join(dir, "learned.json.bad")); err != nil {
		t.Fatalf("the bad file was not moved aside: %v", err)
	}
}

func TestLearnedMergesAcrossReplicas(t *testing.T) {
	srv := redistest.New(t)
	url := srv.URL
	a := openLearnedGate(t, t.TempDir(), url, "")
	b := openLearnedGate(t, t.TempDir(), url, "")
	ctx := context.Background()
	for i := range 10 {
		serve(t, a, chatRequest(t, a, "cg-acme", 1000), 200)
		if reserved, _ := serve(t, b, chatRequest(t, b, "cg-acme", 1000), 400); reserved != 1000 {
			t.Fatalf("b request %d reserved %d with 10 samples per replica", i, reserved)
		}
	}
	for _, g := range []*gate.Gate{a, b, a} {
		if err := g.Learned().Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []*gate.Gate{a, b} {
		if reserved, d := serve(t, g, chatRequest(t, g, "cg-acme", 1000), 300); reserved < 396 || reserved > 404 || !strings.HasPrefix(d.Friction.Warning, "learned p95 20 ") {
			t.Fatalf("after a sync reserved %d (%q), want the merged p95, 400", reserved, d.Friction.Warning)
		}
	}
}

// What a learned reservation leaves unreserved is given back however it
// ends: settled, cancelled, refused by a limit, or refused by a policy.
func TestLearnedExposureIsGivenBack(t *testing.T) {
	g := openReserveGate(t, t.TempDir(), "", "p95", `limits:
  - {name: two-in-flight, dimensions: [tenant], algorithm: concurrency, rate: 2, period: 1m}
`, `max_exposure: "0.011"`) // one learned reservation of max_tokens 1000 (about $0.0098 unreserved)
	ctx := context.Background()
	for range 25 {
		serve(t, g, chatRequest(t, g, "cg-acme", 1000), 10)
	}
	learnedNow := func() (*gate.Reservation, bool) {
		t.Helper()
		res, _ := g.Reserve(ctx, chatRequest(t, g, "cg-acme", 1000))
		if res == nil {
			return nil, false
		}
		return res, res.Request().Estimate.Usage.OutputTokens < 1000
	}
	for i := range 5 {
		a, ok := learnedNow()
		if !ok {
			t.Fatalf("round %d: the first reservation is not learned: exposure was not given back", i)
		}
		b, ok := learnedNow()
		if b == nil || ok {
			t.Fatalf("round %d: a second learned reservation passed max_exposure", i)
		}
		// The concurrency limit refuses a third: its exposure, if any,
		// must come back too.
		if c, _ := learnedNow(); c != nil {
			t.Fatalf("round %d: a third request in flight admitted", i)
		}
		switch i % 3 {
		case 0:
			a.Cancel(ctx)
		case 1:
			u := costmodel.Usage{OutputTokens: 5000}
			a.Settle(ctx, gate.Charge{Usage: u, Cost: a.Price("m1", u), HTTPStatus: 200})
		case 2:
			a.Settle(ctx, gate.Charge{Status: ledger.StatusFailed, HTTPStatus: 502})
		}
		b.Cancel(ctx)
	}
}

// The learned reservations and their overruns are counted in /metrics.
func TestLearnedMetrics(t *testing.T) {
	g := openLearnedGate(t, t.TempDir(), "", "")
	for range 20 {
		serve(t, g, chatRequest(t, g, "cg-acme", 1000), 100)
	}
	reserved, _ := serve(t, g, chatRequest(t, g, "cg-acme", 1000), 900) // beyond the learned p95, about 100
	rec := httptest.NewRecorder()
	g.Telemetry().MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`costgate_learned_reservations_total{basis="fallback"`, `costgate_learned_reservations_total{basis="learned"`,
		"costgate_learned_overruns_total", "costgate_learned_overrun_tokens_total",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, line := range strings.Split(body, "\n") {
		if want := fmt.Sprintf(" %d", 900-reserved); strings.HasPrefix(line, "costgate_learned_overrun_tokens_total") && !strings.HasSuffix(line, want) {
			t.Errorf("overrun tokens: %q, want%s (900 less the %d reserved)", line, want, reserved)
		}
		if strings.HasPrefix(line, "costgate_learned_overruns_total") && !strings.HasSuffix(line, " 1") {
			t.Errorf("overruns: %q, want 1", line)
		}
	}
}
