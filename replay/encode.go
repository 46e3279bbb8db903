package replay

// A hand-written encoder for Record: encoding/json spends about 6 µs and
// 2 KB on one record (reflection, then Input.MarshalJSON's output compacted
// again); the capture writer runs beside the request path and must cost it
// little CPU. The output is the JSON encoding/json would write, field for
// field (TestEncodeMatchesEncodingJSON).

import (
	"encoding/json"
	"strconv"

	"github.com/costgate/costgate/internal/jsonscan"
	"github.com/costgate/costgate/policies"
)

// appendRecord appends the JSON line of one record, without its newline.
func appendRecord(b []byte, id string, in *policies.Input, d *Taken) []byte {
	b = append(b, `{"request_id":`...)
	b = jsonscan.AppendString(b, id)
	b = append(b, `,"input":{"caller":{"tenant":`...)
	c := &in.Caller
	b = jsonscan.AppendString(b, c.Tenant)
	b = append(b, `,"user":`...)
	b = jsonscan.AppendString(b, c.User)
	b = append(b, `,"key_id":`...)
	b = jsonscan.AppendString(b, c.KeyID)
	b = append(b, `,"plan":`...)
	b = jsonscan.AppendString(b, c.Plan)
	b = append(b, `,"ip":`...)
	b = jsonscan.AppendString(b, c.IP)
	b = append(b, `,"region":`...)
	b = jsonscan.AppendString(b, c.Region)
	r := &in.Request
	b = append(b, `},"request":{"route":`...)
	b = jsonscan.AppendString(b, r.Route)
	b = append(b, `,"upstream":`...)
	b = jsonscan.AppendString(b, r.Upstream)
	b = append(b, `,"model":`...)
	b = jsonscan.AppendString(b, r.Model)
	if len(r.OtherModels) > 0 {
		b = append(b, `,"other_models":[`...)
		for i, m := range r.OtherModels {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonscan.AppendString(b, m)
		}
		b = append(b, ']')
	}
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, r.Stream)
	b = append(b, `,"max_output_tokens":`...)
	b = strconv.AppendInt(b, r.MaxOutputTokens, 10)
	b = append(b, `,"page":`...)
	b = strconv.AppendInt(b, r.Page, 10)
	if len(r.Attributes) > 0 {
		attrs, _ := json.Marshal(r.Attributes) // a map of strings always encodes
		b = append(b, `,"attributes":`...)
		b = append(b, attrs...)
	}
	e := &in.Estimate
	b = append(b, `},"estimate":{"input_tokens":`...)
	b = strconv.AppendInt(b, e.InputTokens, 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, e.OutputTokens, 10)
	b = append(b, `,"cost_nano_usd":`...)
	b = strconv.AppendInt(b, e.CostNanoUSD, 10)
	b = append(b, `,"output_basis":`...)
	b = jsonscan.AppendString(b, e.OutputBasis)
	b = append(b, `,"output_quantile":`...)
	b = jsonscan.AppendString(b, e.OutputQuantile)
	b = append(b, `,"output_samples":`...)
	b = strconv.AppendInt(b, e.OutputSamples, 10)
	b = append(b, `},"limits":[`...)
	for i, l := range in.Limits {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = jsonscan.AppendString(b, l.Name)
		b = append(b, `,"unit":`...)
		b = jsonscan.AppendString(b, l.Unit)
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, l.Limit, 10)
		b = append(b, `,"remaining":`...)
		b = strconv.AppendInt(b, l.Remaining, 10)
		b = append(b, `,"reset_seconds":`...)
		b = strconv.AppendInt(b, l.ResetSeconds, 10)
		b = append(b, '}')
	}
	b = append(b, `],"spend":[`...)
	for i, s := range in.Spend {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"scope":`...)
		b = jsonscan.AppendString(b, s.Scope)
		b = append(b, `,"period":`...)
		b = jsonscan.AppendString(b, s.Period)
		b = append(b, `,"spent_nano_usd":`...)
		b = strconv.AppendInt(b, s.SpentNanoUSD, 10)
		b = append(b, `,"budget_nano_usd":`...)
		b = strconv.AppendInt(b, s.BudgetNanoUSD, 10)
		b = append(b, '}')
	}
	b = append(b, `],"time":{"unix":`...)
	b = strconv.AppendInt(b, in.Time.Unix, 10)
	b = append(b, `,"hour":`...)
	b = strconv.AppendInt(b, int64(in.Time.Hour), 10)
	b = append(b, `,"weekday":`...)
	b = strconv.AppendInt(b, int64(in.Time.Weekday), 10)
	b = append(b, `}},"decision":{"outcome":`...)
	b = jsonscan.AppendString(b, string(d.Outcome))
	if d.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(d.Status), 10)
	}
	if d.Policy != "" {
		b = append(b, `,"policy":`...)
		b = jsonscan.AppendString(b, d.Policy)
	}
	if f := &d.Friction; !f.IsZero() {
		b = append(b, `,"friction":{`...)
		sep := false
		field := func(name string) {
			if sep {
				b = append(b, ',')
			}
			sep = true
			b = append(b, name...)
		}
		if f.DelayMS != 0 {
			field(`"delay_ms":`)
			b = strconv.AppendInt(b, f.DelayMS, 10)
		}
		if f.CapMaxTokens != 0 {
			field(`"cap_max_tokens":`)
			b = strconv.AppendInt(b, f.CapMaxTokens, 10)
		}
		if f.DowngradeModel != "" {
			field(`"downgrade_model":`)
			b = jsonscan.AppendString(b, f.DowngradeModel)
		}
		if f.Warning != "" {
			field(`"warning":`)
			b = jsonscan.AppendString(b, f.Warning)
		}
		b = append(b, '}')
	}
	b = append(b, `},"cost_nano_usd":`...)
	b = strconv.AppendInt(b, in.Estimate.CostNanoUSD, 10)
	return append(b, '}')
}
