package control_test

// Attacks on the plan of a tenant created or changed through the admin
// API: a tenant on a plan the configuration does not know would get none
// of the limits and budgets the configuration applies by plan.

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/logtest"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// planAtkFreeLimit is a limit of two requests a minute per tenant, for
// plan free only.
const planAtkFreeLimit = `
limits:
  - name: free-rpm
    plans: [free]
    dimensions: [tenant]
    rate: 2
    period: 1m
`

// planAtkStatuses sends four chat completions with key and returns their
// statuses, "200 200 429 429" under planAtkFreeLimit.
func planAtkStatuses(t *testing.T, r *replica, key string) string {
	t.Helper()
	var out []string
	for range 4 {
		st, _ := r.chat(t, key)
		out = append(out, fmt.Sprint(st))
	}
	return strings.Join(out, " ")
}

// planAtkBadPlans are plans other than free in the spellings an operator
// or a script gets wrong: misspelt, another case, spaces, a Cyrillic е,
// none.
var planAtkBadPlans = []struct{ name, plan string }{
	{"misspelt", `"fre"`},
	{"another case", `"Free"`},
	{"spaces around it", `" free "`},
	{"a look-alike letter", `"fr\u0435e"`},
	{"empty", `""`},
	{"none", ``},
}

// TestPlanAtkUnknownPlanDodgesPlanLimits: with a limit for plan free
// only, a tenant created or PATCHed through the admin API onto a plan the
// configuration does not know (or onto none) is refused (400, naming the
// configuration's plans): before, it was created, and its requests got
// none of plan free's limits (200 200 200 200 where plan free gives 200
// 200 429 429).
func TestPlanAtkUnknownPlanDodgesPlanLimits(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{dsn: pgtest.NewPrivate(t).URL(), redis: redistest.New(t).URL, extra: planAtkFreeLimit})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"onfree","plan":"free"}`, nil)
	var k created
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"onfree"}`, &k)
	if got := planAtkStatuses(t, r, k.Key); got != "200 200 429 429" {
		t.Fatalf("plan free: %s, want 200 200 429 429", got)
	}
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"patched","plan":"free"}`, nil)
	var pk created
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"patched"}`, &pk)

	for i, c := range planAtkBadPlans {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("dodge%d", i)
			body := `{"name":"` + name + `"}`
			if c.plan != "" {
				body = `{"name":"` + name + `","plan":` + c.plan + `}`
			}
			st, resp := r.call(t, "test-admin", "POST", "/admin/v1/tenants", body, nil)
			if st == 201 {
				var dk created
				r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"`+name+`"}`, &dk)
				t.Errorf("POST %s: created; its requests: %s, where plan free's are 200 200 429 429", body, planAtkStatuses(t, r, dk.Key))
			} else if st != 400 || !strings.Contains(resp, `plans: free`) {
				t.Errorf("POST %s: %d %s, want 400 naming the configuration's plans", body, st, resp)
			}
			if c.plan == "" {
				return // a PATCH without a plan leaves it
			}
			st, resp = r.call(t, "test-admin", "PATCH", "/admin/v1/tenants/patched", `{"plan":`+c.plan+`}`, nil)
			if st != 400 || !strings.Contains(resp, `plans: free`) {
				t.Errorf("PATCH plan %s: %d %s, want 400 naming the configuration's plans", c.plan, st, resp)
			}
			var got struct{ Plan string }
			r.must(t, 200, "GET", "/admin/v1/tenants/patched", "", &got)
			if got.Plan != "free" {
				t.Errorf("PATCH plan %s: the tenant is on plan %q, want free", c.plan, got.Plan)
			}
		})
	}
	if got := planAtkStatuses(t, r, pk.Key); got != "200 200 429 429" {
		t.Errorf("the tenant whose plan was PATCHed: %s, want plan free's 200 200 429 429", got)
	}
	// The error says what was meant.
	_, resp := r.call(t, "test-admin", "POST", "/admin/v1/tenants", `{"name":"hint","plan":"FREE"}`, nil)
	if !strings.Contains(resp, `did you mean \"free\"`) {
		t.Errorf("plan FREE: %s, want a hint at free", resp)
	}
	_, resp = r.call(t, "test-admin", "POST", "/admin/v1/tenants", `{"name":"hint","plan":"fr\u0435e"}`, nil)
	if !strings.Contains(resp, `fr\\u0435e`) {
		t.Errorf("a Cyrillic е: %s, want it shown as \\u0435", resp)
	}
}

// planAtkConfig is newReplica's config file, with data_dir dir, upstream
// up, the config tenants tenants (YAML list items) and extra at the end.
func planAtkConfig(dir, up, tenants, extra string) string {
	return replicaYAML(dir, "", up, tenants+extra)
}

// TestPlanAtkPlansFollowTheReloadedConfig: the plans the admin API takes
// are the running configuration's, reloads included. A reload that adds
// plan pro (a config tenant on it, a limit for it) lets a tenant onto pro.
// A reload that would remove pro while an API tenant is on it is refused,
// naming the tenant: before, it went through and the tenant served on with
// none of the limits by plan (a tenant on plan pro, whose limit is 3 a
// minute, made 4 requests of 4 and more). A replica whose configuration
// does not know pro (a rolling update: another replica's let the tenant
// onto it) refuses the tenant's requests, 403 plan_unknown, rather than
// serve them unlimited, and warns of it once. Once a PATCH moves the
// tenant onto free, the reload goes through; a configuration without a
// limit or budget by plan takes any plan as a label.
func TestPlanAtkPlansFollowTheReloadedConfig(t *testing.T) {
	dsn, rd := pgtest.NewPrivate(t).URL(), redistest.New(t).URL
	up, dir := simulatorURL(t), t.TempDir()
	var logs logtest.Buffer
	r := newReplica(t, up, replicaOptions{dsn: dsn, redis: rd, dir: dir, extra: planAtkFreeLimit})
	reload := func(tenants, extra string) error {
		t.Helper()
		yaml := planAtkConfig(dir, up, tenants, extra)
		r.srv.SetLoader(func() (*config.Config, error) {
			cfg, err := config.Parse([]byte(yaml))
			if err != nil {
				return nil, err
			}
			cfg.Store.Redis, cfg.Ledger.DSN = rd, dsn
			return cfg, nil
		})
		return r.srv.Reload()
	}
	r.must(t, 400, "POST", "/admin/v1/tenants", `{"name":"acme","plan":"pro"}`, nil)

	const proTenant = `  - name: yamlpro
    plan: pro
    keys:
      - id: yamlpro-key
        key: cg-test-yamlpro
`
	withPro := planAtkFreeLimit + `  - name: pro-rpm
    plans: [pro]
    dimensions: [tenant]
    rate: 3
    period: 1m
`
	if err := reload(proTenant, withPro); err != nil {
		t.Fatalf("reload: %v", err)
	}
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"acme","plan":"pro"}`, nil)
	var k created
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"acme"}`, &k)
	if got := planAtkStatuses(t, r, k.Key); got != "200 200 200 429" {
		t.Fatalf("plan pro: %s, want 200 200 200 429", got)
	}

	// Another replica of the same control plane, whose configuration
	// knows plan free only.
	other := newReplica(t, up, replicaOptions{dsn: dsn, redis: rd, extra: planAtkFreeLimit, log: slog.New(slog.NewJSONHandler(&logs, nil))})
	var st int
	var body string
	within(t, "the other replica's answer to acme", 5*time.Second, func() bool {
		st, body = other.chat(t, k.Key)
		return st != 401 // until its poll brings the key
	})
	if st != 403 || !strings.Contains(body, "plan_unknown") {
		t.Fatalf("acme, on plan pro, on a replica that does not know pro: %d %s, want 403 plan_unknown", st, body)
	}
	const warning = `"tenant":"acme","plan":"pro"`
	within(t, "the warning of acme on plan pro", 2*time.Second, func() bool { return strings.Contains(logs.String(), warning) })

	// Plan pro removed while acme is on it: refused.
	if err := reload("", planAtkFreeLimit); err == nil || !strings.Contains(err.Error(), `acme (plan "pro")`) {
		t.Fatalf("a reload removing plan pro while acme is on it: %v, want an error naming acme", err)
	}
	if st, body := r.chat(t, "cg-test-yamlpro"); st != 200 {
		t.Fatalf("the config tenant on pro after the refused reload: %d %s", st, body)
	}
	r.must(t, 200, "PATCH", "/admin/v1/tenants/acme", `{"metadata":{"owner":"ops"}}`, nil)
	r.must(t, 200, "PATCH", "/admin/v1/tenants/acme", `{"plan":"free"}`, nil)
	if err := reload("", planAtkFreeLimit); err != nil {
		t.Fatalf("reload once acme is on free: %v", err)
	}
	if st, body := r.call(t, "test-admin", "PATCH", "/admin/v1/tenants/acme", `{"plan":"pro"}`, nil); st != 400 || !strings.Contains(body, "plans: free") {
		t.Errorf("PATCH onto the removed plan pro: %d %s, want 400", st, body)
	}
	// On free, the other replica serves acme within free's 2 a minute.
	within(t, "acme on free on the other replica", 5*time.Second, func() bool {
		st, _ := other.chat(t, k.Key)
		return st != 403
	})
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Errorf("acme on plan pro warned of %d times, want once", n)
	}

	// No limit or budget by plan: a plan is a label.
	if err := reload("", ""); err != nil {
		t.Fatalf("reload: %v", err)
	}
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"labelled","plan":"gold"}`, nil)
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"unlabelled"}`, nil)
	r.must(t, 200, "PATCH", "/admin/v1/tenants/acme", `{"plan":"anything"}`, nil)
}
