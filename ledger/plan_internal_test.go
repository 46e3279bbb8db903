package ledger

import (
	"context"
	"testing"
	"time"
)

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

// TestCountsOfEntriesStoredBeforePlan: an entry a store held before
// migration 006, embedded or PostgreSQL, records no plan once migrated:
// grouped by plan, it is in the empty plan's group, which counts on
// every limit of some plans (refusing early after a loss, never late).
func TestCountsOfEntriesStoredBeforePlan(t *testing.T) {
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	e := &Entry{RequestID: "r1", Tenant: "acme", Decision: "allow", Status: StatusSettled, HTTPStatus: 200, Requests: 1,
		CreatedAt: at, SettledAt: at, Plan: "free"}
	storedBefore(t, "plan", e, func(t *testing.T, s store) {
		gs, err := s.countsBy(context.Background(), spendQueryKey{by: GroupBy{Plan: true}}, at.Add(-time.Hour), at.Add(time.Hour), MaxGroups)
		if err != nil || len(gs) != 1 || gs[0].Plan != "" || gs[0].Counts.Requests != 1 {
			t.Fatalf("an entry stored before plans, by plan = %+v, %v; want 1 request of no plan", gs, err)
		}
	})
}
