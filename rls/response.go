package rls

import (
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/gate"
)

const (
	codeOK   = rlsv3.RateLimitResponse_OK
	codeOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

// respond builds the answer to c from the gate's decisions.
func respond(t *tree, c *call, out *[numKinds]outcome) *rlsv3.RateLimitResponse {
	a := &answer{}
	resp := &a.resp
	resp.OverallCode = codeOK
	ds := make([]descStatus, len(c.descs))
	resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(c.descs))
	for i := range ds {
		ds[i].st.Code = codeOK
		resp.Statuses[i] = &ds[i].st
	}
	// The decision that speaks for the request: a refusal, else the
	// debit's, else the check's, else the charge's (a charge is never a
	// refusal of the request).
	var decider *gate.Decision
	for _, k := range [...]kind{kindDebit, kindCheck, kindCharge} {
		o := &out[k]
		if !o.ran {
			continue
		}
		if decider == nil || (!o.d.Allowed() && decider.Allowed() && k != kindCharge) {
			decider = &o.d
		}
	}
	degraded := false
	for k := range out {
		o := &out[k]
		if !o.ran {
			continue
		}
		degraded = degraded || o.d.Degraded
		over := false
		var ib [8]*limitInfo
		infos := limitInfos(t, o.d.Limits, ib[:0])
		for i := range c.descs {
			dc := &c.descs[i]
			if dc.kind != kind(k) {
				continue
			}
			refused := describe(c, dc, &o.d, infos, &ds[i].st, &ds[i].dur)
			if dc.kind == kindCharge {
				// Usage already served is never refused, whatever its
				// limits say: its status is OK, as the answer is.
				ds[i].st.Code = codeOK
				continue
			}
			over = refused || over
		}
		if !o.d.Allowed() && kind(k) != kindCharge {
			resp.OverallCode = codeOver
			if !over {
				// No state explains the refusal (a fail-closed limit, a
				// cost no limit can hold): every descriptor of the group
				// carries it.
				for i := range c.descs {
					if c.descs[i].kind == kind(k) {
						ds[i].st.Code = codeOver
					}
				}
			}
		}
	}
	for i := range c.descs {
		offLimits(c.limitOf(&c.descs[i]), &ds[i].st)
	}
	var hs headers
	if decider != nil && decider.RateLimit != nil {
		rl := decider.RateLimit
		if info := t.limits[rl.Name]; info != nil {
			hs.add("RateLimit-Policy", info.policyField(rl))
			hs.add("RateLimit", info.field(rl))
		} else {
			hs.add("RateLimit-Policy", rl.PolicyField())
			hs.add("RateLimit", rl.Field())
		}
	}
	// One Costgate-Degraded: a fail_closed limit's refusal says so alone,
	// though fail_open limits of the same request went on without Redis.
	closed := resp.OverallCode == codeOver && decider != nil && decider.Status == 503
	if degraded && !closed {
		hs.add("Costgate-Degraded", "fail-open")
	}
	if decider != nil && decider.Allowed() {
		// What a soft policy asks of the request (a delay, a max_tokens
		// cap, a cheaper model, a warning): the RLS server cannot apply
		// it, so it goes back to the caller, as in a reserve's answer.
		if f := frictionField(decider); f != "" {
			hs.add("Costgate-Friction", f)
		}
		if w := decider.Friction.Warning; w != "" {
			hs.add("Costgate-Warning", headerText(w))
		}
	}
	if resp.OverallCode == codeOver && decider != nil {
		if decider.RetryAfter > 0 {
			hs.add("Retry-After", strconv.FormatInt(decider.RetryAfter, 10))
		}
		if closed {
			hs.add("Costgate-Degraded", "fail-closed")
		}
		if decider.Error != nil {
			resp.RawBody = errorBody(decider.Error)
			hs.add("Content-Type", "application/json")
		}
	}
	resp.ResponseHeadersToAdd = hs.listIn(&a.headers)
	return resp
}

// answer is a response with room for the headers of most answers (the
// two RateLimit fields), in one allocation.
type answer struct {
	resp    rlsv3.RateLimitResponse
	headers answerHeaders
}

// answerHeaders holds the headers of an answer that has at most two.
type answerHeaders struct {
	hv [2]corev3.HeaderValue
	hp [2]*corev3.HeaderValue
}

// descStatus is a descriptor's status and the duration it points to,
// allocated together.
type descStatus struct {
	st  rlsv3.RateLimitResponse_DescriptorStatus
	dur durationpb.Duration
}

// headers collects the headers of an answer, at most maxHeaders, in two
// allocations.
type headers struct {
	n  int
	hv [maxHeaders]corev3.HeaderValue
}

const maxHeaders = 6

func (h *headers) add(k, v string) {
	h.hv[h.n].Key, h.hv[h.n].Value = k, v
	h.n++
}

func (h *headers) list() []*corev3.HeaderValue {
	return h.listIn(nil)
}

// listIn is list, in room when the headers fit there.
func (h *headers) listIn(room *answerHeaders) []*corev3.HeaderValue {
	if h.n == 0 {
		return nil
	}
	if room != nil && h.n <= len(room.hv) {
		out := room.hp[:h.n]
		for i := range out {
			room.hv[i].Key, room.hv[i].Value = h.hv[i].Key, h.hv[i].Value
			out[i] = &room.hv[i]
		}
		return out
	}
	hv := make([]corev3.HeaderValue, h.n)
	out := make([]*corev3.HeaderValue, h.n)
	for i := range out {
		hv[i].Key, hv[i].Value = h.hv[i].Key, h.hv[i].Value
		out[i] = &hv[i]
	}
	return out
}

// limitInfos appends to buf the description of each limit of states, by
// name (nil for a name the tree does not know), and returns it: looked up
// once per decision rather than once per descriptor.
func limitInfos(t *tree, states []gate.LimitState, buf []*limitInfo) []*limitInfo {
	for i := range states {
		buf = append(buf, t.limits[states[i].Name])
	}
	return buf
}

// describe fills st, the status of descriptor dc from decision d, and
// tells whether it is OVER_LIMIT. infos describes d's limits (see
// limitInfos). A descriptor shows its own limit and, when it names the
// caller's tenant, the tenant's limits and budgets: the one that refused
// it (the longest wait), else the most spent.
func describe(c *call, dc *desc, d *gate.Decision, infos []*limitInfo, st *rlsv3.RateLimitResponse_DescriptorStatus, dur *durationpb.Duration) bool {
	g := &c.groups[dc.kind]
	var own *limitInfo
	key := ""
	if dc.extra >= 0 {
		own, key = c.limitOf(dc).info, g.extras[dc.extra].Key
	}
	var best *gate.LimitState
	var bestInfo *limitInfo
	for i := range d.Limits {
		ls := &d.Limits[i]
		info := infos[i]
		if info == nil && own != nil && ls.Name == own.current.Name {
			info = own // a limit override's, which no configuration names
		}
		switch {
		case info == nil:
			continue
		case info.rls:
			if info != own || ls.Key != key {
				continue
			}
		case !dc.named || !g.named:
			continue
		}
		if dc.kind == kindCharge {
			// The states are the debit's, of zero: the charge came after.
			// (A refused debit's states are the ones before it: nothing
			// was debited.)
			charged := *ls
			charged.Remaining = max(ls.Remaining-costOf(g, dc, info, ls), 0)
			ls = &charged
		}
		if best == nil || constrains(ls, best) {
			best, bestInfo = ls, info
		}
	}
	st.Code = codeOK
	if best == nil {
		if own != nil {
			st.CurrentLimit = own.current
		}
		if d.Error != nil && own != nil && d.Error.Code == own.current.Name {
			st.Code = codeOver // its fail-closed limit refused
			return true
		}
		return false
	}
	st.CurrentLimit = bestInfo.current
	st.LimitRemaining = clamp32(best.Remaining)
	reset := best.ResetAfter
	over := !d.Allowed() && !best.Allowed && !best.Shadow
	if over {
		st.Code = codeOver
		reset = max(reset, best.RetryAfter)
	}
	if reset = reset.Round(time.Millisecond); reset > 0 {
		dur.Seconds, dur.Nanos = int64(reset/time.Second), int32(reset%time.Second)
		st.DurationUntilReset = dur
	}
	return over
}

// costOf is what the group of dc costs the limit in state ls: a debit's
// reserved cost, a charge's actual one.
func costOf(g *group, dc *desc, info *limitInfo, ls *gate.LimitState) int64 {
	switch {
	case info.rls && dc.kind == kindCharge:
		return g.actual[dc.extra]
	case info.rls:
		return g.extras[dc.extra].Cost
	case ls.Unit == "requests":
		return g.requests
	}
	if f := config.Units[ls.Unit]; f != nil {
		return f(g.usage, g.cost)
	}
	return 0
}

// constrains tells whether a constrains the request more than b: it
// refused it and b did not, or both refused and a waits longer, or both
// admitted and a has less of its capacity left.
func constrains(a, b *gate.LimitState) bool {
	ad, bd := !a.Allowed && !a.Shadow, !b.Allowed && !b.Shadow
	switch {
	case ad != bd:
		return ad
	case ad:
		return a.RetryAfter > b.RetryAfter
	}
	return float64(a.Remaining)*float64(max(b.Capacity, 1)) < float64(b.Remaining)*float64(max(a.Capacity, 1))
}

// blocked answers a request one of whose descriptors matches a limit of 0:
// it is refused and nothing is debited.
func blocked(c *call) *rlsv3.RateLimitResponse {
	l := c.limitOf(&c.descs[c.block])
	over := func(i int) bool { return i == c.block }
	if l.invalid != "" {
		return refused(c, over, &gate.Error{Type: "invalid_request_error", Code: "invalid_limit_override",
			Message: "a limit override costgate cannot apply: " + l.invalid})
	}
	name := l.info.current.Name
	return refused(c, over, &gate.Error{Type: "rate_limit_exceeded", Code: name, Policy: name,
		Message: "limit " + name + " admits no request"})
}

// twoTenants answers a request whose checks or debits name two tenants,
// two users or two models: it is refused, and nothing is debited (the usage it
// reports is charged apart, see Server.decideTenants).
func twoTenants(c *call) *rlsv3.RateLimitResponse {
	e := &gate.Error{Type: "invalid_request_error", Code: "two_tenants",
		Message: "the descriptors name two tenants, " + strconv.Quote(c.tenant) + " and " + strconv.Quote(c.asked.tenant) + ": a request's limits are one tenant's"}
	switch {
	case c.asked.tenant != c.tenant:
	case c.asked.user != c.user:
		e.Code = "two_users"
		e.Message = "the descriptors name two users, " + strconv.Quote(c.user) + " and " + strconv.Quote(c.asked.user) + ": a request's limits are one user's"
	default:
		e.Code = "two_models"
		e.Message = "the descriptors name two models, " + strconv.Quote(c.model) + " and " + strconv.Quote(c.asked.model) + ": a request's limits are one model's"
	}
	return refused(c, func(i int) bool { k := c.descs[i].kind; return k == kindCheck || k == kindDebit }, e)
}

// refused answers c, refused without asking the gate: OVER_LIMIT for the
// descriptors over tells, OK for the others (with what offLimits tells of
// each), and e as the body.
func refused(c *call, over func(i int) bool, e *gate.Error) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: codeOver}
	resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(c.descs))
	for i := range c.descs {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: codeOK}
		offLimits(c.limitOf(&c.descs[i]), st)
		if over(i) {
			st.Code = codeOver
		}
		resp.Statuses[i] = st
	}
	resp.RawBody = errorBody(e)
	var hs headers
	hs.add("Content-Type", "application/json")
	resp.ResponseHeadersToAdd = hs.list()
	return resp
}

// offLimits fills the status of a descriptor the gate was not asked
// about: an unlimited one has all it could want left, a limit of 0 none.
func offLimits(l *limit, st *rlsv3.RateLimitResponse_DescriptorStatus) {
	switch {
	case l == nil:
	case l.unlimited:
		st.LimitRemaining = math.MaxUint32
	case l.block:
		st.CurrentLimit = l.info.current
	}
}

// unlimited answers n descriptors that no limit applies to.
func unlimited(n int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: codeOK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range resp.Statuses {
		sts[i].Code = codeOK
		resp.Statuses[i] = &sts[i]
	}
	return resp
}

// frictionField is the Costgate-Friction value of a soft decision, in
// the proxy's form, ACTION; policy="ID" for each action, with what the
// action asks: delay_ms=N, cap_max_tokens=N, downgrade_model=NAME, warn
// (its text in Costgate-Warning).
func frictionField(d *gate.Decision) string {
	f, src := d.Friction, d.Sources
	var parts []string
	add := func(action, policy string) { parts = append(parts, d.FrictionNote(headerText(action), policy)) }
	if f.DelayMS > 0 {
		add("delay_ms="+strconv.FormatInt(f.DelayMS, 10), src.DelayMS)
	}
	if f.CapMaxTokens > 0 {
		add("cap_max_tokens="+strconv.FormatInt(f.CapMaxTokens, 10), src.CapMaxTokens)
	}
	if f.DowngradeModel != "" {
		add("downgrade_model="+f.DowngradeModel, src.DowngradeModel)
	}
	if f.Warning != "" {
		parts = d.WarnNotes(parts, "warn")
	}
	return strings.Join(parts, ", ")
}

// headerText is s with every control character a space: a policy's
// warning is text of the operator's, and a header value cannot hold a
// line break.
func headerText(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
