package weighted

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestClaimLossAtkLostClaimIsNoClaim: replica a settles a reservation and
// claims its end; the store then loses its data, the claim with it. A
// second end of the reservation (a release on replica b) must not win a
// claim that the loss erased: on a store with generation markers, a
// claimed settle that finds no claim and a tag's marker missing (or
// behind) changes nothing and fails with a *StaleError naming that tag
// alone. Once the tag is restored, the claim decides again. A claim that
// survives answers as before, marker or not. Before, the second end won
// and gave the reservation back to the limits, after it was settled.
func TestClaimLossAtkLostClaimIsNoClaim(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	r := newBatchStore(c, newClock(), RedisConfig{Generations: true})
	lim := Limit{Name: "fw", Algorithm: FixedWindow, Rate: 1000, Period: time.Hour}
	items := []Item{{Limit: lim, Key: "{acme}:t", Cost: 100}, {Limit: lim, Key: "{global}:m", Cost: 100}}
	if err := r.Restore(ctx, items, []int64{0, 0}); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Debit(ctx, "id1", items); err != nil || !res.Allowed {
		t.Fatalf("debit: %+v %v", res, err)
	}
	cl := Claim{Key: "{acme}:held:id1", Value: "settled by a", TTL: time.Minute}
	if won, _, err := r.SettleClaimed(ctx, "id1", items, []int64{300, 300}, cl); err != nil || !won {
		t.Fatalf("a's settle: won %v, %v", won, err)
	}
	// The claim survives, its marker gone: the claim answers.
	if err := c.Del(ctx, r.markerKey("acme")).Err(); err != nil {
		t.Fatal(err)
	}
	rel := Claim{Key: cl.Key, Value: "released by b", TTL: time.Minute}
	if won, prior, err := r.SettleClaimed(ctx, "id1", items, nil, rel); err != nil || won || prior != cl.Value {
		t.Fatalf("with the claim kept: won %v, prior %q, %v", won, prior, err)
	}
	// The claim and acme's state lost, {global}'s kept.
	if err := c.Del(ctx, cl.Key, "{acme}:t").Err(); err != nil {
		t.Fatal(err)
	}
	won, _, err := r.SettleClaimed(ctx, "id1", items, nil, rel)
	var se *StaleError
	if !errors.As(err, &se) || won || len(se.Tags) != 1 || se.Tags[0] != "acme" {
		t.Fatalf("with the claim lost: won %v, %v; want a *StaleError of acme alone", won, err)
	}
	if n, _ := c.Exists(ctx, cl.Key).Result(); n != 0 {
		t.Fatal("a stale claimed settle wrote its claim")
	}
	if err := r.Restore(ctx, items, []int64{300, 300}); err != nil {
		t.Fatal(err)
	}
	if won, _, err := r.SettleClaimed(ctx, "id1", items, nil, rel); err != nil || !won {
		t.Fatalf("after the restore: won %v, %v", won, err)
	}
}
