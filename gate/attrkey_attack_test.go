package gate

import (
	"context"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestIsolationAtkRequestsWithoutTheAttributeShareOneKey: a limit keyed
// by a reservation's attribute (per job, across tenants: dimensions
// [attr.job]) must not be one key for every request that carries no such
// attribute, as every proxied request does: acme spending it must not
// refuse globex, and a tenant's proxied traffic is not held to one job's
// rate (dimensions [tenant, attr.job]). Requests that name a job are
// still limited per job.
func TestIsolationAtkRequestsWithoutTheAttributeShareOneKey(t *testing.T) {
	g := openTwoTenants(t, `  - {name: per-job, dimensions: [attr.job], unit: requests, algorithm: fixed_window, rate: 2, period: 1h}
  - {name: per-tenant-job, dimensions: [tenant, attr.job], unit: requests, algorithm: fixed_window, rate: 3, period: 1h}`)
	ctx := context.Background()
	acme, globex := g.Identify("cg-acme"), g.Identify("cg-globex")
	admit := func(who string, c *Caller, attrs map[string]string) bool {
		t.Helper()
		res, d := g.Reserve(ctx, &Request{Caller: c, Route: "/v1/chat/completions", Attributes: attrs})
		if res == nil {
			t.Logf("%s %v: refused %d by %s", who, attrs, d.Status, d.Error.Code)
			return false
		}
		res.Settle(ctx, Charge{HTTPStatus: 200})
		return true
	}
	// acme's proxied traffic: no attributes, and an explicit empty job.
	for i := range 5 {
		attrs := map[string]string(nil)
		if i%2 == 1 {
			attrs = map[string]string{"job": ""}
		}
		if !admit("acme", acme, attrs) {
			t.Errorf("acme's request %d without a job was held to a job's limit", i)
		}
	}
	if !admit("globex", globex, nil) {
		t.Errorf("globex's request without a job was refused once acme made requests without one")
	}
	// A job is still limited, across tenants.
	job := map[string]string{"job": "export"}
	if !admit("acme", acme, job) || !admit("globex", globex, job) {
		t.Fatal("a job's first two requests were refused")
	}
	if admit("acme", acme, job) {
		t.Error("a job's third request in the hour was admitted past per-job's rate of 2")
	}
}

// TestIsolationAtkRequestsWithoutAModelShareOneKey: limits keyed by model
// or by upstream (across tenants) must not be one key for every request
// that uses no model or names no upstream (a search API's, a reservation
// or a rate limit call that names none): acme spending it must not
// refuse globex. A request that names them is still limited, and so is a
// request to a model API that names no model.
func TestIsolationAtkRequestsWithoutAModelShareOneKey(t *testing.T) {
	g := openTwoTenants(t, `  - {name: per-model, dimensions: [model], unit: requests, algorithm: fixed_window, rate: 2, period: 1h}
  - {name: per-upstream, dimensions: [upstream], unit: requests, algorithm: fixed_window, rate: 2, period: 1h}`)
	ctx := context.Background()
	acme, globex := g.Identify("cg-acme"), g.Identify("cg-globex")
	admit := func(who string, req Request) bool {
		t.Helper()
		res, d := g.Reserve(ctx, &req)
		if res == nil {
			t.Logf("%s %+v: refused %d by %s", who, req.Estimate, d.Status, d.Error.Code)
			return false
		}
		res.Settle(ctx, Charge{HTTPStatus: 200})
		return true
	}
	bare := func(c *Caller) Request {
		return Request{Caller: c, Route: "/v1/costgate/reserve", Estimate: costmodel.Estimate{Cost: 1000}}
	}
	for i := range 5 {
		if !admit("acme", bare(acme)) {
			t.Errorf("acme's reservation %d without a model or an upstream was held to a model's or an upstream's limit", i)
		}
	}
	if !admit("globex", bare(globex)) {
		t.Errorf("globex's reservation without a model or an upstream was refused once acme made some")
	}
	named := func(c *Caller) Request {
		r := bare(c)
		r.Estimate.Model, r.Estimate.Encoding = "gpt-4o-mini", costmodel.EncodingO200k
		return r
	}
	if !admit("acme", named(acme)) || !admit("globex", named(globex)) {
		t.Fatal("a model's first two requests were refused")
	}
	if admit("acme", named(acme)) {
		t.Error("a model's third request in the hour was admitted past per-model's rate of 2")
	}
	upstream := func(c *Caller) Request {
		r := bare(c)
		r.Upstream = "search"
		return r
	}
	if !admit("acme", upstream(acme)) || !admit("globex", upstream(globex)) {
		t.Fatal("an upstream's first two requests were refused")
	}
	if admit("globex", upstream(globex)) {
		t.Error("an upstream's third request in the hour was admitted past per-upstream's rate of 2")
	}
	// A chat request that names no model: its tokens were counted. (Each
	// to an upstream of its own, which per-upstream does not refuse.)
	chat := func(c *Caller, upstream string) Request {
		r := bare(c)
		r.Route, r.Upstream, r.Estimate.Encoding = "/v1/chat/completions", upstream, costmodel.EncodingO200k
		return r
	}
	if !admit("acme", chat(acme, "u1")) || !admit("globex", chat(globex, "u2")) {
		t.Fatal("the first two chat requests without a model were refused")
	}
	if admit("acme", chat(acme, "u3")) {
		t.Error("a third chat request without a model was admitted past per-model's rate of 2 for the empty model")
	}
}
