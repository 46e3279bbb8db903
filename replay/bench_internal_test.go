package replay

import (
	"os"
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

// benchRecords are n varied records: plans, models, output caps, limits
// and spend the example policies branch on.
func benchRecords(n int) []*Record {
	plans := []string{"free", "pro", "enterprise", "gold"}
	models := []string{"gpt-4o", "gpt-4o-mini", ""}
	out := make([]*Record, n)
	for i := range out {
		in := benchInput()
		in.Caller.Tenant = plans[i%4] + "-" + string(rune('a'+i%7))
		in.Caller.Plan = plans[i%4]
		in.Request.Model = models[i%3]
		in.Request.MaxOutputTokens = int64(i%5) * 700
		in.Limits[0].Remaining = int64(i%11) * 100
		in.Spend[0].SpentNanoUSD = int64(i%10) * 6e8
		out[i] = &Record{RequestID: "req", Input: in, Decision: Taken{Outcome: policies.Allow}, Cost: 5_370_000}
	}
	return out
}

// BenchmarkReplay is replay's throughput on the example policies, in
// captured inputs per second on one goroutine: fast is the fast path
// alone, differential adds OPA's evaluator, and read_fast adds reading the
// capture file (decoding each record). run is Run itself, reading,
// evaluating on both paths on GOMAXPROCS goroutines, and reporting.
func BenchmarkReplay(b *testing.B) {
	set, err := policies.LoadDir("../examples/policies")
	if err != nil {
		b.Fatal(err)
	}
	recs := benchRecords(1000)
	ctx := b.Context()
	run := func(b *testing.B, noRego bool) {
		rp := newReplayer(set, Options{})
		rp.noRego = noRego
		i := 0
		for b.Loop() {
			if err := rp.add(ctx, recs[i%len(recs)], "bench", i); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "inputs/s")
	}
	b.Run("fast", func(b *testing.B) { run(b, true) })
	b.Run("differential", func(b *testing.B) { run(b, false) })
	b.Run("read_fast", func(b *testing.B) {
		dir := b.TempDir()
		w, err := Open(WriterConfig{Dir: dir, MaxBytes: 1 << 30, Queue: len(recs)})
		if err != nil {
			b.Fatal(err)
		}
		allow := policies.Decision{Outcome: policies.Allow}
		for _, r := range recs {
			w.Capture(r.RequestID, r.Input, &allow)
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
		files, err := Files(dir)
		if err != nil || len(files) != 1 {
			b.Fatal(files, err)
		}
		rp := newReplayer(set, Options{})
		rp.noRego = true
		n := 0
		for b.Loop() {
			if _, err := ReadFile(files[0], func(rec *Record, line int) error { n++; return rp.add(ctx, rec, files[0], line) }); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "inputs/s")
	})
	b.Run("run", func(b *testing.B) {
		dir := b.TempDir()
		w, err := Open(WriterConfig{Dir: dir, MaxBytes: 1 << 30, Queue: len(recs)})
		if err != nil {
			b.Fatal(err)
		}
		allow := policies.Decision{Outcome: policies.Allow}
		for _, r := range recs {
			w.Capture(r.RequestID, r.Input, &allow)
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
		n := 0
		for b.Loop() {
			rep, err := Run(ctx, os.DirFS("../examples/policies"), dir, Options{})
			if err != nil {
				b.Fatal(err)
			}
			n += rep.Replayed
		}
		b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "inputs/s")
	})
}
