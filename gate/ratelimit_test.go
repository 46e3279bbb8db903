package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/weighted"
)

// TestRateLimitAgreesWithRetryAfter debits one limit of each algorithm
// family on an in-memory store with a fixed clock until it refuses: the
// refusal's RateLimit t is its Retry-After (when quota is available again),
// and an admitted request's t is the time until the limit is full again.
func TestRateLimitAgreesWithRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 10, 0, 30, 0, time.UTC) // 30 s into a minute
	tests := []struct {
		name      string
		limit     config.LimitConfig
		admitted  int    // requests admitted before the refusal
		wantAllow string // RateLimit on the first admitted request
		wantDeny  string // RateLimit on the refusal
		retry     string // its Retry-After
	}{
		// 5 a minute: one unit back every 12 s, full again in 60 s.
		{"token bucket", config.LimitConfig{Name: "tb", Algorithm: "token_bucket", Unit: "requests", Rate: 5, Period: time.Minute},
			5, `"tb";r=4;t=12`, `"tb";r=0;t=12`, "12"},
		// The window ends at the minute, 30 s away, for both.
		{"fixed window", config.LimitConfig{Name: "fw", Algorithm: "fixed_window", Unit: "requests", Rate: 2, Period: time.Minute},
			2, `"fw";r=1;t=30`, `"fw";r=0;t=30`, "30"},
		// One slot; a lease runs a minute unless renewed.
		{"concurrency", config.LimitConfig{Name: "cc", Algorithm: "concurrency", Unit: "requests", Rate: 1, Period: time.Minute},
			1, `"cc";r=0;t=60`, `"cc";r=0;t=60`, "60"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			l, err := compileLimit(tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			store := weighted.NewMemory(weighted.MemoryConfig{Now: func() time.Time { return now }})
			items := []weighted.Item{{Limit: l.limit, Key: "{acme}:tenant=acme", Cost: 1}}
			x := &Reservation{limits: []*compiledLimit{l}, items: items}
			for i := range tc.admitted + 1 {
				x.result, err = store.Debit(ctx, fmt.Sprint("r", i), items)
				if err != nil {
					t.Fatal(err)
				}
				if i < tc.admitted != x.result.Allowed {
					t.Fatalf("debit %d: allowed %v", i, x.result.Allowed)
				}
				if i == 0 {
					if got := x.admitted().RateLimit.Field(); got != tc.wantAllow {
						t.Errorf("admitted: RateLimit = %q, want %q", got, tc.wantAllow)
					}
				}
			}
			d := x.deny()
			if retry := fmt.Sprint(d.RetryAfter); d.Status != 429 || retry != tc.retry || d.RateLimit.Field() != tc.wantDeny {
				t.Errorf("refused: %d, Retry-After %q, RateLimit %q; want 429, %q, %q", d.Status, retry, d.RateLimit.Field(), tc.retry, tc.wantDeny)
			}
			if want := fmt.Sprintf(`"%s";q=%d;w=60;qu="requests"`, tc.limit.Name, tc.limit.Rate); d.RateLimit.PolicyField() != want {
				t.Errorf("RateLimit-Policy = %q, want %q", d.RateLimit.PolicyField(), want)
			}
		})
	}
}
