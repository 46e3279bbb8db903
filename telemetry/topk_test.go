package telemetry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestSpaceSavingSkewed checks the Space-Saving guarantees on a Zipf stream
// against exact counts: every reported count is an upper bound whose error
// is at most MaxError, MaxError is at most N/k, and every key with a true
// count above N/k is reported.
func TestSpaceSavingSkewed(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		keys     uint64
		s        float64
		n        int
	}{
		{"steep", 50, 10_000, 1.5, 100_000},
		{"flat", 100, 5_000, 1.1, 100_000},
		{"tiny", 5, 1_000, 1.3, 20_000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.capacity)))
			zipf := rand.NewZipf(rng, tc.s, 1, tc.keys-1)
			clock := newFakeClock()
			top := newTopK(tc.capacity, 5*time.Minute)
			exact := map[string]int64{}
			for range tc.n {
				k := fmt.Sprintf("key-%d", zipf.Uint64())
				exact[k]++
				top.add(clock.Now(), "rpm", k, "tenant")
			}
			got := top.top(clock.Now(), tc.capacity)
			bound := int64(tc.n / tc.capacity)
			reported := map[string]bool{}
			for _, th := range got {
				reported[th.Key] = true
				truth := exact[th.Key]
				if truth > th.Count || truth < th.Count-th.MaxError {
					t.Errorf("%s: true count %d outside [%d, %d]", th.Key, truth, th.Count-th.MaxError, th.Count)
				}
				if th.MaxError > bound {
					t.Errorf("%s: MaxError %d > N/k = %d", th.Key, th.MaxError, bound)
				}
			}
			for k, c := range exact {
				if c > bound && !reported[k] {
					t.Errorf("%s: true count %d > N/k = %d but not reported", k, c, bound)
				}
			}
			// The heaviest key of a Zipf stream is far above the bound: it
			// must come first.
			if got[0].Key != "key-0" {
				t.Errorf("top key = %s, want key-0", got[0].Key)
			}
		})
	}
}

// TestTopKWindows checks that counts age out: a report covers the current
// and the previous window, with the merged bounds still holding, and events
// two windows old are gone.
func TestTopKWindows(t *testing.T) {
	clock := newFakeClock()
	const w = time.Minute
	top := newTopK(3, w)
	add := func(key string, n int) {
		for range n {
			top.add(clock.Now(), "l", key, "t-"+key)
		}
	}
	add("a", 10)
	add("b", 5)
	clock.Advance(w)
	add("c", 7)
	add("d", 1)
	add("e", 2) // fills the current summary: a key missing from it may have had up to 1
	got := top.top(clock.Now(), 10)
	want := []Throttled{
		{Key: "a", Limit: "l", Tenant: "t-a", Count: 11, MaxError: 1},
		{Key: "c", Limit: "l", Tenant: "t-c", Count: 7},
		{Key: "b", Limit: "l", Tenant: "t-b", Count: 6, MaxError: 1},
		{Key: "e", Limit: "l", Tenant: "t-e", Count: 2},
		{Key: "d", Limit: "l", Tenant: "t-d", Count: 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after one window:\n got %v\nwant %v", got, want)
	}
	clock.Advance(w)
	if got := top.top(clock.Now(), 10); len(got) != 3 || got[0].Key != "c" || got[0].Count != 7 || got[0].MaxError != 0 {
		t.Fatalf("after two windows: %v, want c=7, e=2, d=1 only", got)
	}
	clock.Advance(3 * w)
	if got := top.top(clock.Now(), 10); len(got) != 0 {
		t.Fatalf("after an idle gap: %v, want nothing", got)
	}
	if got := top.top(clock.Now(), 0); got == nil || len(got) != 0 {
		t.Fatalf("top(0) = %#v, want an empty slice", got)
	}
}

func TestTopThrottledFromDecisions(t *testing.T) {
	clock := newFakeClock()
	tm := newTelemetry(t, Config{Now: clock.Now})
	ctx := context.Background()
	for i := range 30 {
		tm.Decision(ctx, Decision{Tenant: "acme", Policy: "p", Limit: "rpm", Outcome: "hard", Status: 429, Key: "rpm:acme"})
		if i%3 == 0 {
			tm.Decision(ctx, Decision{Tenant: "beta", Policy: "p", Limit: "tpm", Outcome: "soft", Status: 200, Key: "tpm:beta"})
		}
		// Neither soft, allowed nor shadow decisions are throttles.
		tm.Decision(ctx, Decision{Tenant: "gamma", Policy: "p", Limit: "rpm", Outcome: "allow", Status: 200, Key: "rpm:gamma"})
		tm.Decision(ctx, Decision{Tenant: "gamma", Policy: "p", Limit: "rpm", Outcome: "hard", Status: 429, Key: "rpm:gamma", Shadow: true})
	}
	got := tm.TopThrottled(5)
	want := []Throttled{
		{Key: "rpm:acme", Limit: "rpm", Tenant: "acme", Count: 30},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("TopThrottled = %v, want %v", got, want)
	}
	if got := tm.TopThrottled(1); len(got) != 1 || got[0].Key != "rpm:acme" {
		t.Fatalf("TopThrottled(1) = %v", got)
	}
	long := strings.Repeat("k", 10*MaxKeyLen)
	tm.Decision(ctx, Decision{Tenant: "delta", Limit: "rpm", Outcome: "hard", Status: 429, Key: long})
	if got := tm.TopThrottled(3); len(got) != 2 || got[1].Key != long[:MaxKeyLen] {
		t.Fatalf("long key kept as %v", got)
	}
}
