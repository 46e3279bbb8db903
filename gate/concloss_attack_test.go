package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
)

// concLossLimits is acme's concurrency limit of 3, whose lease of a
// minute is renewed every second.
const concLossLimits = `
limits:
  - {name: streams, dimensions: [tenant], algorithm: concurrency, rate: 3, period: 1m}`

// concLossGates opens n replicas of acme on one private Redis, with
// concLossLimits, and returns them and the Redis.
func concLossGates(t *testing.T, n int) ([]*Gate, *redistest.Server) {
	t.Helper()
	srv := redistest.New(t)
	gs := make([]*Gate, n)
	for i := range gs {
		gs[i] = openAcme(t, fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}", srv.URL)+concLossLimits)
	}
	return gs, srv
}

// concLossReserve reserves a request of acme on g, and cancels it when t
// ends; nil when refused, with the decision.
func concLossReserve(t *testing.T, g *Gate) (*Reservation, Decision) {
	t.Helper()
	res, d := g.Reserve(context.Background(), &Request{Caller: g.Identify("cg-acme"), Route: "/x"})
	if res != nil {
		t.Cleanup(func() { res.Cancel(context.Background()) })
	}
	return res, d
}

// renewNow makes g's renewer renew every reservation it holds, as its
// next tick would, and waits for the renewals.
func renewNow(t *testing.T, g *Gate) {
	t.Helper()
	r := g.renewer
	r.renewDue(time.Now().Add(time.Hour))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		busy := 0
		for _, l := range r.leases {
			if l.busy {
				busy++
			}
		}
		r.mu.Unlock()
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals still running after 10 s", busy)
		}
	}
}

// TestConcLossAtkOtherReplicaRefused: acme holds 3 streams of 3 on replica
// a, and Redis loses its data (FLUSHALL). Once a has renewed its leases
// (every half period, a second at most), a 4th stream on replica b is
// refused with 429. Before, a's renewals changed nothing on the lost
// leases, and b admitted 3 more while a's 3 ran.
func TestConcLossAtkOtherReplicaRefused(t *testing.T) {
	gs, srv := concLossGates(t, 2)
	a, b := gs[0], gs[1]
	for i := range 3 {
		if res, d := concLossReserve(t, a); res == nil {
			t.Fatalf("stream %d refused: %+v", i, d)
		}
	}
	if res, d := concLossReserve(t, b); res != nil || d.Status != 429 {
		t.Fatalf("a 4th stream before the loss: %d, want 429", d.Status)
	}
	if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	renewNow(t, a)
	for i := range 3 {
		if res, d := concLossReserve(t, b); res != nil || d.Status != 429 {
			t.Fatalf("stream %d on b after the loss, with acme's 3 running on a: %d, want 429", 4+i, d.Status)
		}
	}
}

// TestConcLossAtkSameReplicaRefused: acme holds 3 streams of 3 on a
// replica, and Redis loses its data (FLUSHALL). The 4th stream on the same
// replica, right away, before any renewal is due, is refused with 429:
// the restore of acme after the loss renews the replica's leases of acme
// before deciding. Before, it was admitted, and 2 more.
func TestConcLossAtkSameReplicaRefused(t *testing.T) {
	gs, srv := concLossGates(t, 1)
	a := gs[0]
	for i := range 3 {
		if res, d := concLossReserve(t, a); res == nil {
			t.Fatalf("stream %d refused: %+v", i, d)
		}
	}
	if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if res, d := concLossReserve(t, a); res != nil || d.Status != 429 {
			t.Fatalf("stream %d after the loss, with acme's 3 running: %d, want 429", 4+i, d.Status)
		}
	}
}

// TestConcLossAtkEndedStreamsFreeSlots: after the loss and the renewals,
// a stream that ends gives its slot back, and one more is admitted, not
// two: the holds renewed count as the debits did.
func TestConcLossAtkEndedStreamsFreeSlots(t *testing.T) {
	gs, srv := concLossGates(t, 2)
	a, b := gs[0], gs[1]
	var held []*Reservation
	for i := range 3 {
		res, d := concLossReserve(t, a)
		if res == nil {
			t.Fatalf("stream %d refused: %+v", i, d)
		}
		held = append(held, res)
	}
	if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	renewNow(t, a)
	held[0].Cancel(context.Background())
	renewNow(t, a)
	if res, d := concLossReserve(t, b); res == nil {
		t.Fatalf("a stream in the slot given back: %+v", d)
	}
	if res, d := concLossReserve(t, b); res != nil || d.Status != 429 {
		t.Fatalf("a 5th stream: %d, want 429", d.Status)
	}
}

// TestConcLossAtkSharedLimitsSameReplicaRefused: a concurrency limit
// without the caller (an address's streams in flight, a model's across
// every tenant, the deployment's, a job's) holds across a loss as a
// tenant's does (TestConcLossAtkSameReplicaRefused): 3 of its 3 streams
// run on a replica, Redis loses its data, and a 4th on that replica,
// right away, is refused with 429; on another replica, after the first
// one's renewals (TestConcLossAtkOtherReplicaRefused), too. Before, such
// a limit's key had no hash tag, so no generation marker told the loss:
// the replica admitted 3 more before its next renewal held the lost
// slots again.
func TestConcLossAtkSharedLimitsSameReplicaRefused(t *testing.T) {
	// And, as a tenant's, limits keyed by the caller and more.
	for _, dims := range []string{"[ip]", "[model]", "[]", "[attr.job]", "[route, ip]", "[tenant, ip]", "[api_key, model]", "[user, attr.job]"} {
		t.Run(dims, func(t *testing.T) {
			t.Parallel()
			srv := redistest.New(t)
			open := func() *Gate {
				return openAcme(t, fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}", srv.URL)+`
limits:
  - {name: streams, dimensions: `+dims+`, algorithm: concurrency, rate: 3, period: 1m}`)
			}
			a, b := open(), open()
			reserve := func(g *Gate) (*Reservation, Decision) {
				res, d := g.Reserve(context.Background(), &Request{Caller: g.Identify("cg-acme"), Route: "/x", Upstream: "openai",
					IP: "203.0.113.9", Attributes: map[string]string{"job": "nightly"}, Estimate: costmodel.Estimate{Model: "gpt-4o"}})
				if res != nil {
					t.Cleanup(func() { res.Cancel(context.Background()) })
				}
				return res, d
			}
			for i := range 3 {
				if res, d := reserve(a); res == nil {
					t.Fatalf("stream %d refused: %+v", i, d)
				}
			}
			if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if res, d := reserve(a); res != nil || d.Status != 429 {
					t.Fatalf("stream %d after the loss, with 3 running on the same replica: %d, want 429", 4+i, d.Status)
				}
			}
			renewNow(t, a)
			if res, d := reserve(b); res != nil || d.Status != 429 {
				t.Fatalf("a 4th stream on another replica after the loss and the renewals: %d, want 429", d.Status)
			}
		})
	}
}
