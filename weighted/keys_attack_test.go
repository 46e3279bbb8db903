package weighted

import (
	"context"
	"testing"
	"time"
)

// TestKeysAtkOneToOne: two items of one limit whose keys differ are two
// counters, in Memory and in Redis alike, whatever the keys hold: a key
// without a hash tag is wrapped in one on Redis (its slot is its own),
// and that wrapping must never give the key of another item, with a tag
// or without. Before, "x" and "{x}", "" and "_", "}x" and "_}x" were one
// Redis key each (the in-memory store kept them apart): a caller spending
// one spent the other.
func TestKeysAtkOneToOne(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	lim := Limit{Name: "k", Rate: 2, Period: time.Hour}
	pairs := [][2]string{{"x", "{x}"}, {"", "_"}, {"}x", "_}x"}, {"_", "{_}"}, {"x}", "{x}}"}, {"{}x", "_{}x"}, {"a{b}c", "{b}"}}
	for _, st := range bothStores(c, newClock()) {
		for _, p := range pairs {
			spent := []Item{{Limit: lim, Key: p[0], Cost: 2}}
			if res, err := st.Store.Debit(ctx, st.name+"-"+p[0], spent); err != nil || !res.Allowed {
				t.Fatalf("%s: debit of %q: %+v, %v", st.name, p[0], res, err)
			}
			res, err := st.Store.Peek(ctx, []Item{{Limit: lim, Key: p[1], Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Allowed || res.Items[0].Remaining != 2 {
				t.Errorf("%s: key %q after key %q spent its limit: %+v, want 2 left", st.name, p[1], p[0], res.Items[0])
			}
			if err := st.Store.Reset(ctx, spent); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestKeysAtkRedisKeysAreOneToOne: every item key of up to five of the
// characters that make hash tags ('{', '}', '_', 'x') has a Redis key of
// its own, whose hash tag is not empty.
func TestKeysAtkRedisKeysAreOneToOne(t *testing.T) {
	r := NewRedis(nil, RedisConfig{})
	lim := Limit{Name: "k", Rate: 1, Period: time.Second}
	seen := map[string]string{}
	var walk func(k string)
	walk = func(k string) {
		rk := r.key(&Item{Limit: lim, Key: k})
		if other, ok := seen[rk]; ok {
			t.Fatalf("item keys %q and %q are both Redis key %q", other, k, rk)
		}
		seen[rk] = k
		if !hasHashTag(rk) {
			t.Fatalf("item key %q: Redis key %q has no hash tag", k, rk)
		}
		if len(k) < 5 {
			for _, c := range "{}_x" {
				walk(k + string(c))
			}
		}
	}
	walk("")
}
