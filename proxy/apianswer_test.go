package proxy

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// FuzzAnswerJSON holds the hand-written reserve and settle answers to
// encoding/json's encoding of the same values, byte for byte: every
// string escaped as it escapes it (quotes, control bytes, HTML
// characters, invalid UTF-8, U+2028), the friction's empty members left
// out.
func FuzzAnswerJSON(f *testing.F) {
	f.Add("cg1.abc", "req_0123", "2026-12-03T07:00:00Z", "0.000015", "allow", "gpt-4o-mini", "over budget", int64(1), int64(-5), int64(1<<62), false, true)
	f.Add("a\"b\\c", "<script>&", "\u2028\u2029", "\xff\xfe", "\x00\x1f\b\f\n\r\t", "é", "", int64(0), int64(0), int64(-1<<63), true, false)
	f.Fuzz(func(t *testing.T, s1, s2, s3, s4, s5, s6, s7 string, n1, n2, n3 int64, b1, b2 bool) {
		answers := []interface{ appendJSON([]byte) []byte }{
			&reserveAnswer{ReservationID: s1, RequestID: s2, ExpiresAt: s3,
				Estimate: estimateJSON{Requests: n1, InputTokens: n2, OutputTokens: n3, Units: n1 ^ n2, CostUSD: s4, CostNanoUSD: costmodel.NanoUSD(n3)},
				Degraded: b1},
			&reserveAnswer{ReservationID: s5, Friction: &frictionJSON{DelayMS: n1, CapMaxTokens: n2, DowngradeModel: s6, Warning: s7}, Degraded: b2},
			&reserveAnswer{Friction: &frictionJSON{}},
			&reserveAnswer{Friction: &frictionJSON{Warning: s1}},
			&settleAnswer{ReservationID: s1, RequestID: s2, Status: s5, CostUSD: s4, CostNanoUSD: costmodel.NanoUSD(n1), AlreadySettled: b1},
		}
		for _, a := range answers {
			var want bytes.Buffer
			if err := json.NewEncoder(&want).Encode(a); err != nil {
				t.Fatal(err)
			}
			if got := a.appendJSON([]byte("x")); !bytes.Equal(got[1:], want.Bytes()) || got[0] != 'x' {
				t.Fatalf("%+v:\n got %s\nwant %s", a, got, want.Bytes())
			}
		}
	})
}
