package gate

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// claimSprintf is how claims were written with fmt, and how replicas of
// earlier versions still write them: encode must write the same text, so
// that replicas of both versions read each other's claims.
func claimSprintf(c claim) string {
	status := string(c.status)
	if status == "" {
		status = "-"
	}
	return fmt.Sprintf("%d %d %s %s", c.state, c.cost, status, c.token)
}

// TestClaimEncode: encode writes a claim as fmt did, and decodeClaim reads
// back every field.
func TestClaimEncode(t *testing.T) {
	cases := []struct {
		name string
		c    claim
	}{
		{"settled", claim{state: holdSettled, cost: 18000, status: ledger.StatusSettled, token: "0123456789abcdef"}},
		{"settled at no cost", claim{state: holdSettled, status: ledger.StatusFailed, token: "ffffffffffffffff"}},
		{"released, no status", claim{state: holdReleased, token: "00000000000000aa"}},
		{"expired", claim{state: holdExpired, cost: 1, token: "a1b2c3d4e5f60718"}},
		{"negative cost", claim{state: holdSettled, cost: -42, status: ledger.StatusSettled, token: "0000000000000001"}},
		{"largest cost", claim{state: holdSettled, cost: costmodel.NanoUSD(math.MaxInt64), status: ledger.StatusSettled, token: "0000000000000002"}},
		{"smallest cost", claim{state: holdSettled, cost: costmodel.NanoUSD(math.MinInt64), status: ledger.StatusSettled, token: "0000000000000003"}},
		{"settled with its bill", settledClaim(Charge{Usage: costmodel.Usage{InputTokens: 300, CachedInputTokens: 20, OutputTokens: 7, ServiceTier: "flex"},
			Cost: 300_000_000, Status: ledger.StatusSettled, Model: "gpt-4o mini {x}", HTTPStatus: 200})},
		{"settled with an empty bill", settledClaim(Charge{})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.c.encode()
			head, _, _ := strings.Cut(got, " {")
			if want := claimSprintf(tc.c); head != want {
				t.Fatalf("encode = %q, want %q and the bill's JSON", got, want)
			}
			back, ok := decodeClaim(got)
			if !ok || back != tc.c {
				t.Fatalf("decodeClaim(%q) = %+v, %v; want %+v", got, back, ok, tc.c)
			}
		})
	}
}

// FuzzClaimEncode holds encode to fmt's form for any claim.
func FuzzClaimEncode(f *testing.F) {
	f.Add(uint8(holdSettled), int64(18000), "settled", "0123456789abcdef")
	f.Add(uint8(holdReleased), int64(0), "", "")
	f.Fuzz(func(t *testing.T, state uint8, cost int64, status, token string) {
		c := claim{state: holdState(state), cost: costmodel.NanoUSD(cost), status: ledger.Status(status), token: token}
		if got, want := c.encode(), claimSprintf(c); got != want {
			t.Fatalf("encode = %q, want %q", got, want)
		}
	})
}

// TestClaimDecodeEarlier: decodeClaim reads the claims of earlier
// versions, which carry no bill (three or four fields), and a claim
// whose bill cannot be read as one without it.
func TestClaimDecodeEarlier(t *testing.T) {
	cases := []struct {
		name, v string
		want    claim
	}{
		{"no token", "1 300000000 settled", claim{state: holdSettled, cost: 300_000_000, status: ledger.StatusSettled}},
		{"token", "2 0 - 0123456789abcdef", claim{state: holdReleased, token: "0123456789abcdef"}},
		{"unreadable bill", "1 5 settled 0123456789abcdef {\"u\":", claim{state: holdSettled, cost: 5, status: ledger.StatusSettled, token: "0123456789abcdef"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got, ok := decodeClaim(tc.v); !ok || got != tc.want {
				t.Errorf("decodeClaim(%q) = %+v, %v; want %+v", tc.v, got, ok, tc.want)
			}
		})
	}
}
