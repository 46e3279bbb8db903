package gate

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
)

// TestResumePastExpiry: a settle or release retried past a held
// reservation's expiry is told how the reservation ended before it: the
// first settlement (again) and ErrSettled, or ErrReleased and no error;
// ErrExpired only when it expired (settled at its estimate). On the
// replica that holds it, before or after its expiry pass; with Redis, on
// another replica too, whichever replica ended it. Without Redis another
// replica knows nothing of it: ErrExpired. The limit moves by each first
// end alone, and the holder forgets an ended hold claimGrace after its
// expiry (its ledger, and the claim in Redis, still tell).
func TestResumePastExpiry(t *testing.T) {
	t.Run("memory", func(t *testing.T) { resumePastExpiry(t, "") })
	t.Run("redis", func(t *testing.T) {
		resumePastExpiry(t, fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}", redistest.New(t).URL))
	})
}

// heldEnd is how a test ends a held reservation before its expiry.
type heldEnd string

const (
	endSettle  heldEnd = "settled"
	endRelease heldEnd = "released"
	endNone    heldEnd = "expired"
)

func resumePastExpiry(t *testing.T, store string) {
	const limits = `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 1000000, period: 24h}`
	// ttl is the shortest the reserve API accepts; the ends before the
	// expiry must fit in it.
	const ttl = time.Second
	const cost = costmodel.NanoUSD(1234)
	shared := store != ""
	ctx := context.Background()
	a, b := openAcme(t, store+limits), openAcme(t, store+limits) // a holds the reservations
	replica := map[*Gate]string{a: "the holder", b: "another replica"}
	type testCase struct {
		end        heldEnd
		endOn      *Gate
		retryOn    *Gate
		expiryPass bool // the holder's expiry pass has run before the retry
		id         string
		exp        time.Time
	}
	var cases []*testCase
	for _, end := range []heldEnd{endSettle, endRelease, endNone} {
		for _, endOn := range []*Gate{a, b} {
			for _, retryOn := range []*Gate{a, b} {
				for _, pass := range []bool{false, true} {
					if endOn == b && (!shared || end == endNone) {
						continue // without Redis, b cannot end a's reservation
					}
					cases = append(cases, &testCase{end: end, endOn: endOn, retryOn: retryOn, expiryPass: pass})
				}
			}
		}
	}
	name := func(tc *testCase) string {
		s := fmt.Sprintf("%s on %s, retried on %s", tc.end, replica[tc.endOn], replica[tc.retryOn])
		if tc.expiryPass {
			s += " after its expiry pass"
		}
		return s
	}
	ca, cb := a.Identify("cg-acme"), b.Identify("cg-acme")
	caller := map[*Gate]*Caller{a: ca, b: cb}
	for _, tc := range cases {
		res, d := a.Reserve(ctx, &Request{Caller: ca, Route: "/v1/costgate/reserve",
			Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 100}}})
		if res == nil {
			t.Fatalf("refused: %+v", d)
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatal(d)
		}
		tc.id, tc.exp = res.Hold(ttl)
	}
	var used int64
	for _, tc := range cases {
		r, _, err := tc.endOn.Resume(context.Background(), caller[tc.endOn], tc.id)
		if err != nil {
			t.Fatalf("%s: resume before the expiry: %v", name(tc), err)
		}
		switch tc.end {
		case endSettle:
			if _, again, err := r.SettleHeld(ctx, Charge{Usage: costmodel.Usage{InputTokens: 30}, Cost: cost, HTTPStatus: 200}); err != nil || again {
				t.Fatalf("%s: settle before the expiry: again %v, %v", name(tc), again, err)
			}
			used += 30
		case endRelease:
			if err := r.Release(ctx); err != nil {
				t.Fatalf("%s: release before the expiry: %v", name(tc), err)
			}
		case endNone:
			used += 100 // settled at its estimate when it expires
		}
	}
	last := cases[len(cases)-1].exp
	for time.Now().Before(last) {
		time.Sleep(10 * time.Millisecond) // polls the wall clock past the TTL
	}
	retry := func(tc *testCase) {
		t.Helper()
		g, c := tc.retryOn, caller[tc.retryOn]
		known := shared || tc.retryOn == a
		want := tc.end
		if !known {
			want = endNone
		}
		for i := range 2 { // a retry changes nothing: the second is told the same
			r, _, err := g.Resume(context.Background(), c, tc.id)
			if want == endNone {
				if !errors.Is(err, ErrExpired) {
					t.Errorf("%s: resume %d: %v, want ErrExpired", name(tc), i, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s: resume %d: %v", name(tc), i, err)
				continue
			}
			got, again, err := r.SettleHeld(ctx, Charge{Usage: costmodel.Usage{InputTokens: 400}, Cost: 9 * cost, HTTPStatus: 200})
			rerr := r.Release(ctx)
			switch want {
			case endSettle:
				if err != nil || !again || got.Cost != cost {
					t.Errorf("%s: settle %d: %+v again %v %v; want the first one's cost %d, again", name(tc), i, got, again, err, cost)
				}
				if !errors.Is(rerr, ErrSettled) {
					t.Errorf("%s: release %d: %v, want ErrSettled", name(tc), i, rerr)
				}
			case endRelease:
				if !errors.Is(err, ErrReleased) {
					t.Errorf("%s: settle %d: %+v again %v %v, want ErrReleased", name(tc), i, got, again, err)
				}
				if rerr != nil {
					t.Errorf("%s: release %d: %v, want none", name(tc), i, rerr)
				}
			}
		}
	}
	for _, tc := range cases {
		if !tc.expiryPass {
			retry(tc)
		}
	}
	a.expireHolds(time.Now())
	for _, tc := range cases {
		if tc.expiryPass {
			retry(tc)
		}
	}
	a.expireHolds(time.Now())
	if left := tpmLeft(t, a); left != 1000000-used-1 {
		t.Errorf("tpm has %d left; want %d used", left, used)
	}

	// The holder keeps an ended hold at least claimGrace past its expiry,
	// then forgets it; the claim in Redis tells still.
	var settled *testCase
	for _, tc := range cases {
		if tc.end == endSettle && tc.endOn == a && tc.retryOn == a {
			settled = tc
		}
	}
	a.expireHolds(last.Add(claimGrace - time.Second))
	if r, _, err := a.Resume(context.Background(), ca, settled.id); err != nil {
		t.Errorf("claimGrace past the expiry, less a second: %v", err)
	} else if _, again, err := r.SettleHeld(ctx, Charge{Cost: 9 * cost}); err != nil || !again {
		t.Errorf("claimGrace past the expiry, less a second: again %v, %v", again, err)
	}
	a.expireHolds(last.Add(3 * claimGrace))
	a.expireHolds(last.Add(5 * claimGrace))
	a.holds.mu.Lock()
	n := len(a.holds.m) + len(a.holds.ended[0]) + len(a.holds.ended[1])
	a.holds.mu.Unlock()
	if n != 0 {
		t.Errorf("%d holds kept past claimGrace", n)
	}
	// Once the hold is forgotten, the holder's ledger (and with Redis the
	// claim there) still tells the first settlement.
	r, _, err := a.Resume(context.Background(), ca, settled.id)
	if err != nil {
		t.Errorf("once the hold is forgotten: %v", err)
	} else if got, again, err := r.SettleHeld(ctx, Charge{Cost: 9 * cost}); err != nil || !again || got.Cost != cost {
		t.Errorf("once the hold is forgotten: %+v again %v %v; want the first one's cost %d, again", got, again, err, cost)
	}
}

// tpmLeft returns what acme's one limit has left on g, less the 1 token
// it reserves to see it.
func tpmLeft(t *testing.T, g *Gate) int64 {
	t.Helper()
	ctx := context.Background()
	res, d := g.Reserve(ctx, &Request{Caller: g.Identify("cg-acme"), Route: "/x", States: true,
		Estimate: costmodel.Estimate{Usage: costmodel.Usage{InputTokens: 1}}})
	if res != nil {
		res.Cancel(ctx)
	}
	if len(d.Limits) != 1 {
		t.Fatalf("limits %+v; want tpm alone", d.Limits)
	}
	return d.Limits[0].Remaining
}
