package telemetry

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

func TestSeriesBuckets(t *testing.T) {
	clock := newFakeClock() // 10:00:00
	tm := newTelemetry(t, Config{Now: clock.Now})
	ctx := context.Background()
	decide := func(tenant, policy, outcome string) {
		tm.Decision(ctx, Decision{Tenant: tenant, Policy: policy, Outcome: Outcome(outcome), Status: 200})
	}

	decide("acme", "plans", "allow")
	decide("acme", "plans", "allow")
	tm.Usage("acme", "m", 1, 1, 100)
	clock.Advance(59 * time.Second) // 10:00:59, same minute
	decide("beta", "plans", "hard")
	tm.Usage("beta", "m", 1, 1, 7)
	clock.Advance(time.Second) // 10:01:00
	decide("acme", "budget", "soft")
	tm.Usage("acme", "m", 1, 1, 50)
	tm.ShadowWouldBlock("plans", "per-ip", "acme") // not a request

	s := tm.Series()
	if want := time.Date(2026, 11, 30, 9, 2, 0, 0, time.UTC); !s.Start.Equal(want) {
		t.Fatalf("Start = %v, want %v", s.Start, want)
	}
	last, prev := SeriesMinutes-1, SeriesMinutes-2
	if s.Requests[prev] != 3 || s.Requests[last] != 1 {
		t.Fatalf("Requests tail = %v, want [... 3 1]", s.Requests[prev:])
	}
	if got := s.SpendNanoUSD["acme"]; got[prev] != 100 || got[last] != 50 {
		t.Errorf("acme spend tail = %v", got[prev:])
	}
	if got := s.SpendNanoUSD["beta"]; got[prev] != 7 || got[last] != 0 {
		t.Errorf("beta spend tail = %v", got[prev:])
	}
	if got := s.RequestsByTenant["acme"]; got[prev] != 2 || got[last] != 1 {
		t.Errorf("acme requests tail = %v", got[prev:])
	}
	wantDec := []struct {
		policy, outcome string
		prev, last      int64
	}{
		{"budget", "soft", 0, 1},
		{"plans", "allow", 2, 0},
		{"plans", "hard", 1, 0},
		{"plans", "shadow", 0, 1},
	}
	if len(s.Decisions) != len(wantDec) {
		t.Fatalf("Decisions = %+v", s.Decisions)
	}
	for i, w := range wantDec {
		d := s.Decisions[i]
		if d.Policy != w.policy || d.Outcome != w.outcome || d.Counts[prev] != w.prev || d.Counts[last] != w.last || len(d.Counts) != SeriesMinutes {
			t.Errorf("Decisions[%d] = %s/%s %v, want %+v", i, d.Policy, d.Outcome, d.Counts[prev:], w)
		}
	}

	// 58 minutes later the 10:00 bucket is the oldest; one more minute and
	// it is gone, and its ring slot is reused for 11:00 without leaking.
	clock.Advance(58 * time.Minute) // 10:59:00
	s = tm.Series()
	if s.Requests[0] != 3 || s.Requests[1] != 1 {
		t.Fatalf("at 10:59 Requests head = %v, want [3 1 ...]", s.Requests[:2])
	}
	clock.Advance(time.Minute) // 11:00:00
	decide("acme", "plans", "allow")
	s = tm.Series()
	if s.Requests[0] != 1 || s.Requests[last] != 1 {
		t.Fatalf("at 11:00 Requests = head %v tail %v, want 1 and 1", s.Requests[:1], s.Requests[last:])
	}
	var total int64
	for _, v := range s.Requests {
		total += v
	}
	if total != 2 {
		t.Fatalf("at 11:00 total = %d, want 2 (10:01 and 11:00)", total)
	}
	if _, ok := s.SpendNanoUSD["beta"]; ok {
		t.Errorf("beta's spend from 10:00 still shown at 11:00")
	}

	// After two idle hours everything is empty, and the JSON shape holds.
	clock.Advance(2 * time.Hour)
	s = tm.Series()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"start", "requests", "requests_by_tenant", "spend_nano_usd", "decisions"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, b)
		}
	}
	if len(s.Decisions) != 0 || len(s.SpendNanoUSD) != 0 {
		t.Errorf("after two idle hours: %+v", s)
	}
}

func TestShadow(t *testing.T) {
	clock := newFakeClock()
	tm := newTelemetry(t, Config{Window: 5 * time.Minute, Now: clock.Now})
	ctx := context.Background()
	// The drill: a shadow policy that would block 40% of acme's traffic.
	for i := range 100 {
		tm.Decision(ctx, Decision{Tenant: "acme", Policy: "plans", Outcome: "allow", Status: 200})
		if i%5 < 2 {
			tm.Decision(ctx, Decision{Tenant: "acme", Policy: "new-abuse", Limit: "per-ip", Outcome: "hard", Status: 429, Shadow: true})
		}
		if i%10 == 0 {
			tm.Decision(ctx, Decision{Tenant: "beta", Policy: "plans", Outcome: "allow", Status: 200})
			tm.ShadowWouldBlock("new-abuse", "per-ip", "beta")
		}
	}
	got := tm.Shadow()
	if len(got) != 1 {
		t.Fatalf("Shadow() = %+v, want one policy/limit", got)
	}
	sc := got[0]
	if sc.Policy != "new-abuse" || sc.Limit != "per-ip" || sc.WouldBlock != 50 || sc.WouldBlockRecent != 50 || sc.WindowSeconds != 300 {
		t.Fatalf("Shadow()[0] = %+v", sc)
	}
	want := []ShadowTenant{
		{Tenant: "acme", WouldBlock: 40, WouldBlockRecent: 40, Requests: 100, RequestsRecent: 100},
		{Tenant: "beta", WouldBlock: 10, WouldBlockRecent: 10, Requests: 10, RequestsRecent: 10},
	}
	if len(sc.Tenants) != 2 || sc.Tenants[0] != want[0] || sc.Tenants[1] != want[1] {
		t.Fatalf("Tenants = %+v, want %+v", sc.Tenants, want)
	}

	// Four minutes on, still in the window; six minutes on, only the totals
	// since start remain.
	clock.Advance(4 * time.Minute)
	tm.ShadowWouldBlock("new-abuse", "per-ip", "acme")
	sc = tm.Shadow()[0]
	if sc.WouldBlock != 51 || sc.WouldBlockRecent != 51 {
		t.Fatalf("at +4m: %+v", sc)
	}
	clock.Advance(2 * time.Minute)
	sc = tm.Shadow()[0]
	if sc.WouldBlock != 51 || sc.WouldBlockRecent != 1 || sc.Tenants[0].WouldBlockRecent != 1 || sc.Tenants[0].RequestsRecent != 0 || sc.Tenants[0].Requests != 100 {
		t.Fatalf("at +6m: %+v", sc)
	}
	// Shadow verdicts are not requests.
	fams := scrape(t, tm)
	if got := value(t, fams, "costgate_requests_total", L{"policy": "plans", "outcome": "allow", "status": "200", "route": "none"}); got != 110 {
		t.Errorf("requests = %v, want 110", got)
	}
	if findSeries(fams, "costgate_requests_total", L{"policy": "new-abuse", "outcome": "hard", "status": "429", "route": "none"}) != nil {
		t.Errorf("a shadow verdict was counted as a request")
	}
}
