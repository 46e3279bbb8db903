package policies

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Outcome is the severity of a decision. Hard is more severe than soft, soft
// more severe than allow.
type Outcome string

// The three outcomes.
const (
	Allow Outcome = "allow" // no objection
	Soft  Outcome = "soft"  // serve the request with friction
	Hard  Outcome = "hard"  // refuse the request
)

// Friction is what a soft decision does to a request that is still served.
// The zero value does nothing. Units: DelayMS in milliseconds, CapMaxTokens in
// output tokens (0 means no cap).
type Friction struct {
	DelayMS        int64  `json:"delay_ms,omitempty"`
	CapMaxTokens   int64  `json:"cap_max_tokens,omitempty"`
	DowngradeModel string `json:"downgrade_model,omitempty"`
	Warning        string `json:"warning,omitempty"`
}

// IsZero reports whether f does nothing.
func (f Friction) IsZero() bool { return f == Friction{} }

// Sources names, for each action of a merged Friction, the id of the policy
// it comes from; empty when there is no such action. Warning lists every
// policy whose warning is part of Friction.Warning, in the same order.
type Sources struct {
	DelayMS        string   `json:"delay_ms,omitempty"`
	CapMaxTokens   string   `json:"cap_max_tokens,omitempty"`
	DowngradeModel string   `json:"downgrade_model,omitempty"`
	Warning        []string `json:"warning,omitempty"`
}

// Shadow is the would-be decision of a shadow policy or shadow rule. It is
// recorded and reported, never enforced.
type Shadow struct {
	Policy  string  `json:"policy"`
	Outcome Outcome `json:"outcome"`
	Status  int     `json:"status,omitempty"`
	Reason  string  `json:"reason,omitempty"`
	// Friction is what the shadow decision would have applied.
	Friction Friction `json:"friction,omitzero"`
	// Error is set, and Outcome empty, when the shadow policy or rule failed
	// to evaluate.
	Error string `json:"error,omitempty"`
}

// Decision is the combined verdict of every policy of a Set on one request.
//
// The zero value is an allow with no friction and no shadow entries.
type Decision struct {
	Outcome Outcome `json:"outcome"`
	// Status is 429 (a rate or quota limit), 402 (a budget is exhausted) or
	// 403 (forbidden) when Outcome is Hard, and 0 otherwise.
	Status int    `json:"status,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Policy is the id of the deciding policy: the hard policy that refused
	// the request, or the first (by id) soft policy. Empty for allow.
	Policy string `json:"policy,omitempty"`
	// Friction is the friction of every soft policy, merged (see package
	// doc). It is zero unless Outcome is Soft.
	Friction Friction `json:"friction,omitzero"`
	// Sources names the policy each action of Friction comes from, for the
	// Costgate-Friction header and the dashboard. Zero unless Outcome is
	// Soft.
	Sources Sources `json:"sources,omitzero"`
	// Shadow holds the soft and hard would-be decisions of shadow policies
	// and shadow rules, ordered by policy id. Allows are not recorded.
	Shadow []Shadow `json:"shadow,omitempty"`
}

// String describes d in one line, e.g. "hard 402 (budget): budget spent" or
// "soft (plans): cap_max_tokens=1024 delay_ms=750".
func (d Decision) String() string {
	var b strings.Builder
	b.WriteString(string(d.Outcome))
	if d.Status != 0 {
		fmt.Fprintf(&b, " %d", d.Status)
	}
	if d.Policy != "" {
		fmt.Fprintf(&b, " (%s)", d.Policy)
	}
	if d.Reason != "" {
		fmt.Fprintf(&b, ": %s", d.Reason)
	}
	if f := d.Friction.String(); f != "" {
		fmt.Fprintf(&b, " [%s]", f)
	}
	if len(d.Shadow) > 0 {
		fmt.Fprintf(&b, " +%d shadow", len(d.Shadow))
	}
	return b.String()
}

// String lists the actions of f, e.g. "delay_ms=750 cap_max_tokens=1024";
// empty when f does nothing.
func (f Friction) String() string {
	var parts []string
	if f.DelayMS > 0 {
		parts = append(parts, fmt.Sprintf("delay_ms=%d", f.DelayMS))
	}
	if f.CapMaxTokens > 0 {
		parts = append(parts, fmt.Sprintf("cap_max_tokens=%d", f.CapMaxTokens))
	}
	if f.DowngradeModel != "" {
		parts = append(parts, "downgrade_model="+f.DowngradeModel)
	}
	if f.Warning != "" {
		parts = append(parts, fmt.Sprintf("warning=%q", f.Warning))
	}
	return strings.Join(parts, " ")
}

// verdict is one policy's decoded decision.
type verdict struct {
	outcome  Outcome
	status   int
	reason   string
	friction Friction
}

// Statuses a hard decision may carry, most severe first. When several
// policies refuse a request, the most severe status wins: a forbidden request
// must not be told to retry later.
var hardStatusRank = map[int]int{403: 3, 402: 2, 429: 1}

// decodeVerdict checks and converts the JSON-shaped value of a decision rule
// (as produced by the Rego evaluator: map[string]any, string, json.Number)
// into a verdict. It is strict: unknown fields, wrong types, a hard decision
// without a valid status and friction outside a soft decision are errors, so
// that a typo in a policy fails its tests instead of silently allowing.
func decodeVerdict(v any) (verdict, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return verdict{}, fmt.Errorf("decision is %s, want an object", jsonType(v))
	}
	var d verdict
	for k, x := range obj {
		var err error
		switch k {
		case "outcome":
			var s string
			s, err = asString(x)
			d.outcome = Outcome(s)
		case "status":
			var n int64
			n, err = asInt(x)
			d.status = int(n)
			if err == nil && hardStatusRank[d.status] == 0 {
				err = fmt.Errorf("%d is not 429, 402 or 403", n)
			}
		case "reason":
			d.reason, err = asString(x)
		case "friction":
			d.friction, err = decodeFriction(x)
		default:
			err = fmt.Errorf("unknown field (want outcome, status, reason, friction)")
		}
		if err != nil {
			return verdict{}, fmt.Errorf("decision.%s: %w", k, err)
		}
	}
	switch d.outcome {
	case Allow, Soft:
		if _, ok := obj["status"]; ok {
			return verdict{}, fmt.Errorf("decision.status: only a hard decision has a status")
		}
	case Hard:
		if d.status == 0 {
			return verdict{}, fmt.Errorf("decision.status: a hard decision needs status 429, 402 or 403")
		}
	case "":
		return verdict{}, fmt.Errorf("decision.outcome: missing")
	default:
		return verdict{}, fmt.Errorf("decision.outcome: %q is not allow, soft or hard", d.outcome)
	}
	if _, ok := obj["friction"]; ok && d.outcome != Soft {
		return verdict{}, fmt.Errorf("decision.friction: only a soft decision has friction")
	}
	return d, nil
}

func decodeFriction(v any) (Friction, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return Friction{}, fmt.Errorf("is %s, want an object", jsonType(v))
	}
	var f Friction
	for k, x := range obj {
		var err error
		switch k {
		case "delay_ms":
			f.DelayMS, err = asInt(x)
			if err == nil && f.DelayMS < 0 {
				err = fmt.Errorf("%d is negative", f.DelayMS)
			}
		case "cap_max_tokens":
			f.CapMaxTokens, err = asInt(x)
			if err == nil && f.CapMaxTokens < 1 {
				err = fmt.Errorf("%d is not a positive token count", f.CapMaxTokens)
			}
		case "downgrade_model":
			f.DowngradeModel, err = asString(x)
			if err == nil && f.DowngradeModel == "" {
				err = fmt.Errorf("is empty")
			}
		case "warning":
			f.Warning, err = asString(x)
			if err == nil && f.Warning == "" {
				err = fmt.Errorf("is empty")
			}
		default:
			err = fmt.Errorf("unknown field (want delay_ms, cap_max_tokens, downgrade_model, warning)")
		}
		if err != nil {
			return Friction{}, fmt.Errorf("%s: %w", k, err)
		}
	}
	return f, nil
}

func asString(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("is %s, want a string", jsonType(v))
	}
	return s, nil
}

func asInt(v any) (int64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("is %s, want an integer", jsonType(v))
	}
	i, err := n.Int64()
	if err != nil {
		return 0, fmt.Errorf("%s is not a 64-bit integer", n)
	}
	return i, nil
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// ruling is one policy's verdict on one request, with where it came from.
type ruling struct {
	policy string
	shadow bool
	err    string // a shadow rule that failed to evaluate
	verdict
}

// combine merges rulings into a Decision. rulings must be sorted by policy
// id, enforced before shadow within one id. The rule:
//   - the outcome is the most severe enforced outcome (hard over soft over
//     allow);
//   - among hard rulings, the most severe status wins (403 over 402 over
//     429), then the lowest policy id; its reason and id are the decision's;
//   - for soft, the decision's reason and policy are those of the first soft
//     ruling by id, and friction is merged: the largest delay, the smallest
//     cap, the first downgrade by policy id, and every warning joined with
//     "; " in policy id order; on equal delays or caps the first policy by
//     id is the source;
//   - shadow rulings that are not allow, and shadow rules that failed, are
//     listed in Shadow, never enforced.
func combine(rs []ruling) Decision {
	d := Decision{Outcome: Allow}
	var warnings []string
	for i := range rs {
		r := &rs[i]
		if r.shadow {
			if r.err != "" {
				d.Shadow = append(d.Shadow, Shadow{Policy: r.policy, Error: r.err})
			} else if r.outcome != Allow {
				d.Shadow = append(d.Shadow, Shadow{Policy: r.policy, Outcome: r.outcome, Status: r.status, Reason: r.reason, Friction: r.friction})
			}
			continue
		}
		switch r.outcome {
		case Hard:
			if d.Outcome != Hard || hardStatusRank[r.status] > hardStatusRank[d.Status] {
				d.Outcome, d.Status, d.Reason, d.Policy = Hard, r.status, r.reason, r.policy
			}
		case Soft:
			if d.Outcome == Allow {
				d.Outcome, d.Reason, d.Policy = Soft, r.reason, r.policy
			}
			f := &r.friction
			if f.DelayMS > d.Friction.DelayMS {
				d.Friction.DelayMS, d.Sources.DelayMS = f.DelayMS, r.policy
			}
			if f.CapMaxTokens > 0 && (d.Friction.CapMaxTokens == 0 || f.CapMaxTokens < d.Friction.CapMaxTokens) {
				d.Friction.CapMaxTokens, d.Sources.CapMaxTokens = f.CapMaxTokens, r.policy
			}
			if d.Friction.DowngradeModel == "" && f.DowngradeModel != "" {
				d.Friction.DowngradeModel, d.Sources.DowngradeModel = f.DowngradeModel, r.policy
			}
			if f.Warning != "" {
				warnings = append(warnings, f.Warning)
				d.Sources.Warning = append(d.Sources.Warning, r.policy)
			}
		}
	}
	if d.Outcome != Soft {
		d.Friction, d.Sources = Friction{}, Sources{}
		return d
	}
	if len(warnings) == 1 {
		d.Friction.Warning = warnings[0]
	} else if len(warnings) > 1 {
		d.Friction.Warning = strings.Join(warnings, "; ")
	}
	return d
}
