package gate_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/redistest"
)

// BenchmarkKeyedByAttrs is a request's gate calls (reserve, record,
// settle naming the model served) on the in-memory store and the
// embedded ledger (and on Redis), under a limit keyed by the tenant, the
// client address and a project attribute, whose entries record both (see
// ledger.Entry.KeyIP): what recording them costs a request; and under a
// limit keyed by the address alone, a limit of the whole deployment whose
// key carries the global hash tag (its generation marker read and
// advanced by the debit).
func BenchmarkKeyedByAttrs(b *testing.B) {
	for _, c := range []struct{ name, dims string }{
		{"tenant+ip+attr", "[tenant, ip, attr.project]"}, {"ip", "[ip]"},
	} {
		for _, store := range []string{"memory", "redis"} {
			b.Run(c.name+"/"+store, func(b *testing.B) {
				storeYAML := ""
				if store == "redis" {
					storeYAML = "store: {redis: " + redistest.New(b).URL + "}\n"
				}
				benchKeyedBy(b, storeYAML, c.dims)
			})
		}
	}
}

func benchKeyedBy(b *testing.B, storeYAML, dims string) {
	ctx := context.Background()
	g := openYAML(b, `
admin_token: t
data_dir: `+b.TempDir()+`
`+storeYAML+`tenants:
  - {name: acme, plan: free, keys: [{id: acme-key, key: cg-acme}]}
limits:
  - {name: per-project, dimensions: `+dims+`, unit: requests, rate: 1000000000, period: 24h}
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
