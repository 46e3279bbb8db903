package telemetry

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkRequest measures the instrumentation of one request as the proxy
// does it: one Decision, eight Stage calls, one StoreOp and one Usage, over a
// realistic spread of tenants, policies and outcomes. BenchmarkRequestOff is
// the same loop with the recording calls left out, in the same run, so the
// difference is the instrumentation's cost per request.
func BenchmarkRequest(b *testing.B) {
	b.Run("on", func(b *testing.B) { benchRequest(b, true) })
	b.Run("off", func(b *testing.B) { benchRequest(b, false) })
}

// benchWork stands in for the request's own work so that the "off" loop is
// not empty; it is identical in both variants.
var benchSink atomic.Int64

func benchRequest(b *testing.B, on bool) {
	tm, err := New(context.Background(), Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer tm.Shutdown(context.Background())
	const nTenants = 50
	decisions := make([]Decision, 0, nTenants*4)
	for i := range nTenants {
		tenant := "tenant-" + strconv.Itoa(i)
		decisions = append(decisions,
			Decision{Tenant: tenant, Route: "chat", Model: "gpt-4o-mini", Policy: "plans", Outcome: "allow", Status: 200},
			Decision{Tenant: tenant, Route: "chat", Model: "gpt-4o-mini", Policy: "plans", Outcome: "allow", Status: 200},
			Decision{Tenant: tenant, Route: "chat", Model: "gpt-4o", Policy: "budget", Limit: "tokens-per-min", Dimension: "tenant", Outcome: "soft", Status: 200, Key: "tpm:" + tenant},
			Decision{Tenant: tenant, Route: "chat", Model: "gpt-4o", Policy: "plans", Limit: "req-per-min", Dimension: "tenant", Outcome: "hard", Status: 429, Key: "rpm:" + tenant},
		)
	}
	stages := []string{StageIdentify, StageEstimate, StageDebit, StagePolicy, StageLedger, StageUpstream, StageSettle, StageTotal}
	storeErr := errors.New("boom")
	ctx := context.Background()
	var seq atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1) * 7919)
		for pb.Next() {
			i++
			d := decisions[i%len(decisions)]
			var err error
			if i%100 == 0 {
				err = storeErr
			}
			dur := time.Duration(i%1000) * time.Microsecond
			if on {
				tm.Decision(ctx, d)
				for _, s := range stages {
					tm.Stage(s, dur)
				}
				tm.StoreOp(StoreDebit, dur, err)
				tm.Usage(d.Tenant, d.Model, 512, 128, 1234)
			} else if err != nil && dur < 0 {
				benchSink.Add(1) // never taken; keeps the loop's loads live
			}
		}
	})
}
