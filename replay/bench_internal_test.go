package replay

import (
	"runtime"
	"testing"

	"github.com/costgate/costgate/policies"
)

func benchInput() *policies.Input {
	return &policies.Input{
		Caller:   policies.Caller{Tenant: "acme", User: "alice", KeyID: "acme-key", Plan: "pro", IP: "203.0.113.7"},
		Request:  policies.Request{Route: "/v1/chat/completions", Upstream: "openai", Model: "gpt-4o", MaxOutputTokens: 512},
		Estimate: policies.Estimate{InputTokens: 100, OutputTokens: 512, CostNanoUSD: 5_370_000},
		Limits:   []policies.Limit{{Name: "per-tenant", Unit: "tokens", Limit: 100000, Remaining: 5000, ResetSeconds: 30}},
		Spend:    []policies.Spend{{Scope: "tenant", Period: "day", SpentNanoUSD: 1e9, BudgetNanoUSD: 5e9}},
		Time:     policies.Time{Unix: 1_780_000_000, Hour: 10, Weekday: 2},
	}
}

// BenchmarkCapture is the capture hook's cost at a 100% sample rate.
//
//   - request_path: Writer.Capture, the part a request pays, with the queue
//     never full (the timer stops while the writer catches up, every 4096
//     records).
//   - full_queue: Capture when the queue is full (the record is dropped).
//   - writer: records the writer's goroutine encodes and writes per second
//     (ns/op is one record, from Capture to the file).
func BenchmarkCapture(b *testing.B) {
	d := policies.Decision{Outcome: policies.Soft, Policy: "plans", Friction: policies.Friction{CapMaxTokens: 256}}
	in := benchInput()
	b.Run("request_path", func(b *testing.B) {
		w, err := Open(WriterConfig{Dir: b.TempDir(), MaxBytes: 1 << 30, Queue: 1 << 14})
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if i%4096 == 0 {
				b.StopTimer()
				for len(w.ch) > 0 {
					runtime.Gosched()
				}
				b.StartTimer()
			}
			w.Capture("req_0123456789abcdef", in, &d)
		}
		b.StopTimer()
		if _, dropped := w.Stats(); dropped > 0 {
			b.Errorf("%d dropped", dropped)
		}
	})
	b.Run("full_queue", func(b *testing.B) {
		w, err := Open(WriterConfig{Dir: b.TempDir(), MaxBytes: 1 << 30, Queue: 1})
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				w.Capture("req_0123456789abcdef", in, &d)
			}
		})
	})
	b.Run("writer", func(b *testing.B) {
		w, err := Open(WriterConfig{Dir: b.TempDir(), MaxBytes: 1 << 30, Queue: 1 << 14})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			for len(w.ch) == cap(w.ch) {
				runtime.Gosched()
			}
			w.Capture("req_0123456789abcdef", in, &d)
		}
		w.Close()
		if _, dropped := w.Stats(); dropped > 0 {
			b.Errorf("%d dropped", dropped)
		}
	})
}
