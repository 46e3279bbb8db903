package proxy_test

// Attacks of a tenant on tenant isolation and on the identification of
// callers: a reservation settled by another key than the one that made it,
// a key's model and route restrictions under other spellings, and the
// data-plane usage view asked for another tenant's data.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// isoAdmin calls s's admin plane with the admin token and decodes its JSON
// answer into out (when not nil).
func isoAdmin(t *testing.T, s *stack, method, path, body string, out any) int {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer test-admin")
	w := httptest.NewRecorder()
	s.srv.AdminHandler().ServeHTTP(w, req)
	if out != nil {
		json.Unmarshal(w.Body.Bytes(), out)
	}
	return w.Code
}

// isoKey is a control-plane key as its creation answers it.
type isoKey struct {
	ID  string `json:"id"`
	Key string `json:"key"`
}

// isoNewKey creates a control-plane key from body on s and returns it.
func isoNewKey(t *testing.T, s *stack, body string) isoKey {
	t.Helper()
	var k isoKey
	if code := isoAdmin(t, s, "POST", "/admin/v1/keys", body, &k); code != 201 || k.Key == "" {
		t.Fatalf("create key %s: %d", body, code)
	}
	return k
}

// isoWaitKey waits, up to 5 s, for s to identify key (the control plane's
// poll brings another replica's change).
func isoWaitKey(t *testing.T, s *stack, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _ := reserveCall(t, s.srv.Handler(), key, "/v1/costgate/release", `{"reservation_id":"rsv_x"}`)
		if code != http.StatusUnauthorized {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica does not know the key after 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIsolationAttackSettleWithAnotherKeyEscapesTheKeysLimit: a key held
// to a limit of its own (1,000 tokens a day) reserves 10 tokens on one
// replica, and the tenant settles 900 on the other replica with another of
// its keys. Either the sibling is refused (the reservation is not its), or
// the limit of the key that reserved is charged the 900, as it is when
// that key settles itself: else a key escapes its own limits by reserving
// little and settling through a sibling key on another replica.
func TestIsolationAttackSettleWithAnotherKeyEscapesTheKeysLimit(t *testing.T) {
	redisURL, dsn := redistest.New(t).URL, pgtest.New(t)
	extra := "\nreservations:\n  secret: \"replicas-share-this-secret-0123\"\ncontrol:\n  poll: 50ms\n" + roomyLimits
	a := newStackWith(t, stackOptions{redisURL: redisURL, ledgerDSN: dsn, extra: extra})
	b := newStackWith(t, stackOptions{redisURL: redisURL, ledgerDSN: dsn, extra: extra})
	limited := `{"tenant":"acme","limits":[{"name":"key-tokens","unit":"tokens","rate":1000,"period":"24h","algorithm":"fixed_window"},` +
		`{"name":"key-usd","unit":"usd","rate_usd":"1.00","period":"24h","algorithm":"fixed_window"}]}`

	for _, c := range []struct {
		name    string
		sibling bool // settled by another key of the tenant
		here    bool // settled on the replica that holds the reservation
	}{
		{"settled by the key that reserved", false, false},
		{"settled by a sibling key on the replica that holds it", true, true},
		{"settled by a sibling key on another replica", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := isoNewKey(t, a, limited)
			settler := k
			if c.sibling {
				settler = isoNewKey(t, a, `{"tenant":"acme"}`)
			}
			isoWaitKey(t, b, k.Key)
			isoWaitKey(t, b, settler.Key)
			id := reserveOn(t, a, k.Key, `{"cost":{"tokens":10,"usd":"0.01"}}`)
			on := b
			if c.here {
				on = a
			}
			code, out := reserveCall(t, on.srv.Handler(), settler.Key, "/v1/costgate/settle",
				`{"reservation_id":"`+id+`","usage":{"tokens":900,"usd":"0.90"}}`)
			if c.sibling && code == http.StatusNotFound {
				return // refused: the reservation is the other key's
			}
			if code != 200 {
				t.Fatalf("settle: %d %v", code, out)
			}
			// 900 of the key's 1,000 tokens and $0.90 of its $1.00 are
			// spent: 200 tokens, or $0.20, more must be refused on either
			// replica.
			for _, s := range []*stack{a, b} {
				for _, probe := range []string{`{"cost":{"tokens":200}}`, `{"cost":{"usd":"0.20"}}`} {
					code, out := reserveCall(t, s.srv.Handler(), k.Key, "/v1/costgate/reserve", probe)
					if code == 200 {
						t.Errorf("the key reserved %s over the settlement of 900 tokens and $0.90 against its limits of 1000 tokens and $1.00: its limits were not charged the settlement (%v)", probe, out["request_id"])
					} else if code != http.StatusTooManyRequests {
						t.Errorf("reserve %s: %d %v", probe, code, out)
					}
				}
			}
		})
	}
}

// TestIsolationAttackKeyRoutesUnderOtherSpellings: a control-plane key
// allowed /v1/chat/completions and the generic upstream cheap reaches
// neither another API path nor the upstream cheaper (whose name starts
// with cheap) by another spelling of its path: case, a trailing or doubled
// slash, dot-segments, percent-encoding. Held: what reaches an upstream
// is always a route the key may use.
func TestIsolationAttackKeyRoutesUnderOtherSpellings(t *testing.T) {
	llm := routeAtkSimSpy(t)
	gen := &routeAtkSpy{}
	genSrv := httptest.NewServer(gen)
	t.Cleanup(genSrv.Close)
	s := newStackWith(t, stackOptions{upstream: llm, extra: `
  - name: cheap
    kind: generic
    base_url: ` + genSrv.URL + `/cheap
    api_key: sk-cheap
    cost: {per_call: "0.001"}
  - name: cheaper
    kind: generic
    base_url: ` + genSrv.URL + `/dear
    api_key: sk-dear
    cost: {per_call: "1.00"}
` + roomyLimits})
	k := isoNewKey(t, s, `{"tenant":"acme","routes":["/v1/chat/completions","/u/cheap"]}`)
	host := strings.TrimPrefix(s.url, "http://")
	auth := "Authorization: Bearer " + k.Key + "\n"

	for _, target := range []string{
		"/v1/responses", "/v1/embeddings", "/v1/messages",
		"/v1/chat/completions/", "/V1/chat/completions", "//v1/chat/completions", "/v1//chat/completions",
		"/v1/chat/completions/../../v1/responses", "/v1/chat/%2e%2e/responses", "/v1/chat%2Fcompletions",
		"/u/cheaper/x", "/u/Cheap/x", "/u/CHEAPER/x", "/u/cheap/../cheaper/x", "/u/cheap/%2e%2e/cheaper/x",
		"/u/cheap%2F..%2Fcheaper/x", "/u//cheaper/x", "/u/cheap/..", "/u/%63heaper/x", "/u/cheaper%2Fx",
	} {
		t.Run(target, func(t *testing.T) {
			got := sendRaw(t, s.url, routeAtkChat(target, host, auth))
			for _, seen := range llm.take() {
				if seen.path != "/v1/chat/completions" {
					t.Errorf("%s reached the LLM upstream at %s (%d)", target, seen.path, got.status)
				}
			}
			for _, seen := range gen.take() {
				if !strings.HasPrefix(seen.path, "/cheap/") && seen.path != "/cheap" {
					t.Errorf("%s reached the generic upstreams at %s (%d)", target, seen.path, got.status)
				}
			}
		})
	}
	// The routes the key may use it does use.
	for _, target := range []string{"/v1/chat/completions", "/u/cheap/x"} {
		if got := sendRaw(t, s.url, routeAtkChat(target, host, auth)); got.status != 200 {
			t.Errorf("%s: %d %s", target, got.status, got.body)
		}
	}
	llm.take()
	gen.take()
}

// TestIsolationAttackUsageOfAnotherTenant: GET /v1/costgate/usage answers
// for the caller's own tenant whatever the query or headers name: another
// tenant's name, key id or key in the query, a tenant-naming header. Held.
func TestIsolationAttackUsageOfAnotherTenant(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: roomyLimits})
	// acme spends; globex spends nothing.
	if _, err := s.client("cg-test-acme").Chat.Completions.New(context.Background(), chatParams("hi", 8)); err != nil {
		t.Fatalf("acme's chat: %v", err)
	}
	if len(s.entries(t)) != 1 {
		t.Fatal("acme's chat is not in the ledger")
	}
	for _, target := range []string{
		"/v1/costgate/usage?tenant=acme",
		"/v1/costgate/usage?tenant=acme&key_id=acme-key&user=alice",
		"/v1/costgate/usage?api_key=cg-test-acme",
		"/v1/costgate/usage/../usage?tenant=acme",
	} {
		t.Run(target, func(t *testing.T) {
			req, _ := http.NewRequest("GET", s.url+target, nil)
			req.Header.Set("Authorization", "Bearer cg-test-globex")
			req.Header.Set("X-Costgate-Tenant", "acme")
			req.Header.Set("Costgate-Tenant", "acme")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out struct {
				Tenant string `json:"tenant"`
				Spend  []struct {
					Spent  int64  `json:"spent_nano_usd"`
					Tenant string `json:"tenant"`
				} `json:"spend"`
			}
			json.NewDecoder(resp.Body).Decode(&out)
			if resp.StatusCode != 200 {
				t.Logf("refused: %d", resp.StatusCode)
				return // refused: nothing shown
			}
			if out.Tenant != "globex" {
				t.Errorf("globex's key was shown tenant %q", out.Tenant)
			}
			for _, sp := range out.Spend {
				if sp.Spent != 0 || sp.Tenant != "globex" {
					t.Errorf("globex's key was shown another tenant's spend: %+v", sp)
				}
			}
		})
	}
}

// TestIsolationAttackKeyModelsUnderOtherSpellings: a control-plane key
// allowed gpt-4o-mini only asks for other models in spellings the price
// table folds (case, spaces, a fine-tune of the allowed base, a dated
// snapshot of another model) on every LLM route. Held: whatever reaches
// the upstream names the allowed model, or one of its snapshots.
func TestIsolationAttackKeyModelsUnderOtherSpellings(t *testing.T) {
	up := routeAtkSimSpy(t)
	s := newStackWith(t, stackOptions{upstream: up, extra: roomyLimits})
	k := isoNewKey(t, s, `{"tenant":"acme","models":["gpt-4o-mini"]}`)
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
		"/v1/completions":      `{"model":%q,"max_tokens":4,"prompt":"hi"}`,
		"/v1/embeddings":       `{"model":%q,"input":"hi"}`,
		"/v1/responses":        `{"model":%q,"max_output_tokens":16,"input":"hi"}`,
		"/v1/messages":         `{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
	}
	for path, tmpl := range bodies {
		for _, model := range []string{
			"gpt-4o", "GPT-4O", "gpt-4o-2024-08-06", "ft:gpt-4o:acme::x1", "ft:gpt-4o-mini:other-org::x1",
			"gpt-4o-mini/../gpt-4o", "o1-pro", "claude-opus-4-1", "gpt-4o-mini\u200b", "gpt‐4o",
		} {
			t.Run(path+"/"+model, func(t *testing.T) {
				body := strings.Replace(tmpl, "%q", jsonString(model), 1)
				req, _ := http.NewRequest("POST", s.url+path, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+k.Key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				for _, seen := range up.take() {
					var b struct {
						Model string `json:"model"`
					}
					json.Unmarshal([]byte(seen.body), &b)
					if b.Model != "gpt-4o-mini" && !strings.HasPrefix(b.Model, "gpt-4o-mini-20") {
						t.Errorf("%s reached the upstream with model %q (%d)", path, b.Model, resp.StatusCode)
					}
				}
			})
		}
	}
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestIsolationAttackMethodOverride: a generic upstream's methods are the
// operator's bound on what costgate's credential, shared by every tenant,
// may do there (a read-only search API: GET and POST). A tenant that sends
// an allowed method with a method-override header, which Google's APIs
// and many web frameworks obey, must not have the upstream run another
// method (a DELETE of data every tenant shares) under that credential,
// priced as the method costgate saw.
func TestIsolationAttackMethodOverride(t *testing.T) {
	gen, s, host := isoGenericStack(t, "search", "    methods: [GET, POST]\n")
	if got := sendRaw(t, s.url, "GET /u/search/index/doc-1 HTTP/1.1\nHost: "+host+
		"\nAuthorization: Bearer cg-test-acme\nContent-Length: 0\nConnection: close\n\n"); got.status != 200 || len(gen.take()) != 1 {
		t.Fatalf("a plain GET: %d %s", got.status, got.body)
	}
	for _, h := range []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "x-http-method-override", "X_HTTP_Method_Override", "X_Method_Override"} {
		for _, method := range []string{"GET", "POST"} {
			t.Run(h+"/"+method, func(t *testing.T) {
				got := sendRaw(t, s.url, method+" /u/search/index/doc-1 HTTP/1.1\nHost: "+host+
					"\nAuthorization: Bearer cg-test-acme\n"+h+": DELETE\nContent-Length: 0\nConnection: close\n\n")
				for _, seen := range gen.take() {
					for k, v := range seen.header {
						if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), strings.ReplaceAll(h, "_", "-")) {
							t.Errorf("the upstream was asked, under a %s of status %d, to run %s %q: a method outside the upstream's methods",
								method, got.status, k, v)
						}
					}
				}
			})
		}
	}
}

// TestIsolationAttackIdempotencyKeyAcrossTenants: a metered API that
// honours Idempotency-Key (Stripe's, and APIs built the same way) keeps
// one answer per key per account, and every tenant reaches it under
// costgate's one account. A key the client chooses must therefore reach
// the upstream scoped by the tenant: else globex, sending the key acme
// used (an order number), is handed acme's stored answer, and acme's
// request, sent second, would get globex's.
func TestIsolationAttackIdempotencyKeyAcrossTenants(t *testing.T) {
	gen, s, host := isoGenericStack(t, "pay", "")
	// Both send the key in one spelling of the header: a server that reads
	// headers by CGI-style names takes Idempotency_Key for Idempotency-Key;
	// other APIs name theirs X-Idempotency-Key or Idempotency-Token (AWS's
	// X-Amzn-Idempotency-Token).
	for _, spelling := range []string{"Idempotency-Key", "idempotency_key", "IDEMPOTENCY_KEY",
		"X-Idempotency-Key", "x_idempotency_key", "Idempotency-Token", "X-Amzn-Idempotency-Token"} {
		t.Run(spelling, func(t *testing.T) {
			seen := map[string]string{} // the key the upstream saw -> the tenant that sent it
			for _, c := range []struct{ tenant, key, header string }{{"acme", "cg-test-acme", spelling}, {"globex", "cg-test-globex", spelling}} {
				got := sendRaw(t, s.url, "POST /u/pay/charges HTTP/1.1\nHost: "+host+"\nAuthorization: Bearer "+c.key+
					"\n"+c.header+": order-1001\nContent-Type: application/json\nContent-Length: 2\nConnection: close\n\n{}")
				if got.status != 200 {
					t.Fatalf("%s: %d %s", c.tenant, got.status, got.body)
				}
				for _, r := range gen.take() {
					for name, vs := range r.header {
						if !strings.EqualFold(strings.ReplaceAll(name, "_", "-"), strings.ReplaceAll(spelling, "_", "-")) {
							continue
						}
						for _, k := range vs {
							if other, ok := seen[k]; ok && other != c.tenant {
								t.Errorf("%s and %s reached the upstream with one idempotency key %q (%s): the upstream, one account to it, answers the second with the first's stored answer", other, c.tenant, k, name)
							}
							seen[k] = c.tenant
						}
					}
				}
			}
		})
	}
}

// isoGenericStack is a stack with the generic upstream name (per call
// $0.001, more of its config in more) on a spy, and the stack's host.
func isoGenericStack(t *testing.T, name, more string) (*routeAtkSpy, *stack, string) {
	gen := &routeAtkSpy{}
	genSrv := httptest.NewServer(gen)
	t.Cleanup(genSrv.Close)
	s := newStackWith(t, stackOptions{extra: `
  - name: ` + name + `
    kind: generic
    base_url: ` + genSrv.URL + `/api
    api_key: sk-` + name + `
` + more + `    cost: {per_call: "0.001"}
` + roomyLimits})
	return gen, s, strings.TrimPrefix(s.url, "http://")
}

// TestIsolationAttackUsageCredentialHeaders: the usage view reads the
// caller's key as the proxied routes do (x-api-key first, then a bearer
// token; the first of two headers of one name; an unknown x-api-key is not
// excused by a valid bearer token), so no pair of credentials shows one
// tenant another's view. Held.
func TestIsolationAttackUsageCredentialHeaders(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: roomyLimits})
	host := strings.TrimPrefix(s.url, "http://")
	for _, c := range []struct{ name, header, tenant string }{
		{"x-api-key and another tenant's bearer", "Authorization: Bearer cg-test-acme\nx-api-key: cg-test-globex\n", "globex"},
		{"two bearer headers", "Authorization: Bearer cg-test-globex\nAuthorization: Bearer cg-test-acme\n", "globex"},
		{"BEARER upper case, spaces", "AUTHORIZATION: BEARER    cg-test-globex \n", "globex"},
		{"unknown x-api-key, valid bearer", "x-api-key: cg-test-nope\nAuthorization: Bearer cg-test-acme\n", ""},
		{"key in the query only", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := sendRaw(t, s.url, "GET /v1/costgate/usage?api_key=cg-test-acme HTTP/1.1\nHost: "+host+"\n"+c.header+"Connection: close\n\n")
			var out struct {
				Tenant string `json:"tenant"`
			}
			json.Unmarshal([]byte(got.body), &out)
			switch {
			case c.tenant == "" && got.status != http.StatusUnauthorized:
				t.Errorf("%d %s, want 401", got.status, got.body)
			case c.tenant != "" && (got.status != 200 || out.Tenant != c.tenant):
				t.Errorf("%d tenant %q, want 200 for %s", got.status, out.Tenant, c.tenant)
			}
		})
	}
}

// TestIsolationAttackOverridesToAnLLMUpstream: an LLM route's method and
// path are the API's (POST /v1/chat/completions, priced as a chat). A
// client's method-override or path-override header must not reach an
// OpenAI-compatible server that obeys them (a framework's middleware in
// front of it, IIS's URL Rewrite) and have it run, under costgate's
// credential, another operation than the one priced: they are dropped.
func TestIsolationAttackOverridesToAnLLMUpstream(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, hostileUpChat(`"gpt-4o-mini"`, `{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}`))
	}}
	s := hostileUpStack(t, up, 0, "")
	overrides := map[string]string{
		"X-HTTP-Method-Override": "DELETE", "X_HTTP_Method": "DELETE", "x-method-override": "DELETE",
		"X-Original-URL": "/v1/fine_tuning/jobs", "X_Rewrite_URL": "/v1/batches",
	}
	e, _ := oneEntry(t, s, "/v1/chat/completions", hostileUpChatReq, overrides)
	if e.HTTPStatus != 200 {
		t.Fatalf("the chat request: %+v", e)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("the upstream got %d requests, want 1", len(seen))
	}
	for k, v := range seen[0] {
		for o := range overrides {
			if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), strings.ReplaceAll(o, "_", "-")) {
				t.Errorf("the upstream got %s: %q, priced as a chat completion", k, v)
			}
		}
	}
}
