package rls

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/weighted"
)

// A tree is one configuration's rls section compiled for matching: each
// domain's descriptor nodes, level by level, with the exact values in a
// map, the wildcard prefixes longest first and the any-value node apart,
// and every limit and budget of the configuration as Envoy's current_limit
// shows it. A request walks it without allocating. It is immutable once
// built, and shared by concurrent requests.
type tree struct {
	cfg *config.Config
	// est reads a model entry's value as the model the gate prices and
	// keys its model limits by (see modelName).
	est     *costmodel.Estimator
	domains map[string]*domain
	// limits describes every limit and budget by name: the configured
	// ones and the descriptors' own.
	limits map[string]*limitInfo

	// While a domain compiles: its descriptors' limits by name, and the
	// names each limit replaces.
	named    map[string]*limit
	replaced map[*limit][]config.RLSReplace
}

// domain is one rate limit domain.
type domain struct {
	name  string
	route string // the gate's route: "rls:" + name
	tag   string // the hash tag of a request that names no tenant
	root  level
	// replaces tells that a limit of the domain replaces others.
	replaces bool
	// limitPrefix starts the names of the limits Envoy's overrides ask
	// for: the domain, without the characters that delimit the limiter's
	// keys.
	limitPrefix string
	est         *costmodel.Estimator // the tree's
}

// level is the nodes one level down, by entry key.
type level map[string]*choices

// choices are the nodes of one entry key at one level.
type choices struct {
	exact  map[string]*node
	prefix []*node // wildcard values, the longest prefix first
	any    *node
	// model: some node of the key reads its value as a model (as:
	// model). The value is then matched, and counted, as the model's
	// name (see modelName), so that the other spellings of one model
	// reach its node and its counters; the nodes' exact values and
	// prefixes are held so too.
	model bool
}

// role is what an entry's value is to costgate.
type role uint8

const (
	roleNone role = iota
	roleTenant
	roleUser
	roleModel
)

// hits is what a descriptor's hits count.
type hits uint8

const (
	hitRequests hits = iota
	hitTokens
	hitInputTokens
	hitOutputTokens
)

var hitNames = [...]string{hitRequests: "requests", hitTokens: "tokens", hitInputTokens: "input_tokens", hitOutputTokens: "output_tokens"}

// node is one configured descriptor.
type node struct {
	prefix string // a wildcard node's value without its '*'
	as     role
	tenant string // the fixed tenant a match names
	plan   string // the plan of a tenant the configuration does not list
	model  string // the fixed model a match names
	hits   hits
	price  costmodel.NanoUSD // per hit, for hits in requests
	limit  *limit            // nil: the descriptor has no limit of its own
	dim    string            // the keys of the path to the node, joined by "+", for telemetry
	next   level
}

// limit is a descriptor's own limit.
type limit struct {
	w         weighted.Limit
	unlimited bool
	block     bool // requests_per_unit 0: every match is refused
	// invalid is why a limit override Envoy sent cannot be applied (it
	// refuses as a block); empty for any other limit.
	invalid    string
	shadow     bool
	failClosed bool
	forget     bool // on_data_loss: forget (see gate.Extra.Forget)
	info       *limitInfo
	// replaces are the limits this one overrides when a request matches
	// both (config.RLSRateLimit.Replaces).
	replaces []*limit
}

// limitInfo is a limit as a descriptor status and the RateLimit fields
// show it.
type limitInfo struct {
	current *rlsv3.RateLimitResponse_RateLimit // shared by every response: never modified
	rls     bool                               // a descriptor's own limit, not a configured one
	quoted  string                             // the name as the RateLimit fields quote it
	policy  atomic.Pointer[policyField]        // the last RateLimit-Policy field made
}

// policyField is a RateLimit-Policy field's value and what it was made
// of: a limit's field changes only when its capacity does (a reload, the
// local fallback's share while the store is out).
type policyField struct {
	quota, window int64
	unit, value   string
}

func newInfo(cur *rlsv3.RateLimitResponse_RateLimit, rls bool) *limitInfo {
	return &limitInfo{current: cur, rls: rls, quoted: strconv.Quote(cur.Name)}
}

// policyField is rl's RateLimit-Policy field, made once per capacity.
func (li *limitInfo) policyField(rl *gate.RateLimit) string {
	if p := li.policy.Load(); p != nil && p.quota == rl.Quota && p.window == rl.Window && p.unit == rl.Unit {
		return p.value
	}
	v := rl.PolicyField()
	li.policy.Store(&policyField{quota: rl.Quota, window: rl.Window, unit: rl.Unit, value: v})
	return v
}

// field is rl's RateLimit field.
func (li *limitInfo) field(rl *gate.RateLimit) string {
	var buf [128]byte // on the stack when the field fits: one allocation, the string's
	b := append(buf[:0], li.quoted...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(rl.Remaining, 0), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, rl.Reset, 10)
	return string(b)
}

// compile builds cfg's tree, reading model names with est, the
// configuration's estimator. cfg has been validated, so that every limit
// converts.
func compile(cfg *config.Config, est *costmodel.Estimator) (*tree, error) {
	t := &tree{cfg: cfg, est: est, domains: make(map[string]*domain, len(cfg.RLS.Domains)), limits: map[string]*limitInfo{}}
	for _, l := range cfg.Limits {
		rate := l.Rate
		if l.Unit == "usd" {
			rate = int64(l.RateUSD)
		}
		t.limits[l.Name] = newInfo(currentLimit(l.Name, rate, l.Period), false)
	}
	for _, b := range cfg.Budgets {
		cur := currentLimit(b.Name, int64(b.Amount), 24*time.Hour)
		if b.Period == "month" {
			cur.Unit, cur.UnitMultiplier = rlsv3.RateLimitResponse_RateLimit_MONTH, nil
		}
		t.limits[b.Name] = newInfo(cur, false)
	}
	for _, d := range cfg.RLS.Domains {
		dom := &domain{name: d.Domain, est: est, route: "rls:" + d.Domain, tag: "{rls:" + d.Domain + "}",
			limitPrefix: strings.Map(func(r rune) rune {
				if r == ':' || r == '{' || r == '}' {
					return '_'
				}
				return r
			}, d.Domain)}
		t.named, t.replaced = map[string]*limit{}, map[*limit][]config.RLSReplace{}
		var err error
		if dom.root, err = t.level(d.Descriptors, ""); err != nil {
			return nil, err
		}
		for l, rs := range t.replaced {
			for _, r := range rs {
				if o := t.named[r.Name]; o != nil && o != l {
					l.replaces = append(l.replaces, o)
					dom.replaces = true
				}
			}
		}
		t.domains[d.Domain] = dom
	}
	t.named, t.replaced = nil, nil
	return t, nil
}

func (t *tree) level(nodes []config.RLSDescriptor, dim string) (level, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	lv := level{}
	models := map[string]bool{} // the keys some node reads as a model
	for i := range nodes {
		if nodes[i].As == "model" {
			models[nodes[i].Key] = true
		}
	}
	for i := range nodes {
		c := &nodes[i]
		n := &node{tenant: c.Tenant, plan: c.Plan, model: c.Model, dim: c.Key}
		if dim != "" {
			n.dim = dim + "+" + c.Key
		}
		switch c.As {
		case "tenant":
			n.as = roleTenant
		case "user":
			n.as = roleUser
		case "model":
			n.as = roleModel
		}
		n.hits = hits(slices.Index(hitNames[:], c.Hits))
		n.price = costmodel.NanoUSD(c.PricePerHit)
		if r := c.RateLimit; r != nil {
			l := &limit{unlimited: r.Unlimited, shadow: c.ShadowMode, failClosed: c.OnStoreFailure == "fail_closed", forget: c.OnDataLoss == "forget"}
			switch {
			case r.Unlimited:
			case r.RequestsPerUnit == 0:
				l.block = true
				l.info = newInfo(&rlsv3.RateLimitResponse_RateLimit{Name: r.Name, Unit: rlsUnits[r.Unit]}, true)
			default:
				w, err := r.Weighted()
				if err != nil {
					return nil, err
				}
				l.w = w
				cur := &rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: clamp32(r.RequestsPerUnit), Unit: rlsUnits[r.Unit]}
				if r.UnitMultiplier > 1 {
					cur.UnitMultiplier = wrapperspb.UInt32(clamp32(r.UnitMultiplier))
				}
				l.info = newInfo(cur, true)
			}
			if l.info != nil {
				t.limits[r.Name] = l.info
			}
			if r.Name != "" {
				t.named[r.Name] = l
			}
			if len(r.Replaces) > 0 {
				t.replaced[l] = r.Replaces
			}
			n.limit = l
		}
		var err error
		if n.next, err = t.level(c.Descriptors, n.dim); err != nil {
			return nil, err
		}
		ch := lv[c.Key]
		if ch == nil {
			ch = &choices{model: models[c.Key]}
			lv[c.Key] = ch
		}
		switch {
		case c.Value == "":
			ch.any = n
		case strings.HasSuffix(c.Value, "*"):
			n.prefix = strings.TrimSuffix(c.Value, "*")
			if ch.model {
				// A model's name is lowercase (see modelName).
				n.prefix = strings.ToLower(n.prefix)
			}
			ch.prefix = append(ch.prefix, n)
		default:
			if ch.exact == nil {
				ch.exact = map[string]*node{}
			}
			v := c.Value
			if ch.model {
				v = modelName(t.est, v)
			}
			// Two values of one model (a model and its alias) are one
			// node: the first in the configuration's order.
			if _, dup := ch.exact[v]; !dup {
				ch.exact[v] = n
			}
		}
	}
	for _, ch := range lv {
		slices.SortStableFunc(ch.prefix, func(a, b *node) int { return len(b.prefix) - len(a.prefix) })
	}
	return lv, nil
}

// modelName is v, a model entry's value, as the model it names: the
// name the price table prices it by and the gate's model limits key it
// by (costmodel.Estimator.Canonical: trimmed, lowercased, an alias as its
// model), so that a dated snapshot, another case or surrounding space,
// which run and are billed as the model, match its node and count on its
// counters. A value longer than maxEntryLen, which names no model the
// table knows, is read as it is, not lowercased whole; so is one that is
// not UTF-8.
func modelName(est *costmodel.Estimator, v string) string {
	if len(v) > maxEntryLen || est == nil || !utf8.ValidString(v) {
		// Lowercasing would make every byte that is not UTF-8 one
		// U+FFFD: two values would share a counter.
		return v
	}
	return est.Canonical(v)
}

// find returns the node of value among c: the exact one, else the longest
// wildcard prefix, else the any-value node; nil when none matches.
func (c *choices) find(value string) *node {
	if n, ok := c.exact[value]; ok {
		return n
	}
	for _, n := range c.prefix {
		if strings.HasPrefix(value, n.prefix) {
			return n
		}
	}
	return c.any
}

// rlsUnits are the units of config.RLSUnits as Envoy's enum.
var rlsUnits = map[string]rlsv3.RateLimitResponse_RateLimit_Unit{
	"second": rlsv3.RateLimitResponse_RateLimit_SECOND,
	"minute": rlsv3.RateLimitResponse_RateLimit_MINUTE,
	"hour":   rlsv3.RateLimitResponse_RateLimit_HOUR,
	"day":    rlsv3.RateLimitResponse_RateLimit_DAY,
	"week":   rlsv3.RateLimitResponse_RateLimit_WEEK,
	"month":  rlsv3.RateLimitResponse_RateLimit_MONTH,
	"year":   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// currentLimit is a configured limit of rate units per period as Envoy's
// current_limit: in the largest unit that divides the period, with a
// multiplier. A period of no whole seconds is shown per second. Rates
// above 2^32-1 (usd limits count nano-dollars) show as 2^32-1.
func currentLimit(name string, rate int64, period time.Duration) *rlsv3.RateLimitResponse_RateLimit {
	cur := &rlsv3.RateLimitResponse_RateLimit{Name: name, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
	if period <= 0 || period%time.Second != 0 {
		if period > 0 {
			rate = int64(float64(rate) * float64(time.Second) / float64(period))
		}
		cur.RequestsPerUnit = clamp32(rate)
		return cur
	}
	cur.RequestsPerUnit = clamp32(rate)
	for _, u := range []struct {
		d    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
		{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if period%u.d == 0 {
			cur.Unit = u.unit
			if m := int64(period / u.d); m > 1 {
				cur.UnitMultiplier = wrapperspb.UInt32(clamp32(m))
			}
			break
		}
	}
	return cur
}

func clamp32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}
