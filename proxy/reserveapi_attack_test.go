package proxy_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// replicaPair starts two costgate replicas on one Redis that share the
// reservation secret, with the given limits YAML.
func replicaPair(t *testing.T, limits string) (a, b *stack) {
	t.Helper()
	url := redistest.New(t).URL
	extra := "\nreservations:\n  secret: \"replicas-share-this-secret-0123\"\n" + limits
	return newStack(t, url, extra), newStack(t, url, extra)
}

// reserveOn reserves body for key on s and returns the reservation id.
func reserveOn(t *testing.T, s *stack, key, body string) string {
	t.Helper()
	code, r := reserveCall(t, s.srv.Handler(), key, "/v1/costgate/reserve", body)
	if code != 200 {
		t.Fatalf("reserve %s: %d %v", body, code, r)
	}
	id, _ := r["reservation_id"].(string)
	return id
}

// TestReserveAPIAttackTicketTampered: a reservation id is a signed ticket
// that any replica sharing the secret rebuilds without a lookup. Another
// tenant who learns the id cannot settle or release it on either replica
// (on the one that did not make it, the ticket is rebuilt, not found in
// memory), and an id whose payload is altered (another tenant, a smaller
// cost, a later expiry) or spliced with another ticket's signature is
// unknown everywhere. None of it moves the limits: the owner then settles
// the reservation once, on the other replica.
func TestReserveAPIAttackTicketTampered(t *testing.T) {
	a, b := replicaPair(t, `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 100000, period: 24h}
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`)
	const acme, globex = "cg-test-acme", "cg-test-globex"
	id := reserveOn(t, a, acme, `{"cost":{"tokens":1000,"usd":"0.50"}}`)
	other := reserveOn(t, a, globex, `{"cost":{"tokens":10,"usd":"0.01"}}`)

	p64, s64, ok := strings.Cut(strings.TrimPrefix(id, "rsv_"), ".")
	if !ok {
		t.Fatalf("id %q is not rsv_PAYLOAD.SIG", id)
	}
	_, os64, _ := strings.Cut(strings.TrimPrefix(other, "rsv_"), ".")
	enc := base64.RawURLEncoding
	payload, err := enc.DecodeString(p64)
	if err != nil {
		t.Fatal(err)
	}
	// alter returns id with its payload's member name set to v, the
	// signature kept.
	alter := func(name string, v any) string {
		var m map[string]any
		if err := json.Unmarshal(payload, &m); err != nil {
			t.Fatal(err)
		}
		m[name] = v
		p, _ := json.Marshal(m)
		return "rsv_" + enc.EncodeToString(p) + "." + s64
	}
	// The same bytes with the tenant replaced in place: the id stays first.
	inPlace := "rsv_" + enc.EncodeToString([]byte(strings.Replace(string(payload), `"t":"acme"`, `"t":"globex"`, 1))) + "." + s64

	type attempt struct {
		name, key, id string
	}
	attempts := []attempt{
		{"another tenant, same id", globex, id},
		{"tenant altered in place", globex, inPlace},
		{"tenant altered", globex, alter("t", "globex")},
		{"cost altered", acme, alter("c", 1)},
		{"expiry altered", acme, alter("ex", time.Now().Add(100*24*time.Hour).UnixMicro())},
		{"items dropped", acme, alter("it", []any{})},
		{"signature of another ticket", acme, "rsv_" + p64 + "." + os64},
		{"signature padded", acme, id + "="},
		{"signature in standard base64", acme, "rsv_" + p64 + "." + strings.NewReplacer("-", "+", "_", "/").Replace(s64) + "A"},
		{"prefix in upper case", acme, "RSV_" + strings.TrimPrefix(id, "rsv_")},
	}
	for _, at := range attempts {
		for name, s := range map[string]*stack{"maker": a, "other replica": b} {
			h := s.srv.Handler()
			for _, call := range []struct{ path, body string }{
				{"/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"usd":"0"}}`, at.id)},
				{"/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, at.id)},
			} {
				if code, out := reserveCall(t, h, at.key, call.path, call.body); code != 404 || errCode(out) != "unknown_reservation" {
					t.Errorf("%s on the %s, %s: %d %v; want 404 unknown_reservation", at.name, name, call.path, code, out)
				}
			}
		}
	}
	// The reservation is intact: its owner settles it on the other
	// replica, and the maker is told so.
	code, out := reserveCall(t, b.srv.Handler(), acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":300,"usd":"0.20"}}`, id))
	if code != 200 || out["already_settled"] != false || out["cost_usd"] != "0.200000000" {
		t.Fatalf("owner's settle on the other replica: %d %v", code, out)
	}
	code, out = reserveCall(t, a.srv.Handler(), acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"usd":"0"}}`, id))
	if code != 200 || out["already_settled"] != true || out["cost_usd"] != "0.200000000" {
		t.Errorf("second settle on the maker: %d %v; want the first's $0.20, already settled", code, out)
	}
	if left := limitsLeft(t, a); len(left) != 2 || left[0] != 100000-300 || left[1] != 800_000_000 {
		t.Errorf("acme's tpm and budget left %v; want [99700 800000000]", left)
	}
}

// TestReserveAPIAttackHostileAmounts: amounts that are not exact integers
// or exact decimal dollars (NaN, infinities, exponents, hex, signs, digits
// of other scripts, 64-bit overflow, strings for numbers) are 400 on
// reserve and on settle; they neither reserve nor end a reservation, which
// then settles once at what its owner reports.
func TestReserveAPIAttackHostileAmounts(t *testing.T) {
	s := newStack(t, "", `
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`)
	h := s.srv.Handler()
	const acme = "cg-test-acme"
	id := reserveOn(t, s, acme, `{"cost":{"usd":"0.40"}}`)
	amounts := []string{
		`"usd":"NaN"`, `"usd":"Inf"`, `"usd":"-Inf"`, `"usd":"1e308"`, `"usd":"1e-3"`, `"usd":"0x10"`,
		`"usd":"+0.5"`, `"usd":"0.5.1"`, `"usd":"1_000"`, `"usd":"\u0661"`, `"usd":"."`, `"usd":"-"`, `"usd":"$"`,
		`"usd":"9223372037"`, `"usd":"18446744073709551616"`, `"usd":"-0.000000001"`, `"usd":"$-1"`, `"usd":"- 1"`,
		`"usd":0.5`, `"usd":["1"]`,
		`"tokens":1e3`, `"tokens":1.0`, `"tokens":-1`, `"tokens":9223372036854775808`, `"tokens":"5"`, `"tokens":true`,
		`"output_tokens":-9223372036854775808`, `"input_tokens":1E2`, `"units":0.5`,
		`"input_tokens":9223372036854775807`, `"input_tokens":9223372036854775806,"output_tokens":9`,
	}
	for _, a := range amounts {
		if code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"model":"gpt-4o-mini","cost":{`+a+`}}`); code != 400 {
			t.Errorf("reserve with %s: %d %v; want 400", a, code, out)
		}
		if code, out := reserveCall(t, h, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"model":"gpt-4o-mini","usage":{%s}}`, id, a)); code != 400 {
			t.Errorf("settle with %s: %d %v; want 400", a, code, out)
		}
	}
	code, out := reserveCall(t, h, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"usd":"0.25"}}`, id))
	if code != 200 || out["already_settled"] != false || out["cost_usd"] != "0.250000000" {
		t.Fatalf("owner's settle after the attempts: %d %v", code, out)
	}
	if code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.750000001"}}`); code != 402 {
		t.Errorf("over the $0.75 left: %d %v; want 402", code, out)
	}
	if code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.75"}}`); code != 200 {
		t.Errorf("the $0.75 left: %d %v; want 200", code, out)
	}
}

// TestReserveAPIAttackOverspendCharged: a settlement far above its
// reservation is billed whole in the ledger and fills the limits it
// exceeds: the tenant cannot reserve again until they refill. On each
// store.
func TestReserveAPIAttackOverspendCharged(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		s := newStack(t, url, `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000, period: 24h}
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`)
		h := s.srv.Handler()
		const acme = "cg-test-acme"
		id := reserveOn(t, s, acme, `{"cost":{"tokens":10,"usd":"0.10"}}`)
		code, out := reserveCall(t, h, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":50000,"usd":"5.00"}}`, id))
		if code != 200 || out["cost_usd"] != "5.000000000" {
			t.Fatalf("settle of $5 on a $0.10 reservation: %d %v", code, out)
		}
		if code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"usd":"0.000000001","tokens":1}}`); code != 402 && code != 429 {
			t.Errorf("a reserve after overspending the budget: %d %v; want 402 or 429 (tpm is spent too)", code, out)
		}
		if left := limitsLeft(t, s); len(left) != 2 || left[0] != 0 || left[1] != 0 {
			t.Errorf("tpm and budget left %v after overspending both; want [0 0]", left)
		}
		if code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"tokens":1}}`); code != 429 {
			t.Errorf("a reserve after overspending tpm: %d %v; want 429", code, out)
		}
		var billed costmodel.NanoUSD
		for _, e := range s.entries(t) {
			if e.Status != ledger.StatusFailed {
				billed += e.ActualCost
			}
		}
		if billed != 5*costmodel.Dollar {
			t.Errorf("ledger bills %v; want the $5.00 reported", billed)
		}
	})
}

// TestReserveAPIAttackExpiredIsCharged: a reservation left to expire is
// charged its estimate; a settle or a release after its expiry is 410 and
// refunds nothing, on the replica that made it and on another.
func TestReserveAPIAttackExpiredIsCharged(t *testing.T) {
	a, b := replicaPair(t, `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 100000, period: 24h}
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`)
	const acme = "cg-test-acme"
	code, r := reserveCall(t, a.srv.Handler(), acme, "/v1/costgate/reserve", `{"cost":{"tokens":500,"usd":"0.40"},"ttl":"1s"}`)
	if code != 200 {
		t.Fatalf("reserve: %d %v", code, r)
	}
	id, _ := r["reservation_id"].(string)
	exp, err := time.Parse(time.RFC3339Nano, r["expires_at"].(string))
	if err != nil {
		t.Fatal(err)
	}
	for time.Now().Before(exp.Add(1500 * time.Millisecond)) {
		time.Sleep(20 * time.Millisecond) // polls the wall clock past the expiry and the maker's next expiry pass
	}
	for name, s := range map[string]*stack{"maker": a, "other replica": b} {
		h := s.srv.Handler()
		if code, out := reserveCall(t, h, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"usd":"0","tokens":0}}`, id)); code != 410 {
			t.Errorf("settle at $0 after the expiry on the %s: %d %v; want 410", name, code, out)
		}
		if code, out := reserveCall(t, h, acme, "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, id)); code != 410 {
			t.Errorf("release after the expiry on the %s: %d %v; want 410", name, code, out)
		}
	}
	if left := limitsLeft(t, b); len(left) != 2 || left[0] != 100000-500 || left[1] != 600_000_000 {
		t.Errorf("tpm and budget left %v; want the estimate charged: [99500 600000000]", left)
	}
}

// TestReserveAPIAttackSettleRacesExpiryAcrossReplicas: settles sent to
// the replica that did not make a reservation, at the moment the maker
// expires it, end it once: a settle answered 200 (not already settled) was
// the end, and the limit moves by its usage; one answered 410 lost to the
// expiry, and the limit moves by the estimate. Never both, never neither.
func TestReserveAPIAttackSettleRacesExpiryAcrossReplicas(t *testing.T) {
	a, b := replicaPair(t, `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 10000000, period: 24h}
`)
	const acme, n = "cg-test-acme", 24
	type held struct {
		id  string
		exp time.Time
	}
	hs := make([]held, n)
	for i := range hs {
		code, r := reserveCall(t, a.srv.Handler(), acme, "/v1/costgate/reserve", `{"cost":{"tokens":100},"ttl":"1s"}`)
		if code != 200 {
			t.Fatalf("reserve: %d %v", code, r)
		}
		exp, err := time.Parse(time.RFC3339Nano, r["expires_at"].(string))
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = held{r["reservation_id"].(string), exp}
	}
	codes := make([][2]int, n)
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Go(func() {
			// Spread over 60 ms either side of the expiry.
			time.Sleep(time.Until(h.exp.Add(time.Duration(i*5-60) * time.Millisecond)))
			body := fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":30}}`, h.id)
			var mu sync.Mutex
			var in sync.WaitGroup
			for j, s := range []*stack{b, b} {
				in.Go(func() {
					code, out := reserveCall(t, s.srv.Handler(), acme, "/v1/costgate/settle", body)
					if code == 200 && out["already_settled"] == false {
						code = 201 // the first end
					}
					mu.Lock()
					codes[i][j] = code
					mu.Unlock()
				})
			}
			in.Wait()
		})
	}
	wg.Wait()
	time.Sleep(2500 * time.Millisecond) // the maker's expiry passes run (one a second)
	var want int64
	for i, c := range codes {
		switch {
		case c == [2]int{201, 200} || c == [2]int{200, 201}:
			want += 30
		case c == [2]int{410, 410}:
			want += 100
		default:
			t.Errorf("reservation %d: settles answered %v; want one first settle and one already settled, or two 410", i, c)
		}
		// A later settle on the maker agrees.
		code, out := reserveCall(t, a.srv.Handler(), acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":0}}`, hs[i].id))
		if (c[0] == 410) != (code == 410) || code == 200 && out["already_settled"] != true {
			t.Errorf("reservation %d: a later settle on the maker %d %v after %v", i, code, out, c)
		}
	}
	if left := limitsLeft(t, a); len(left) != 1 || left[0] != 10000000-want {
		t.Errorf("tpm left %v; want %d used", left, want)
	}
}

// TestReserveAPIAttackLargeTicketSettles: a reservation the API admits
// can be settled: its id, however many limits and attributes key it,
// is one that settle and release accept.
func TestReserveAPIAttackLargeTicketSettles(t *testing.T) {
	var dims, attrs []string
	for i := range 16 {
		dims = append(dims, fmt.Sprintf("attr.a%d", i))
		attrs = append(attrs, fmt.Sprintf(`"a%d":%q`, i, strings.Repeat(string(rune('a'+i)), 200)))
	}
	limits := "\nlimits:\n"
	for i := range 4 {
		limits += fmt.Sprintf("  - {name: by-attrs-%d, dimensions: [tenant, %s], unit: tokens, algorithm: fixed_window, rate: 1000, period: 24h}\n", i, strings.Join(dims, ", "))
	}
	s := newStack(t, "", limits)
	h := s.srv.Handler()
	code, r := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":100},"attributes":{`+strings.Join(attrs, ",")+`}}`)
	if code != 200 {
		t.Fatalf("reserve: %d %v", code, r)
	}
	id, _ := r["reservation_id"].(string)
	t.Logf("reservation id of %d bytes", len(id))
	if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":10}}`, id)); code != 200 {
		t.Errorf("settle of a reservation the API admitted: %d %v; want 200", code, out)
	}
}

// TestReserveAPIAttackHeldSlotEndsAtExpiry: a reservation held open and
// never settled keeps its concurrency slot no longer than its ttl (at
// most reservations.max_ttl): once it expires the slot comes back, and
// its estimate is charged.
func TestReserveAPIAttackHeldSlotEndsAtExpiry(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		s := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, extra: `
limits:
  - {name: one-at-a-time, dimensions: [tenant], unit: requests, algorithm: concurrency, rate: 1, period: 1s}
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 100000, period: 24h}
`})
		h := s.srv.Handler()
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":700},"ttl":"2h"}`); code != 400 || errCode(out) != "invalid_ttl" {
			t.Errorf("ttl past max_ttl: %d %v; want 400 invalid_ttl", code, out)
		}
		code, r := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":700},"ttl":"2s"}`)
		if code != 200 {
			t.Fatalf("reserve: %d %v", code, r)
		}
		exp, err := time.Parse(time.RFC3339Nano, r["expires_at"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":1}}`); code != 429 {
			t.Fatalf("a second reserve while the first is held: %d %v; want 429", code, out)
		}
		for time.Now().Before(exp.Add(1500 * time.Millisecond)) {
			time.Sleep(20 * time.Millisecond) // polls the wall clock past the expiry and the next expiry pass
		}
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":1},"ttl":"1m"}`); code != 200 {
			t.Errorf("a reserve after the held one expired: %d %v; want 200 (the slot is back)", code, out)
		}
		var charged int64
		for _, e := range s.entries(t) {
			if e.Status == ledger.StatusExpired {
				charged += e.Actual.InputTokens
			}
		}
		if charged != 700 {
			t.Errorf("expired entries charge %d tokens; want the estimate, 700", charged)
		}
	})
}
