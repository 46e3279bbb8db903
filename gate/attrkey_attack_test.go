package gate

import (
	"context"
	"testing"
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
