package gate

import (
	"testing"
	"time"

	"github.com/costgate/costgate/weighted"
)

// TestDescLineRoundTrip: a descriptor counter's line reads back as the
// limit, the key byte for byte and the amount written, whatever bytes the
// name and the key hold (tabs, newlines, '%', NUL, bytes that are not
// UTF-8), and is valid text of no tab or newline but its separators.
func TestDescLineRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    weighted.Limit
		key  string
	}{
		{"plain", weighted.Limit{Name: "search", Algorithm: weighted.FixedWindow, Rate: 10, Period: 24 * time.Hour}, "{acme}:search"},
		{"bytes", weighted.Limit{Name: "a\tb%\n", Algorithm: weighted.GCRA, Rate: 5, Period: time.Second, Burst: 7},
			"{acme}:\xff\x00\t\n%25:é\x7f"},
		{"month", weighted.Limit{Name: "m", Algorithm: weighted.FixedWindow, Rate: 1, Calendar: weighted.Month}, "{acme}:x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line := string(appendDescLine(nil, tc.l, tc.key, 42))
			cs := parseDesc(line + "\n" + line)
			if len(cs) != 2 || cs[0].limit != tc.l || cs[0].key != tc.key || cs[0].n != 42 {
				t.Fatalf("%q read back as %+v", line, cs)
			}
		})
	}
	if cs := parseDesc("x\t1\t2\n\tbad"); len(cs) != 0 {
		t.Fatalf("lines of no counter read as %+v", cs)
	}
}
