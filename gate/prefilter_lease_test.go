package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/weighted"
)

// TestPrefilterKeepsTheLeasesHeld: a leased key's denial that reached
// Redis after this replica's lease took what was left (a strict debit
// sent before the lease) is remembered, but the lease's units are the
// replica's: the prefilter lets its requests through while they last,
// and refuses once they are spent.
func TestPrefilterKeepsTheLeasesHeld(t *testing.T) {
	ctx := context.Background()
	g, req, l, key, held := leasedAcme(t, 1) // the late denial
	if held < 2 {
		t.Fatalf("the lease holds %d unspent", held)
	}
	admitted := int64(0)
	for admitted <= held {
		if d, refused := g.Prefilter(req); refused {
			if u := g.leases.Unspent(weighted.Item{Limit: l.limit, Key: key}); u > 0 {
				t.Fatalf("refused with %d held unspent, after %d admitted: %+v", u, admitted, d)
			}
			break
		}
		res, _ := g.Reserve(ctx, req)
		if res == nil {
			break
		}
		res.Settle(ctx, Charge{HTTPStatus: 200})
		admitted++
	}
	if admitted < held {
		t.Fatalf("admitted %d of the %d held", admitted, held)
	}
}

// TestPrefilterLeasesHeldInPart: a remembered denial of a leased key does
// not refuse, in the prefilter, a request that this replica's leases hold
// part of: with them the request lacks less of the store than the request
// denied, and the store has it. The leases decide, and admit it.
func TestPrefilterLeasesHeldInPart(t *testing.T) {
	ctx := context.Background()
	g, req, _, _, held := leasedAcme(t, 2) // a denial of 2, stale
	big := &Request{Caller: req.Caller, Route: "/x", Requests: held + 10}
	if d, refused := g.Prefilter(big); refused {
		t.Fatalf("a request of %d refused in the prefilter with %d held and the rest in the store: %+v", big.Requests, held, d)
	}
	res, d := g.Reserve(ctx, big)
	if res == nil {
		t.Fatalf("a request of %d refused with %d held and the rest in the store: %+v", big.Requests, held, d)
	}
	res.Settle(ctx, Charge{HTTPStatus: 200})
}

// leasedAcme opens a gate on a private Redis with one leased request
// limit (1000 a day, leases of at most half), sends tenant acme's
// requests until this replica holds a lease of its key, and makes the
// prefilter remember a denial of denied requests of the key, as one that
// reached Redis after the lease: it returns the gate, a request of
// acme's, the limit, the key and what the lease holds unspent (at least
// 1).
func leasedAcme(t *testing.T, denied int64) (*Gate, *Request, *compiledLimit, string, int64) {
	t.Helper()
	ctx := context.Background()
	g := openAcme(t, fmt.Sprintf(`store: {redis: %q, timeout: 5s, queue_timeout: 5s}
limits:
  - {name: hot, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 1000, period: 24h, lease: {max_share: 0.5, ttl: 1m}}`,
		redistest.New(t).URL))
	req := &Request{Caller: g.Identify("cg-acme"), Route: "/x"}
	var key string
	for i := 0; g.leases.Stats().Acquired == 0; i++ {
		if i == 200 {
			t.Fatalf("no lease after %d requests: %+v", i, g.leases.Stats())
		}
		res, d := g.Reserve(ctx, req)
		if res == nil {
			t.Fatalf("request %d refused: %+v", i, d)
		}
		key = res.items[0].Key
		res.Settle(ctx, Charge{HTTPStatus: 200})
	}
	st := g.state.Load()
	l := st.limits[0]
	held := g.leases.Unspent(weighted.Item{Limit: l.limit, Key: key})
	if held < 1 {
		t.Fatalf("the lease holds %d unspent", held)
	}
	now := time.Now()
	st.prefilter.add("acme", l, key, denied, now.Add(time.Hour), now.Add(time.Minute), now)
	return g, req, l, key, held
}
