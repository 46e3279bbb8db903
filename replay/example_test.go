package replay_test

import (
	"context"
	"fmt"
	"os"
	"testing/fstest"

	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/replay"
)

// A capture of three requests, all allowed, replayed against a candidate
// that refuses the free plan's requests above 1000 nano-USD.
func ExampleRun() {
	dir, err := os.MkdirTemp("", "capture")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	// The gate does this when capture is enabled.
	w, err := replay.Open(replay.WriterConfig{Dir: dir})
	if err != nil {
		panic(err)
	}
	allow := policies.Decision{Outcome: policies.Allow}
	for i, plan := range []string{"free", "free", "pro"} {
		in := &policies.Input{Caller: policies.Caller{Tenant: plan + "-co", KeyID: "key-1", Plan: plan},
			Estimate: policies.Estimate{CostNanoUSD: int64(900 + 200*i)}}
		w.Capture(fmt.Sprintf("req_%d", i), in, &allow)
	}
	w.Close()

	candidate := fstest.MapFS{"cheap.rego": {Data: []byte(`package costgate.policies.cheap

decision := {"outcome": "hard", "status": 429} if {
	input.caller.plan == "free"
	input.estimate.cost_nano_usd > 1000
}
`)}}
	rep, err := replay.Run(context.Background(), candidate, dir, replay.Options{})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d of %d change\n", rep.Changed, rep.Replayed)
	for _, t := range rep.Transitions {
		s := t.Samples[0]
		fmt.Printf("%s: %d, %s; e.g. %s of %s: %s -> %s\n", t.Name(), t.Count, t.Cost, s.RequestID, s.Input.Caller.Tenant, s.Old, s.New)
	}
	// Output:
	// 1 of 3 change
	// allow->hard: 1, $0.000001100; e.g. req_1 of free-co: allow -> hard 429 (cheap)
}
