package replay

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/policies"
)

// appendRecord writes, byte for byte, what encoding/json writes for the
// Record.
func TestEncodeMatchesEncodingJSON(t *testing.T) {
	full := benchInput()
	full.Request.Attributes = map[string]string{"tier": "gold", "b": "<&>"}
	full.Request.Stream = true
	full.Request.Page = 3
	full.Request.OtherModels = []string{"claude-opus-4-6", "o\"dd"}
	full.Caller.User = "zoë \"q\" \\ \x01 \xff"
	tests := []struct {
		name string
		in   *policies.Input
		d    Taken
	}{
		{"empty", &policies.Input{}, Taken{Outcome: policies.Allow}},
		{"full soft", full, Taken{Outcome: policies.Soft, Policy: "plans", Friction: policies.Friction{DelayMS: 750, CapMaxTokens: 256, DowngradeModel: "gpt-4o-mini", Warning: "careful <now>"}}},
		{"hard", benchInput(), Taken{Outcome: policies.Hard, Status: 402, Policy: "budget"}},
		{"two limits", func() *policies.Input {
			in := benchInput()
			in.Limits = append(in.Limits, policies.Limit{Name: "b", Unit: "requests", Limit: 1, Remaining: -1})
			in.Spend = append(in.Spend, in.Spend[0])
			return in
		}(), Taken{Outcome: policies.Soft, Friction: policies.Friction{Warning: "w"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := json.Marshal(Record{RequestID: "req_1", Input: tt.in, Decision: tt.d, Cost: costmodel.NanoUSD(tt.in.Estimate.CostNanoUSD)})
			if err != nil {
				t.Fatal(err)
			}
			got := appendRecord(nil, "req_1", tt.in, &tt.d)
			if !bytes.Equal(got, want) {
				t.Errorf("appendRecord:\n%s\nencoding/json:\n%s", got, want)
			}
		})
	}
}
