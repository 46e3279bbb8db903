package gate

import (
	"fmt"
	"testing"
	"time"
)

// TestKeyCapExpiry: a counter is held until its expiry, and no longer: a
// tenant at its cap is refused a new counter, with the time its first
// one expires, until then, and admitted from then on; a counter written
// again (a settlement, a renewal) is held from then; the counters and
// tenants whose counters all expired are forgotten (tenants named once
// do not pile up), and the count in all follows.
func TestKeyCapExpiry(t *testing.T) {
	k := newKeyCap()
	t0 := time.Unix(1_700_000_000, 0).UnixNano()
	sec := int64(time.Second)
	one := func(i int) []uint64 { return []uint64{uint64(i)} }
	at := func(t int64) []int64 { return []int64{t} }
	for i := range 6 {
		if ok, _, _ := k.admit("acme", false, one(i), at(t0+sec+int64(i)), 6, t0); !ok {
			t.Fatalf("counter %d of 6 refused", i)
		}
	}
	if ok, next, _ := k.admit("acme", false, one(6), at(t0+sec), 6, t0); ok || next != t0+sec {
		t.Fatalf("the 7th counter: admitted %v, next %d; want refused until %d", ok, next-t0, sec)
	}
	if ok, _, _ := k.admit("acme", false, one(3), at(t0+2*sec), 6, t0); !ok {
		t.Fatal("a counter held was refused")
	}
	k.refresh("acme", false, one(0), at(t0+3*sec))
	if ok, _, _ := k.admit("acme", false, one(6), at(t0+2*sec), 6, t0+sec-1); ok {
		t.Fatal("admitted before any counter expired")
	}
	// At t0+sec+2, counters 1 and 2 have expired (0 and 3 were held longer).
	if ok, _, _ := k.admit("acme", false, []uint64{6, 7}, []int64{t0 + 4*sec, t0 + 4*sec}, 6, t0+sec+2); !ok {
		t.Fatal("two new counters refused once two had expired")
	}
	if n := k.held("acme", time.Unix(0, t0+sec+2)); n != 6 {
		t.Errorf("acme holds %d counters, want 6", n)
	}
	for i := range 100 {
		k.admit(fmt.Sprint("named-once-", i), true, one(i), at(t0+sec), 6, t0)
	}
	k.expire(time.Unix(0, t0+5*sec))
	tenants := 0
	for i := range k.shards {
		tenants += len(k.shards[i].tenants)
	}
	if tenants != 0 || k.n.Load() != 0 || k.named.Load() != 0 {
		t.Errorf("once every counter expired: %d tenants and %d counters held (%d of named tenants)", tenants, k.n.Load(), k.named.Load())
	}
}
