package ledger

import "testing"

// TestRecordPlan: a spool record keeps the plan of its caller, with any
// key model, extra usage and requests before it; a record without one
// ends where earlier versions' end, and such a record (an earlier
// version's) reads as naming none, even into a reused record.
func TestRecordPlan(t *testing.T) {
	for _, keyModel := range []string{"", "gpt-4o"} {
		for _, requests := range []int64{1, 3} {
			r := sampleRecord("x")
			r.e.Plan, r.e.KeyModel, r.e.Requests = "free", keyModel, requests
			var got record
			if _, err := readFrame(appendFrame(nil, &r), &got, nil); err != nil || got != r {
				t.Fatalf("key model %q, %d requests: read back %+v, %v", keyModel, requests, got.e, err)
			}
		}
	}
	plain, planned := sampleRecord("y"), sampleRecord("y")
	plain.e.Requests, planned.e.Requests, planned.e.Plan = 1, 1, "free"
	old := appendFrame(nil, &plain)
	if len(old) >= len(appendFrame(nil, &planned)) {
		t.Fatalf("a record without a plan is not shorter than one with")
	}
	got := record{e: Entry{Plan: "stale"}}
	if _, err := readFrame(old, &got, nil); err != nil || got.e.Plan != "" {
		t.Fatalf("a record without a plan reads as %q, %v; want none", got.e.Plan, err)
	}
}
