package weighted_test

import (
	"context"
	"fmt"
	"time"

	"github.com/costgate/costgate/weighted"
)

// A request is debited under two limits at once: 1000 tokens a minute and 3
// requests a minute for tenant acme. Its estimate is reserved first and
// settled once the upstream has reported the actual usage.
func Example() {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := weighted.NewMemory(weighted.MemoryConfig{Now: func() time.Time { return now }})

	tokens := weighted.Limit{Name: "tenant-tokens", Algorithm: weighted.TokenBucket, Rate: 1000, Period: time.Minute}
	requests := weighted.Limit{Name: "tenant-requests", Algorithm: weighted.FixedWindow, Rate: 3, Period: time.Minute}
	request := func(estimate int64) []weighted.Item {
		return []weighted.Item{
			{Limit: tokens, Key: "{acme}", Cost: estimate},
			{Limit: requests, Key: "{acme}", Cost: 1},
		}
	}

	res, _ := store.Debit(ctx, "req-1", request(800))
	fmt.Println("req-1 allowed:", res.Allowed, "tokens left:", res.Items[0].Remaining)

	// The upstream used 300 tokens, not 800: the rest is refunded.
	_ = store.Settle(ctx, "req-1", request(800), []int64{300, 1})
	_ = store.Settle(ctx, "req-1", request(800), []int64{300, 1}) // a retry changes nothing

	res, _ = store.Debit(ctx, "req-2", request(600))
	fmt.Println("req-2 allowed:", res.Allowed, "tokens left:", res.Items[0].Remaining)

	res, _ = store.Debit(ctx, "req-3", request(800))
	fmt.Println("req-3 allowed:", res.Allowed, "tokens left:", res.Items[0].Remaining, "retry after:", res.RetryAfter)

	_, err := store.Debit(ctx, "req-4", request(5000))
	fmt.Println(err)
	// Output:
	// req-1 allowed: true tokens left: 200
	// req-2 allowed: true tokens left: 100
	// req-3 allowed: false tokens left: 100 retry after: 42s
	// weighted: limit "tenant-tokens": cost 5000 exceeds capacity 1000
}

// A budget of $500 per tenant per UTC calendar month, counted in
// nano-dollars (costgate's unit of money, costmodel.NanoUSD: $1 is
// 1_000_000_000):
// the window ends at 00:00 UTC on the 1st of the next month, whatever the
// month's length.
func ExampleCalendar() {
	ctx := context.Background()
	now := time.Date(2028, 2, 28, 18, 0, 0, 0, time.UTC)
	store := weighted.NewMemory(weighted.MemoryConfig{Now: func() time.Time { return now }})

	budget := weighted.Limit{Name: "budget", Algorithm: weighted.FixedWindow, Rate: 500_000_000_000, Calendar: weighted.Month}
	fmt.Println(budget)
	spend := func(id string, nanoDollars int64) {
		res, err := store.Debit(ctx, id, []weighted.Item{{Limit: budget, Key: "{acme}", Cost: nanoDollars}})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(id, "allowed:", res.Allowed, "left:", res.Items[0].Remaining, "retry after:", res.RetryAfter)
	}

	spend("req-1", 450_000_000_000)                   // $450
	spend("req-2", 100_000_000_000)                   // $100; February 2028 has 29 days
	now = time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC) // a new month
	spend("req-3", 100_000_000_000)
	// Output:
	// budget: fixed_window 500000000000/month
	// req-1 allowed: true left: 50000000000 retry after: 0s
	// req-2 allowed: false left: 50000000000 retry after: 30h0m0s
	// req-3 allowed: true left: 400000000000 retry after: 0s
}
