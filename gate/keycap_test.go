package gate

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/weighted"
)

// openKeyCapGate opens a gate on store (a YAML store mapping's fields)
// with store.max_keys_per_tenant 6, tenants acme (key cg-acme, user ann)
// and globex, and limits keyed by values a caller chooses.
func openKeyCapGate(t *testing.T, store string) *Gate {
	t.Helper()
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {max_keys_per_tenant: 6, timeout: 5s, queue_timeout: 5s%s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
  - {name: globex, plan: small, keys: [{id: globex-key, key: cg-globex}]}
limits:
  - {name: per-job, dimensions: [tenant, attr.job], unit: requests, algorithm: fixed_window, rate: 100, period: 24h}
  - {name: per-ip, dimensions: [ip], unit: requests, algorithm: token_bucket, rate: 100, period: 1h}
  - {name: per-model, dimensions: [tenant, model], unit: requests, algorithm: sliding_window, rate: 100, period: 1h}
  - {name: per-user, dimensions: [tenant, user], unit: requests, algorithm: gcra, rate: 100, period: 1h}
  - {name: watch-team, dimensions: [tenant, attr.team], unit: requests, algorithm: fixed_window, rate: 100, period: 1h, mode: shadow}
`, t.TempDir(), store))
	t.Cleanup(func() { g.Close() })
	return g
}

// TestKeyCapBound: store.max_keys_per_tenant (here 6) is the most
// counters of values a tenant chose that a replica lets it make, exactly,
// on the in-memory store and on Redis alike: the 7th new one is refused
// (429 with the limit's name as its code, policy store.max_keys_per_tenant), writing nothing, and the
// counters held keep working. Counted: attributes in any spelling (case,
// a trailing space, full-width letters, a 100 KB value, whose key stays
// under 1,100 bytes), client addresses, models the price table does not
// know, users a front door names (Trusted), front doors' extra limits (a
// rate limit service's descriptors), every such limit of one request (2
// each: 3 requests fill 6), checks too. Not counted: another tenant's,
// known models, configured users. A shadow limit, and usage already
// served, never refuse: their new counters are not made.
func TestKeyCapBound(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			redisURL := func() string {
				if store == "memory" {
					return ""
				}
				return fmt.Sprintf(", redis: %q", redistest.New(t).URL)
			}
			ctx := context.Background()
			type outcome struct {
				admitted bool
				d        Decision
				res      *Reservation
			}
			reserve := func(t *testing.T, g *Gate, req Request) outcome {
				t.Helper()
				if req.Route == "" {
					req.Route = "/v1/costgate/reserve"
				}
				res, d := g.Reserve(ctx, &req)
				if res != nil {
					res.Settle(ctx, Charge{HTTPStatus: http.StatusOK})
				}
				return outcome{res != nil || req.Check && d.Allowed(), d, res}
			}
			// fill admits every request of reqs, then wants next refused by
			// limit.
			fill := func(t *testing.T, g *Gate, reqs []Request, next Request, limit string) {
				t.Helper()
				for i, req := range reqs {
					if o := reserve(t, g, req); !o.admitted {
						t.Fatalf("request %d of %d, under the cap: refused %d %+v", i+1, len(reqs), o.d.Status, o.d.Error)
					}
				}
				o := reserve(t, g, next)
				if o.admitted || o.d.Status != http.StatusTooManyRequests || o.d.Error == nil || o.d.Error.Code != limit || o.d.Error.Policy != keyCapPolicy ||
					!strings.Contains(o.d.Error.Message, fmt.Sprintf("%q", limit)) || o.d.RetryAfter < 1 {
					t.Fatalf("the request past the cap: admitted %v, %d %+v (retry %d s); want 429 with code %[5]q and policy store.max_keys_per_tenant naming %[5]q", o.admitted, o.d.Status, o.d.Error, o.d.RetryAfter, limit)
				}
			}
			job := func(c *Caller, v string) Request {
				return Request{Caller: c, Attributes: map[string]string{"job": v}}
			}
			t.Run("attributes", func(t *testing.T) {
				g := openKeyCapGate(t, redisURL())
				acme, globex := g.Identify("cg-acme"), g.Identify("cg-globex")
				long := strings.Repeat("x", 100_000)
				var reqs []Request
				for _, v := range []string{"export", "Export", "EXPORT", "export ", "ｅｘｐｏｒｔ", long} {
					reqs = append(reqs, job(acme, v))
				}
				fill(t, g, reqs, job(acme, "import"), "per-job")
				if o := reserve(t, g, job(acme, "Export")); !o.admitted {
					t.Errorf("a job acme holds was refused: %+v", o.d.Error)
				}
				if o := reserve(t, g, job(acme, long)); !o.admitted {
					t.Errorf("the long job acme holds was refused: %+v", o.d.Error)
				} else {
					for _, it := range o.res.items {
						if len(it.Key) > 1100 {
							t.Errorf("a key of %d bytes for a value of %d", len(it.Key), len(long))
						}
					}
				}
				for i := range 6 {
					if o := reserve(t, g, job(globex, fmt.Sprint("export-", i))); !o.admitted {
						t.Fatalf("globex's job %d, its own counter, was refused: %+v", i, o.d.Error)
					}
				}
			})
			t.Run("several limits at once", func(t *testing.T) {
				g := openKeyCapGate(t, redisURL())
				acme := g.Identify("cg-acme")
				both := func(i int) Request {
					r := job(acme, fmt.Sprint("j", i))
					r.IP = fmt.Sprintf("192.0.2.%d", i)
					return r
				}
				fill(t, g, []Request{both(1), both(2), both(3)}, both(4), "per-job")
				check := job(acme, "j9")
				check.Check = true
				if o := reserve(t, g, check); o.admitted || o.d.Error == nil || o.d.Error.Code != "per-job" || o.d.Error.Policy != keyCapPolicy {
					t.Errorf("a check of a new job past the cap: admitted %v, %+v", o.admitted, o.d.Error)
				}
			})
			t.Run("models", func(t *testing.T) {
				g := openKeyCapGate(t, redisURL())
				acme := g.Identify("cg-acme")
				model := func(m string) Request {
					return Request{Caller: acme, Estimate: costmodel.Estimate{Model: m, Encoding: costmodel.EncodingO200k}}
				}
				var reqs []Request
				for i := range 6 {
					reqs = append(reqs, model(fmt.Sprint("made-up-", i)))
				}
				fill(t, g, reqs, model("made-up-6"), "per-model")
				for _, m := range []string{"gpt-4o-mini", "gpt-4o", "GPT-4o"} {
					if o := reserve(t, g, model(m)); !o.admitted {
						t.Errorf("a priced model %s was refused: %+v", m, o.d.Error)
					}
				}
			})
			t.Run("users a front door names", func(t *testing.T) {
				g := openKeyCapGate(t, redisURL())
				var reqs []Request
				for i := range 6 {
					reqs = append(reqs, Request{Caller: g.Trusted("acme", fmt.Sprint("u", i), "", "")})
				}
				fill(t, g, reqs, Request{Caller: g.Trusted("acme", "u6", "", "")}, "per-user")
				if o := reserve(t, g, Request{Caller: g.Identify("cg-acme")}); !o.admitted {
					t.Errorf("acme's configured user ann was refused: %+v", o.d.Error)
				}
			})
			t.Run("descriptors", func(t *testing.T) {
				g := openKeyCapGate(t, redisURL())
				lim := weighted.Limit{Name: "rls.per-value", Algorithm: weighted.FixedWindow, Rate: 100, Period: time.Hour}
				desc := func(v string) Request {
					return Request{Caller: g.Trusted("acme", "", "", ""), Route: "rls:costgate", NoPolicy: true, ExtraOnly: true,
						Extra: []Extra{{Limit: lim, Unit: "requests", Key: "{acme}:" + v, Cost: 1, Dimension: "value"}}}
				}
				var reqs []Request
				for i := range 6 {
					reqs = append(reqs, desc(fmt.Sprint("v", i)))
				}
				fill(t, g, reqs, desc("v6"), "rls.per-value")
				served := desc("v7")
				served.Served, served.NoRequests = true, true
				if o := reserve(t, g, served); !o.admitted || len(o.res.items) != 0 {
					t.Errorf("usage served on a new descriptor past the cap: admitted %v, %d items; want admitted with none", o.admitted, len(o.res.items))
				}
			})
			t.Run("shadow", func(t *testing.T) {
				g := openKeyCapGate(t, redisURL())
				acme := g.Identify("cg-acme")
				team := func(v string) Request {
					return Request{Caller: acme, Attributes: map[string]string{"team": v}}
				}
				var reqs []Request
				for i := range 6 {
					reqs = append(reqs, team(fmt.Sprint("t", i)))
				}
				for _, req := range reqs {
					if o := reserve(t, g, req); !o.admitted {
						t.Fatalf("under the cap: %+v", o.d.Error)
					}
				}
				o := reserve(t, g, team("t6"))
				if !o.admitted {
					t.Fatalf("a new value of a shadow limit past the cap was refused: %+v", o.d.Error)
				}
				for _, it := range o.res.items {
					if it.Limit.Name == "watch-team" {
						t.Errorf("its counter was written: %+v", it)
					}
				}
			})
		})
	}
}
