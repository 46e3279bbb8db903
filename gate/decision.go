package gate

import (
	"strconv"
	"time"

	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/telemetry"
)

// Decision is what the gate answers a request: admitted (Status 0), with
// the friction a policy asks for, or refused with the status, the error
// and the RateLimit fields a front door turns into its own wire format (an
// OpenAI- or Anthropic-shaped HTTP error, a gRPC RateLimitResponse, a
// reserve answer). It is a value: the gate writes nothing.
type Decision struct {
	// Outcome is allow, soft or hard; OutcomeNone for a request the gate
	// could not judge because it is malformed (Status 400).
	Outcome telemetry.Outcome
	// Status is the HTTP status of a refusal: 400 (a cost that cannot be
	// represented or admitted), 402 (a budget is spent), 403 (a policy
	// forbids), 429 (a limit is exhausted), 503 (the limiter or the ledger
	// cannot decide). 0 when the request is admitted.
	Status int
	// Error is the refusal's body; nil when admitted.
	Error *Error
	// RetryAfter is the Retry-After of a refusal, in seconds; 0 for none.
	RetryAfter int64
	// RateLimit describes the limit that decided: the one that refused, or
	// the most constraining one; nil when no limit applies.
	RateLimit *RateLimit
	// Limits is the state of every limit checked, in order: the configured
	// limits and budgets that apply, then the request's extra limits. Only
	// a Request with States set gets them.
	Limits []LimitState
	// Policy is the policy that decided (a hard refusal or the first soft
	// one); empty when none did.
	Policy string
	// Friction is what the policies ask of an admitted request, and
	// Sources which policy asked for each action. The gate applies none
	// of it: a front door delays, caps max_tokens, downgrades the model or
	// warns, or passes it to its caller.
	Friction policies.Friction
	Sources  policies.Sources
	// Degraded tells that the limiter store failed and the request was
	// admitted on the local fallback budgets (fail-open).
	Degraded bool
	// Undecided tells that costgate could not decide (Status 503: its
	// limiter is overloaded, the counters cannot be restored, the ledger
	// cannot record), as opposed to a limit's refusal, a fail-closed
	// limit's 503 among them, whatever the limit's name.
	Undecided bool
}

// Allowed tells whether the request is admitted.
func (d Decision) Allowed() bool { return d.Status == 0 }

// FrictionNote is one entry of the Costgate-Friction field, in every
// front door's form: action; policy="ID", the policy that asked for it
// being source, or the deciding policy when source is empty.
func (d *Decision) FrictionNote(action, source string) string {
	if source == "" {
		source = d.Policy
	}
	return action + "; policy=" + strconv.Quote(source)
}

// WarnNotes appends to notes the Costgate-Friction entries of the
// decision's warning: action once for each policy that asked for it.
func (d *Decision) WarnNotes(notes []string, action string) []string {
	if len(d.Sources.Warning) == 0 {
		return append(notes, d.FrictionNote(action, ""))
	}
	for _, p := range d.Sources.Warning {
		notes = append(notes, d.FrictionNote(action, p))
	}
	return notes
}

// Error is the body of a refusal, in the shape OpenAI's SDKs read
// ({"error": {...}}); Anthropic's wrap it in {"type":"error","error":...}.
type Error struct {
	Type         string `json:"type"`
	Code         string `json:"code,omitempty"`
	Message      string `json:"message"`
	Policy       string `json:"policy,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

// RateLimit is one limit's RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers-10): the quota q in Unit per
// window w, the quota r remaining, and t, the seconds until quota is
// available again (Retry-After on a refusal; until the limit is full
// again otherwise).
type RateLimit struct {
	Name      string
	Quota     int64
	Window    int64 // seconds
	Unit      string
	Remaining int64
	Reset     int64 // seconds
}

// PolicyField is the RateLimit-Policy field's value. A limit in requests
// says qu="requests"; other units use the extension parameter cg-unit
// (tokens, input_tokens, output_tokens, usd in nano-dollars).
func (r *RateLimit) PolicyField() string {
	var buf [96]byte
	b := strconv.AppendQuote(buf[:0], r.Name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, r.Quota, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, r.Window, 10)
	if r.Unit == "requests" {
		b = append(b, `;qu="requests"`...)
	} else {
		b = append(append(append(b, `;cg-unit="`...), r.Unit...), '"')
	}
	return string(b)
}

// Field is the RateLimit field's value.
func (r *RateLimit) Field() string {
	var buf [64]byte
	b := strconv.AppendQuote(buf[:0], r.Name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(r.Remaining, 0), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, r.Reset, 10)
	return string(b)
}

// LimitState is one limit's state after a decision.
type LimitState struct {
	Name      string
	Unit      string
	Dimension string
	Key       string
	// Allowed tells whether the request's cost fitted this limit.
	Allowed bool
	// Capacity is the most the limit holds; Remaining what is left after
	// the decision (before it, for a limit that refused).
	Capacity  int64
	Remaining int64
	// Window is the limit's period; ResetAfter the time until it is full
	// again; RetryAfter, for a limit that refused, until the cost fits.
	Window     time.Duration
	ResetAfter time.Duration
	RetryAfter time.Duration
	Shadow     bool
	Budget     bool
}

// policyRetryAfter is the Retry-After, in seconds, of a policy's 429 or
// 402: a policy states no time at which it would decide otherwise.
const policyRetryAfter = 60

func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((max(d, 0) + time.Second - 1) / time.Second)
}

// refusal is a Decision that refuses with status and body e.
func refusal(outcome telemetry.Outcome, status int, e Error) Decision {
	return Decision{Outcome: outcome, Status: status, Error: &e}
}
