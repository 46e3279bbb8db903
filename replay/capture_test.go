package replay_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/replay"
)

func testInput(i int) *policies.Input {
	return &policies.Input{
		Caller:   policies.Caller{Tenant: fmt.Sprintf("t%d", i%5), User: "u", KeyID: "k", Plan: "free"},
		Request:  policies.Request{Route: "/v1/chat/completions", Upstream: "openai", Model: "gpt-4o", MaxOutputTokens: 512},
		Estimate: policies.Estimate{InputTokens: 100, OutputTokens: 512, CostNanoUSD: int64(1000 + i)},
		Limits:   []policies.Limit{{Name: "per-tenant", Unit: "tokens", Limit: 100000, Remaining: 5000, ResetSeconds: 30}},
		Spend:    []policies.Spend{{Scope: "tenant", Period: "day", SpentNanoUSD: 1e9, BudgetNanoUSD: 5e9}},
		Time:     policies.Time{Unix: 1_780_000_000, Hour: 10, Weekday: 2},
	}
}

// Files rotate at MaxBytes, at most MaxFiles stay, and every record
// written is in them, in order, with what was captured.
func TestWriterRotates(t *testing.T) {
	dir := t.TempDir()
	w, err := replay.Open(replay.WriterConfig{Dir: dir, MaxBytes: 4096, MaxFiles: 3, Queue: 1000})
	if err != nil {
		t.Fatal(err)
	}
	d := policies.Decision{Outcome: policies.Soft, Policy: "plans", Friction: policies.Friction{CapMaxTokens: 256}}
	const n = 200
	for i := range n {
		w.Capture(fmt.Sprintf("req_%04d", i), testInput(i), &d)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	written, dropped := w.Stats()
	if written+dropped != n || written == 0 {
		t.Fatalf("written %d, dropped %d of %d", written, dropped, n)
	}
	files, err := replay.Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Fatalf("%d files, want 3 (MaxFiles)", len(files))
	}
	last := -1
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil || st.Size() > 4096 {
			t.Errorf("%s: %v bytes, want at most 4096", f, st.Size())
		}
		_, err = replay.ReadFile(f, func(rec *replay.Record, line int) error {
			var i int
			fmt.Sscanf(rec.RequestID, "req_%d", &i)
			if i <= last {
				return fmt.Errorf("record %s after req_%04d", rec.RequestID, last)
			}
			last = i
			if rec.Decision != replay.TakenOf(&d) || rec.Cost != costmodel.NanoUSD(1000+i) || rec.Input.Caller.KeyID != "k" {
				return fmt.Errorf("record %s: %+v cost %d", rec.RequestID, rec.Decision, rec.Cost)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if last != n-1 && dropped == 0 {
		t.Errorf("the newest record is req_%04d, want req_%04d", last, n-1)
	}
}

// Capture never blocks: with a full queue it drops and counts.
func TestWriterDropsWhenFull(t *testing.T) {
	w, err := replay.Open(replay.WriterConfig{Dir: t.TempDir(), Queue: 1})
	if err != nil {
		t.Fatal(err)
	}
	d := policies.Decision{Outcome: policies.Allow}
	in := testInput(1)
	const n = 10000
	for range n {
		w.Capture("r", in, &d)
	}
	w.Close()
	w.Capture("late", in, &d)
	written, dropped := w.Stats()
	if written+dropped != n+1 || dropped == 0 {
		t.Errorf("written %d, dropped %d; want %d in all, some dropped", written, dropped, n+1)
	}
}
