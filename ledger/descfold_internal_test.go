package ledger

import (
	"math"
	"slices"
	"strconv"
	"testing"
)

// TestDescFold: groups by KeyDesc text sum into one group per counter
// and other columns, each line's amount times the entries, the pending
// part in a group of its own; lines that are not counters are skipped,
// counters of nothing left out, sums saturate; and the answer summed
// again is the same answer.
func TestDescFold(t *testing.T) {
	const a, b = "search\t0\t10\t60\t10\t0\tacme", "tok\t0\t5\t1\t0\t0\tacme"
	line := func(c string, n int64) string { return c + "\t" + strconv.FormatInt(n, 10) }
	in := []Group{
		{KeyDesc: line(a, 2) + "\n" + line(b, 7), Entries: 3},
		{KeyDesc: line(a, 5), Entries: 2, PendingEntries: 1},
		{KeyDesc: line(a, 1) + "\nno amount\n" + line(b, 0) + "\n" + line(b, -3), Entries: 4},
		{KeyDesc: line(b, 9), Entries: 0},                            // counts nothing
		{User: "bob", KeyDesc: line(a, math.MaxInt64/2), Entries: 3}, // saturates
		{User: "bob", KeyDesc: line(a, 1), Entries: 1, PendingEntries: 1},
	}
	want := []Group{
		{User: "bob", KeyDesc: line(a, math.MaxInt64-1), Entries: 1},
		{User: "bob", KeyDesc: line(a, 1), Entries: 1, PendingEntries: 1},
		{KeyDesc: line(b, 21), Entries: 1},
		{KeyDesc: line(a, 2*3+1*4+5), Entries: 1}, // of 2*3+1*4+5*2 on a, 5 pending
		{KeyDesc: line(a, 5), Entries: 1, PendingEntries: 1},
	}
	got := answerOf(GroupBy{User: true, Desc: true}, slices.Clone(in))
	if !slices.Equal(got, want) {
		t.Fatalf("folded:\n got %+v\nwant %+v", got, want)
	}
	if again := answerOf(GroupBy{User: true, Desc: true}, slices.Clone(got)); !slices.Equal(again, want) {
		t.Fatalf("folded again:\n got %+v\nwant %+v", again, want)
	}
	f := newDescFold()
	for i := range in {
		f.add(&in[i])
	}
	if top := f.groups(1); !slices.Equal(top, want[:2]) {
		t.Errorf("the largest counter only: %+v, want %+v", top, want[:2])
	}
}
