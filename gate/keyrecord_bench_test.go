package gate_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
)

// BenchmarkKeyedByAttrs is a request's gate calls (reserve, record,
// settle naming the model served) on the in-memory store and the
// embedded ledger, under a limit keyed by the tenant, the client address
// and a project attribute, whose entries record both (see
// ledger.Entry.KeyIP): what recording them costs a request.
func BenchmarkKeyedByAttrs(b *testing.B) {
	ctx := context.Background()
	g := openYAML(b, `
admin_token: t
data_dir: `+b.TempDir()+`
tenants:
  - {name: acme, plan: free, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: per-project, dimensions: [tenant, ip, attr.project], unit: requests, rate: 1000000000, period: 24h}
`)
	c := g.Identify("cg-acme")
	attrs := map[string]string{"project": "search-indexer"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		res, d := g.Reserve(ctx, &gate.Request{ID: "r" + strconv.Itoa(i), Caller: c, Route: "/v1/chat/completions",
			IP: "2001:db8::1", Attributes: attrs, Estimate: costmodel.Estimate{Model: "gpt-4o-mini", Cost: 7}})
		if res == nil {
			b.Fatalf("refused: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			b.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, gate.Charge{Model: "gpt-4o-mini-2024-07-18", Cost: 9, HTTPStatus: 200})
	}
}
