package telemetry

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestLabelSet(t *testing.T) {
	long := strings.Repeat("€", 100) // 3 bytes a rune: 128 bytes cut the 43rd
	tests := []struct {
		name     string
		values   []string
		wantName []string // label value of each, in order
	}{
		{"first come", []string{"a", "b", "a"}, []string{"a", "b", "a"}},
		{"fold past max", []string{"a", "b", "c", "d", "a"}, []string{"a", "b", "c", Other, "a"}},
		{"empty is none", []string{"", "a"}, []string{None, "a"}},
		{"other stays other", []string{Other, "a"}, []string{Other, "a"}},
		{"invalid UTF-8 cleaned", []string{"m\xff", "m\xfe"}, []string{"m\uFFFD", "m\uFFFD"}},
		{"long cut", []string{long}, []string{strings.Repeat("€", 42) + "\uFFFD"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLabelSet(3)
			for i, v := range tc.values {
				got := l.name(l.id(v))
				if got != tc.wantName[i] {
					t.Errorf("value %d %q: label %q, want %q", i, v, got, tc.wantName[i])
				}
				if !utf8.ValidString(got) || len(got) > MaxLabelLen+2 {
					t.Errorf("label %q is not clean", got)
				}
				// A second sighting is a fast-path hit with the same id.
				if id, ok := (*l.ids.Load())[v]; v != "" && (!ok || l.name(id) != got) {
					t.Errorf("value %q not remembered (ok=%v)", v, ok)
				}
			}
		})
	}
}

// TestLabelSetAliasesBounded feeds far more distinct folded values than the
// alias budget and checks that the map stops growing and ids stay right.
func TestLabelSetAliasesBounded(t *testing.T) {
	l := newLabelSet(2)
	for i := range aliasBudget * 2 {
		if id := l.id(fmt.Sprintf("v%d", i)); (i < 2 && id != i) || (i >= 2 && id != 2) {
			t.Fatalf("v%d: id %d", i, id)
		}
	}
	if n := len(*l.ids.Load()); n > 2+aliasBudget+1 {
		t.Fatalf("map has %d entries, want at most %d", n, 2+aliasBudget+1)
	}
	if l.id("v0") != 0 || l.id("v1") != 1 || l.id("v99999") != 2 {
		t.Fatal("ids changed")
	}
	// Saturated, a clean value never seen is Other without the lock (a
	// long tail of tenants must not serialize every request on it); one
	// that needs cleaning still finds its cleaned value's id.
	l.mu.Lock()
	got := make(chan int, 1)
	go func() { got <- l.id("never-seen") }()
	select {
	case id := <-got:
		if id != 2 {
			t.Errorf("a new clean value once saturated: id %d, want Other's", id)
		}
	case <-time.After(5 * time.Second):
		t.Error("a new clean value once saturated waited for the lock")
	}
	l.mu.Unlock()
	if id := l.id("v0\xff"); id != 2 {
		t.Errorf("a value cleaned to a folded one: id %d, want Other's", id)
	}
	m := newLabelSet(2)
	m.id("a\uFFFD")
	for i := range aliasBudget * 2 {
		m.id(fmt.Sprintf("w%d", i))
	}
	if id := m.id("a\xff"); id != 0 {
		t.Errorf("a value that cleans to a known one, once saturated: id %d, want 0", id)
	}
}

// TestScrapeSurvivesBadLabels: one invalid UTF-8 label value would fail the
// whole Prometheus scrape.
func TestScrapeSurvivesBadLabels(t *testing.T) {
	tm := newTelemetry(t, Config{})
	tm.Usage("acme\xfe", "bad\xffmodel\"\n{}", 1, 1, 1)
	tm.Decision(context.Background(), Decision{Tenant: "t", Policy: "p\xff", Route: strings.Repeat("r", 10000), Outcome: "allow", Status: 200})
	fams := scrape(t, tm)
	if got := value(t, fams, "gen_ai_client_token_usage", L{"gen_ai_token_type": "input", "gen_ai_request_model": "bad\uFFFDmodel\"\n{}"}); got != 1 {
		t.Errorf("token usage for the cleaned model = %v", got)
	}
	if got := value(t, fams, "costgate_spend_nano_usd_total", L{"tenant": "acme\uFFFD"}); got != 1 {
		t.Errorf("spend for the cleaned tenant = %v", got)
	}
	if got := value(t, fams, "costgate_requests_total", L{"policy": "p\uFFFD", "route": strings.Repeat("r", MaxLabelLen), "outcome": "allow", "status": "200"}); got != 1 {
		t.Errorf("requests with a cleaned policy and a cut route = %v", got)
	}
}
