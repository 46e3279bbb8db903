package rls

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestBoundedTextReadsTheHeadOnly: boundedText escapes only the first
// bound bytes of a long value, and reads every value as escaping it whole
// and cutting would (the reading the counters and the ledger hold), for
// values of every length around the bound, with escapes ('%', NUL,
// braces, bytes that are not UTF-8) and runes of 2 to 4 bytes at the cut.
func TestBoundedTextReadsTheHeadOnly(t *testing.T) {
	whole := func(v string, tag bool, bound int) string {
		t := ledgerText(v, tag)
		if len(t) <= bound {
			return t
		}
		sum := sha256.Sum256([]byte(v))
		cut := bound - digestLen
		for cut > 0 && !utf8.RuneStart(t[cut]) {
			cut--
		}
		return t[:cut] + "%~" + hex.EncodeToString(sum[:])
	}
	pieces := []string{"a", "%", "\x00", "{", "}", "\xff", "é", "€", "😀", "\xe2\x82"}
	rng := rand.New(rand.NewPCG(1, 2))
	const bound = 100
	for range 20000 {
		var b strings.Builder
		for n := rng.IntN(3 * bound); b.Len() < n; {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		v := b.String()
		for _, tag := range []bool{false, true} {
			if got, want := boundedText(v, tag, bound), whole(v, tag, bound); got != want {
				t.Fatalf("boundedText(%q, %v) = %q, want %q", v, tag, got, want)
			}
		}
	}
}
