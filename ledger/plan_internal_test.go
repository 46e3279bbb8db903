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
		gs, err := readGroups(context.Background(), s, spendQueryKey{by: GroupBy{Plan: true}}, at.Add(-time.Hour), at.Add(time.Hour))
		if err != nil || len(gs) != 1 || gs[0].Plan != "" || gs[0].Counts.Requests != 1 {
			t.Fatalf("an entry stored before plans, by plan = %+v, %v; want 1 request of no plan", gs, err)
		}
	})
}

// TestRecordKeyIPAttrs: a spool record keeps the key ip and attributes,
// with or without a plan, key model and requests before them; a record
// without them ends where earlier versions' end, and such a record reads
// as naming none, even into a reused record.
func TestRecordKeyIPAttrs(t *testing.T) {
	for _, plan := range []string{"", "free"} {
		for _, keyModel := range []string{"", "gpt-4o"} {
			for _, keys := range [][2]string{{"192.0.2.1", ""}, {"", "project=a:team=%25%FF"}, {"2001:db8::/64", "project=x"}} {
				r := sampleRecord("x")
				r.e.Plan, r.e.KeyModel, r.e.Requests, r.e.KeyIP, r.e.KeyAttrs = plan, keyModel, 1, keys[0], keys[1]
				var got record
				if _, err := readFrame(appendFrame(nil, &r), &got, nil); err != nil || got != r {
					t.Fatalf("plan %q, key model %q, keys %q: read back %+v, %v", plan, keyModel, keys, got.e, err)
				}
			}
		}
	}
	plain, keyed := sampleRecord("y"), sampleRecord("y")
	plain.e.Requests, keyed.e.Requests, keyed.e.KeyIP = 1, 1, "192.0.2.1"
	old := appendFrame(nil, &plain)
	if len(old) >= len(appendFrame(nil, &keyed)) {
		t.Fatalf("a record without key ip is not shorter than one with")
	}
	got := record{e: Entry{KeyIP: "stale", KeyAttrs: "stale"}}
	if _, err := readFrame(old, &got, nil); err != nil || got.e.KeyIP != "" || got.e.KeyAttrs != "" {
		t.Fatalf("a record without key ip reads as %q %q, %v; want none", got.e.KeyIP, got.e.KeyAttrs, err)
	}
}

// TestCountsOfEntriesStoredBeforeKeyIP: an entry a store held before
// migration 007, embedded or PostgreSQL, records no key ip nor
// attributes once migrated: grouped by them, it is in the group of the
// empty ones, which a limiter puts on no counter of a limit keyed by
// them.
func TestCountsOfEntriesStoredBeforeKeyIP(t *testing.T) {
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	e := &Entry{RequestID: "r1", Tenant: "acme", Decision: "allow", Status: StatusSettled, HTTPStatus: 200, Requests: 1,
		CreatedAt: at, SettledAt: at, Plan: "free", KeyIP: "192.0.2.1", KeyAttrs: "project=a"}
	storedBefore(t, "key_ip", e, func(t *testing.T, s store) {
		gs, err := readGroups(context.Background(), s, spendQueryKey{tenant: "acme", by: GroupBy{IP: true, Attrs: true, Plan: true}},
			at.Add(-time.Hour), at.Add(time.Hour))
		if err != nil || len(gs) != 1 || gs[0].KeyIP != "" || gs[0].KeyAttrs != "" || gs[0].Plan != "free" || gs[0].Counts.Requests != 1 {
			t.Fatalf("an entry stored before key ip, by ip and attributes = %+v, %v; want 1 request of none, plan free", gs, err)
		}
	})
}
