package rls

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/weighted"
)

// Bounds on a request, past which it is refused as invalid.
const (
	maxDescriptors = 64
	maxEntries     = 16
	// maxEntryLen bounds an entry's key. A value may be longer (it is
	// often a header of the client's, which must not make the request an
	// error that Envoy lets through): in a limiter key it is written as
	// its digest (appendValue), in a tenant, user or model as boundedText
	// reads it.
	maxEntryLen = 1024
	// maxHits bounds a hits_addend: larger than any limit can hold, it is
	// refused as such (OVER_LIMIT) rather than overflow a price.
	maxHits = 1 << 50
)

// ledgerText is v as the ledger stores it (PostgreSQL text holds neither
// NUL nor invalid UTF-8). A tenant, user or model value is read so once,
// and that reading keys its limits and names it in the ledger: a value the
// ledger would refuse must not make a charge of usage already served go
// uncounted. The reading is one to one, so that no value lands on
// another's counters ("a\x00", "a\xff" and "a\uFFFD" are three users): a
// value with a NUL, a byte that is not UTF-8 or a '%' has each of them
// written %XX; any other value is itself. A tenant's reading (tag set)
// writes '{' and '}' so too: the tenant is the hash tag of its limiter
// keys, which they delimit, and no configured tenant holds them.
func ledgerText(v string, tag bool) string {
	if strings.IndexByte(v, 0) < 0 && strings.IndexByte(v, '%') < 0 && (!tag || strings.IndexAny(v, "{}") < 0) && utf8.ValidString(v) {
		return v
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(v)+8)
	for i := 0; i < len(v); {
		r, n := utf8.DecodeRuneInString(v[i:])
		if r == 0 || r == '%' || tag && (r == '{' || r == '}') || r == utf8.RuneError && n == 1 {
			b = append(b, '%', hex[v[i]>>4], hex[v[i]&15])
		} else {
			b = append(b, v[i:i+n]...)
		}
		i += n
	}
	return string(b)
}

// emptyValue is the reading of an empty tenant or model value: a header
// present but empty names a tenant or a model all the same. Read as "",
// it would name none: a tenant the configuration does not list would
// escape the plan its descriptor gives it, and its price; tokens charged
// under no model would be priced at nothing (and a tenant's allowed
// models, which pass a request naming none, would not apply). As a model
// it is one no price table names, priced at the default price. No
// reading of a value is "%empty" (every '%' of one starts a %XX of hex
// digits), and no configured tenant holds a '%'.
const emptyValue = "%empty"

// maxModelText bounds a model's reading, within the ledger's bound on a
// model (4,096 bytes): every value of maxEntryLen bytes fits.
const maxModelText = 3 * maxEntryLen

// boundedText is ledgerText(v, tag), and when that is longer than bound
// (the ledger would refuse the record of a charge of usage already
// served, which would go unbilled), its start and "%~" and the SHA-256 of
// v in hex. No reading of a value that fits holds "%~" (every '%' of it
// starts a %XX), so no two values share a counter. A tenant or a user is
// bounded by ledger.MaxKeyField, a model by maxModelText.
func boundedText(v string, tag bool, bound int) string {
	// Escaping never shortens: of a value longer than bound, the reading
	// keeps less than bound bytes, all from its first bound bytes, and
	// only those are read (a 60 KiB header's value is not escaped whole
	// to keep 446 bytes of it).
	head := v[:min(len(v), bound)]
	t := ledgerText(head, tag)
	if len(t) <= bound && len(head) == len(v) {
		return t
	}
	cut := bound - digestLen
	for cut > 0 && !utf8.RuneStart(t[cut]) {
		cut--
	}
	return string(appendDigest([]byte(t[:cut]), v))
}

// digestLen is the length of what appendDigest appends.
const digestLen = 2 + 2*sha256.Size

// appendDigest appends "%~" and the SHA-256 of v in hex: the end of a
// value's reading too long to keep whole, which no escaped value holds.
func appendDigest(b []byte, v string) []byte {
	// Hashed through a buffer on the stack: []byte(v), and io.WriteString
	// on the hash, copy v to the heap whole.
	h := sha256.New()
	var buf [1024]byte
	for rest := v; rest != ""; {
		n := copy(buf[:], rest)
		h.Write(buf[:n])
		rest = rest[n:]
	}
	var sum [sha256.Size]byte
	b = append(b, "%~"...)
	return hex.AppendEncode(b, h.Sum(sum[:0]))
}

// errInvalid marks a request that is not a valid RateLimitRequest.
var errInvalid = errors.New("rls: invalid request")

// kind is the gate request a descriptor joins.
type kind uint8

const (
	// kindNone: the descriptor matched nothing, is unlimited, or asks
	// to refill; the gate is not asked.
	kindNone kind = iota
	// kindCharge: hits in tokens above 0 are the usage of a request
	// already served (the second phase); they are charged whatever the
	// limits say.
	kindCharge
	// kindCheck: hits of 0 ask whether the limits have room left, and
	// debit nothing (the first phase).
	kindCheck
	// kindDebit: hits in requests are debited all or nothing.
	kindDebit

	numKinds
)

// call is one RateLimitRequest converted for the gate: the caller its
// descriptors name, and its descriptors sorted into the gate requests they
// make, at most one of each kind. It is reused between requests (see
// Server.calls); a request's call is its own until the response is built.
type call struct {
	dom    *domain
	tenant string // the caller: the first tenant a descriptor names; empty for none
	plan   string
	user   string
	model  string
	block  int // the first descriptor whose limit refuses everything; -1 for none
	descs  []desc
	groups [numKinds]group
	key    []byte // scratch for building keys
	// others are the parties other than the caller's that
	// descriptors asking the gate name, in order (the first call's: a
	// call for one party lists none); othersAsk tells that one of those
	// descriptors checks or debits, asked names the first such. Their
	// descriptors are in no group of this call.
	others    []party
	othersAsk bool
	asked     party
}

// desc is one descriptor of the request.
type desc struct {
	n        *node  // the node matched; nil for none
	override *limit // the limit Envoy sent with it, in place of its node's; nil for none
	replaced bool   // its node's limit is replaced by another descriptor's
	kind     kind
	hits     int64
	named    bool // it names the caller's tenant: the tenant's limits show in its status
	extra    int  // its limit's index in its group's extras; -1 for none
	// other: it names another tenant than the call's (or, on a call for
	// one tenant, none): it is decided on a call of its own, in no group
	// of this one.
	other bool
}

// group is the gate request of one kind.
type group struct {
	n      int // descriptors of the kind
	named  bool
	extras []gate.Extra
	actual []int64 // a charge's hits per extra
	// requests, usage, total and cost are what the descriptors that name
	// the caller's tenant count on the tenant's own limits and budgets:
	// the largest hits of each unit among them (Envoy sends one request's
	// hits to each; a smaller report takes nothing off a larger one), and
	// the sum of their prices. total is the largest total of tokens
	// (hits: tokens) reported, which a charge bills only beyond its input
	// and output tokens (see bill).
	requests int64
	usage    costmodel.Usage
	total    int64
	cost     costmodel.NanoUSD // a charge's: its usage priced, once asked
}

func (c *call) reset(dom *domain) {
	c.dom, c.tenant, c.plan, c.user, c.model, c.block = dom, "", "", "", "", -1
	c.descs = c.descs[:0]
	c.others, c.othersAsk, c.asked = c.others[:0], false, party{}
	for i := range c.groups {
		g := &c.groups[i]
		clear(g.extras) // drop the keys of the last request
		g.n, g.named, g.extras, g.actual = 0, false, g.extras[:0], g.actual[:0]
		g.requests, g.usage, g.total, g.cost = 0, costmodel.Usage{}, 0, 0
	}
}

// path is what the nodes of one descriptor's path name.
type path struct {
	tenant, plan, user, model string
}

// convert fills c from req against dom for one party: sub, or when it
// is nil the first tenant and model that descriptors asking the gate
// name. The descriptors that name another tenant, or another model, are
// left out of c's groups, and c.others lists them: a tenant's plan
// applies to its own descriptors, and a model's usage is priced as that
// model's, whichever comes first. A call for sub holds the charges of
// exactly its tenant and model. It fails with errInvalid for a request
// that is not valid; it never asks the gate anything.
func (c *call) convert(dom *domain, req *rlsv3.RateLimitRequest, sub *party) error {
	c.reset(dom)
	ds := req.GetDescriptors()
	switch {
	case len(ds) == 0:
		return fmt.Errorf("%w: no descriptors", errInvalid)
	case len(ds) > maxDescriptors:
		return fmt.Errorf("%w: %d descriptors (at most %d)", errInvalid, len(ds), maxDescriptors)
	}
	reqHits := int64(req.GetHitsAddend())
	if reqHits == 0 {
		reqHits = 1 // Envoy: unset means 1
	}
	var paths [8]path
	ps := paths[:0]
	for i, d := range ds {
		es := d.GetEntries()
		if len(es) == 0 || len(es) > maxEntries {
			return fmt.Errorf("%w: descriptor %d has %d entries (1 to %d)", errInvalid, i, len(es), maxEntries)
		}
		var p path
		var n *node
		lv := dom.root
		for _, e := range es {
			k, v := e.GetKey(), e.GetValue()
			if len(k) > maxEntryLen {
				return fmt.Errorf("%w: descriptor %d has an entry key longer than %d bytes", errInvalid, i, maxEntryLen)
			}
			n = nil
			if ch := lv[k]; ch != nil {
				if ch.model {
					// Read once: the entry holds the model's name from
					// here on, for its counter's key and a second
					// party's reading (modelName is idempotent).
					if v = modelName(dom.est, v); v != e.GetValue() {
						e.Value = v
					}
				}
				n = ch.find(v)
			}
			if n == nil {
				break
			}
			switch n.as {
			case roleTenant:
				p.tenant, p.plan = boundedText(v, true, ledger.MaxKeyField), n.plan
				if p.tenant == "" {
					p.tenant = emptyValue
				}
			case roleUser:
				p.user = boundedText(v, false, ledger.MaxKeyField)
			case roleModel:
				p.model = boundedText(v, false, maxModelText)
				if p.model == "" {
					p.model = emptyValue
				}
			}
			if n.tenant != "" {
				p.tenant, p.plan = n.tenant, n.plan
			}
			if n.model != "" {
				p.model = n.model
			}
			lv = n.next
		}
		hits := reqHits
		if h := d.GetHitsAddend(); h != nil {
			hits = int64(min(h.GetValue(), maxHits))
		}
		dc := desc{n: n, hits: hits, extra: -1}
		if lo := d.GetLimit(); lo != nil {
			ov, err := override(dom, lo)
			if err != nil {
				// Refused as a limit of 0 refuses, not as an invalid
				// request: Envoy lets a request the server answers with an
				// error through unlimited (failure_mode_deny: false), and
				// the usage it reports would go uncounted.
				ov = badOverride(dom, i, err)
			}
			if l := n.limitOrNil(); l != nil {
				ov.failClosed, ov.forget = l.failClosed, l.forget // the descriptor's postures stay
			}
			dc.override = ov
			if dc.n == nil {
				dc.n = bareNode // Envoy's limit applies whatever the configuration matches
			}
		}
		c.descs = append(c.descs, dc)
		ps = append(ps, p)
	}
	if dom.replaces {
		c.replace()
	}
	for i, d := range ds {
		dc := &c.descs[i]
		switch l := c.limitOf(dc); {
		case dc.n == nil, d.GetIsNegativeHits(), l != nil && l.unlimited:
		case dc.hits > 0 && dc.n.hits != hitRequests:
			// Usage already served, charged whatever its limits say: a
			// limit of 0 refuses requests, and a charge is none (it has
			// no counter, as a block in shadow mode has none).
			dc.kind = kindCharge
		case l != nil && l.block && !l.shadow:
			if c.block < 0 {
				c.block = i
			}
		case dc.hits == 0:
			dc.kind = kindCheck
		case dc.n.hits == hitRequests:
			dc.kind = kindDebit
		default:
			dc.kind = kindCharge
		}
		if dc.kind == kindNone {
			ps[i] = path{}
		}
	}
	// The caller: sub's tenant, else the first tenant a check or a debit
	// names, else the first named; its plan is the first that its
	// descriptors give. Its user and model: sub's, else the first that a
	// check or a debit of its descriptors (and, on the first call, of
	// those naming no tenant) names, else the first.
	main := sub == nil
	if main {
		c.tenant = c.first(ps, roleTenant, "", true)
	} else {
		c.tenant = sub.tenant
	}
	mine := func(p *path) bool { return p.tenant == c.tenant || main && p.tenant == "" }
	for i := range ps {
		if p := &ps[i]; p.tenant != "" && p.tenant == c.tenant {
			c.plan = p.plan
			break
		}
	}
	caller := c.tenant // the first call's tenant
	if main {
		c.user = c.first(ps, roleUser, c.tenant, true)
		c.model = c.first(ps, roleModel, c.tenant, true)
	} else {
		c.user, c.model, caller = sub.user, sub.model, c.first(ps, roleTenant, "", true)
	}
	// A descriptor is this call's when it names its tenant (or none, on
	// the first call) and its party's user and model (see partyOf); on a
	// call for one party, only charges of exactly its party are.
	for i := range c.descs {
		dc, p := &c.descs[i], &ps[i]
		user, model := c.partyOf(ps, p, caller)
		in := mine(p) && user == c.user && model == c.model
		if !main {
			in = in && dc.kind == kindCharge
		}
		if dc.other = !in; dc.other && main && dc.kind != kindNone {
			o := party{p.tenant, user, model}
			if !slices.Contains(c.others, o) {
				c.others = append(c.others, o)
			}
			if (dc.kind == kindCheck || dc.kind == kindDebit) && !c.othersAsk {
				c.othersAsk, c.asked = true, o
			}
		}
	}
	for i := range c.descs {
		dc := &c.descs[i]
		if dc.kind == kindNone || dc.other {
			continue
		}
		g := &c.groups[dc.kind]
		g.n++
		dc.named = c.tenant != "" && ps[i].tenant == c.tenant
		if dc.named {
			g.named = true
			c.count(g, dc)
		}
		if l := c.limitOf(dc); l != nil && !l.block {
			// A block in shadow mode has no counter: its would-blocks are
			// counted apart (see Server.decide); the descriptor counts on
			// its tenant's plan, and costs its price, as under any other
			// shadow limit.
			dc.extra = c.addExtra(g, dc, ps[i].tenant, ds[i])
		}
	}
	return nil
}

// first is the first tenant (r roleTenant), user (roleUser) or model
// (roleModel) that ps, the paths of c's descriptors, name: of a check or
// a debit, else of any descriptor; a user or a model only of a
// descriptor of tenant (or, with none, of no tenant too).
func (c *call) first(ps []path, r role, tenant string, none bool) string {
	for _, asks := range [...]bool{true, false} {
		for i := range ps {
			p := &ps[i]
			v := p.tenant
			if r != roleTenant {
				if v = p.model; r == roleUser {
					v = p.user
				}
				if !(p.tenant == tenant || none && p.tenant == "") {
					continue
				}
			}
			if k := c.descs[i].kind; v != "" && (!asks || k == kindCheck || k == kindDebit) {
				return v
			}
		}
	}
	return ""
}

// partyOf is the user and the model of the party p's usage is charged
// to (its tenant is p's): the user and the model p names, else its
// tenant's, the first that the tenant's descriptors name (caller's, the
// first call's tenant, and of descriptors naming no tenant too, as the
// first call reads them). So a descriptor naming no model (a total of
// tokens under the tenant alone) joins its tenant's model's charge,
// whichever call charges it, and is billed once with it, never again at
// that model's price as a party of its own; one naming no user is its
// tenant's user's.
func (c *call) partyOf(ps []path, p *path, caller string) (user, model string) {
	user, model = p.user, p.model
	t, none := p.tenant, false
	if t == caller || t == "" {
		t, none = caller, true
	}
	if user == "" {
		user = c.first(ps, roleUser, t, none)
	}
	if model == "" {
		model = c.first(ps, roleModel, t, none)
	}
	return user, model
}

// party is who a descriptor's usage is charged to: a tenant, its user
// and a model. A request's checks and debits are one party's.
type party struct {
	tenant, user, model string
}

// replace marks the descriptors whose limit another descriptor of the
// request replaces. A limit Envoy overrides neither replaces nor is
// replaced.
func (c *call) replace() {
	for i := range c.descs {
		if c.descs[i].override != nil {
			continue
		}
		l := c.descs[i].n.limitOrNil()
		if l == nil || len(l.replaces) == 0 {
			continue
		}
		for j := range c.descs {
			if o := c.descs[j].n.limitOrNil(); o != nil && c.descs[j].override == nil && slices.Contains(l.replaces, o) {
				c.descs[j].replaced = true
			}
		}
	}
}

// limitOf is the limit that applies to dc: the one Envoy sent with it,
// else its node's, unless another descriptor of the request replaces
// it; nil for none.
func (c *call) limitOf(dc *desc) *limit {
	switch {
	case dc.override != nil:
		return dc.override
	case dc.replaced:
		return nil
	}
	return dc.n.limitOrNil()
}

// bareNode stands for the configuration's node of a descriptor that
// matched none but carries Envoy's limit override: hits in requests, at
// no price, and no limit of its own.
var bareNode = &node{dim: "override"}

// overrideUnits are the units of Envoy's limit overrides.
var overrideUnits = map[typev3.RateLimitUnit]struct {
	name string
	d    time.Duration
	enum rlsv3.RateLimitResponse_RateLimit_Unit
}{
	typev3.RateLimitUnit_SECOND: {"second", time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	typev3.RateLimitUnit_MINUTE: {"minute", time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	typev3.RateLimitUnit_HOUR:   {"hour", time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	typev3.RateLimitUnit_DAY:    {"day", 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	typev3.RateLimitUnit_MONTH:  {"month", 30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	typev3.RateLimitUnit_YEAR:   {"year", 365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
}

// override is the limit of Envoy's limit override lo, in place of the
// configured one, as envoyproxy/ratelimit applies it: a fixed window of
// requests_per_unit hits per unit_multiplier units (0 refuses every
// request), never in shadow mode. It is named DOMAIN.override.UNIT.N.RATE
// (N the multiplier), so that each override counts apart from the
// configured limits and from other overrides.
func override(dom *domain, lo *commonv3.RateLimitDescriptor_RateLimitOverride) (*limit, error) {
	u, ok := overrideUnits[lo.GetUnit()]
	if !ok {
		return nil, fmt.Errorf("a limit override needs a unit from second to year, not %s", lo.GetUnit())
	}
	mult := int64(1)
	if m := lo.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		mult = int64(m.GetValue())
	}
	if time.Duration(mult) > weighted.MaxPeriod/u.d {
		return nil, fmt.Errorf("a limit override's period is longer than the longest, %s", weighted.MaxPeriod)
	}
	period := u.d * time.Duration(mult)
	rate := lo.GetRequestsPerUnit()
	name := dom.limitPrefix + ".override." + u.name + "." + strconv.FormatInt(mult, 10) + "." + strconv.FormatUint(uint64(rate), 10)
	cur := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rate, Unit: u.enum}
	if mult > 1 {
		cur.UnitMultiplier = wrapperspb.UInt32(uint32(mult))
	}
	l := &limit{info: newInfo(cur, true), block: rate == 0}
	if l.block {
		return l, nil
	}
	l.w = weighted.Limit{Name: name, Algorithm: weighted.FixedWindow, Rate: int64(rate), Period: period}
	if err := l.w.Validate(); err != nil {
		return nil, fmt.Errorf("a limit override: %v", err)
	}
	return l, nil
}

// badOverride stands for the limit override of descriptor i that cannot
// be applied (err says why): it refuses every check and debit, as an
// override of 0 does, with err in the answer's body.
func badOverride(dom *domain, i int, err error) *limit {
	name := dom.limitPrefix + ".override.invalid"
	return &limit{info: newInfo(&rlsv3.RateLimitResponse_RateLimit{Name: name}, true), block: true,
		invalid: "descriptor " + strconv.Itoa(i) + ": " + err.Error()}
}

// limitOrNil is n's limit; nil for none, or no node.
func (n *node) limitOrNil() *limit {
	if n == nil {
		return nil
	}
	return n.limit
}

// count adds a descriptor that names the caller's tenant to what its
// group counts on the tenant's limits.
func (c *call) count(g *group, d *desc) {
	switch d.kind {
	case kindDebit:
		g.requests = max(g.requests, d.hits)
		g.cost = addSat(g.cost, costmodel.MulSat(d.n.price, d.hits))
	case kindCharge:
		switch d.n.hits {
		case hitInputTokens:
			g.usage.InputTokens = max(g.usage.InputTokens, d.hits)
		case hitOutputTokens:
			g.usage.OutputTokens = max(g.usage.OutputTokens, d.hits)
		case hitTokens:
			g.total = max(g.total, d.hits)
		}
	}
}

// bill sets a charge's usage to what it bills the tenant: its input and
// output tokens, each at the largest report of it, and of its total only
// the tokens beyond their sum. A total sums the other two (Envoy AI
// Gateway's llm_total_token is input plus output): counted beside them it
// would bill their tokens twice, and a total short of them takes nothing
// off. The tokens beyond are of unknown split, counted as whichever of
// input and output tokens price costs more (output when it costs them
// alike, or price is nil: the request names no model), so that a total
// alone is billed at the dearer side, never below its usage.
func (g *group) bill(price func(costmodel.Usage) costmodel.NanoUSD) {
	rest := g.total - g.usage.InputTokens - g.usage.OutputTokens
	if rest <= 0 {
		return
	}
	in, out := g.usage, g.usage
	in.InputTokens += rest
	out.OutputTokens += rest
	if price != nil && price(in) > price(out) {
		g.usage = in
		return
	}
	g.usage = out
}

// addExtra adds the descriptor's own limit to its group and returns its
// index: the same limit and key twice in one request is one item, which
// counts the hits of both.
//
// The key is the descriptor's values under a hash tag: the tenant the
// descriptor names, so that it lives in the tenant's Redis Cluster slot
// with the tenant's limits and budgets, else the domain's. A limit
// override's key holds the domain and the entries' keys too
// (":DOMAIN:KEY=VALUE..."). A counter's key depends on its descriptor
// alone, never on the other descriptors of the request.
func (c *call) addExtra(g *group, d *desc, tenant string, rd *commonv3.RateLimitDescriptor) int {
	var b []byte
	if tenant != "" {
		b = append(append(append(c.key[:0], '{'), tenant...), '}')
	} else {
		b = append(c.key[:0], c.dom.tag...)
	}
	l := c.limitOf(d)
	if d.override != nil {
		// An override's limit is named by its rate and unit alone, and
		// descriptors of any keys (of any domain whose name maps to the
		// same prefix) may send it: its key names the domain and the
		// entries' keys, so that no two descriptors share its counter.
		b = append(b, ':')
		b = appendEscaped(b, c.dom.name, false)
		for _, e := range rd.GetEntries() {
			b = append(b, ':')
			b = appendEscaped(b, e.GetKey(), true)
			b = append(b, '=')
			b = appendValue(b, e.GetValue())
		}
	} else {
		// A configured limit is its node's: the path to the node fixes
		// the entries' keys, and the values alone tell counters apart.
		for _, e := range rd.GetEntries() {
			b = append(b, ':')
			b = appendValue(b, e.GetValue())
		}
	}
	c.key = b
	for i := range g.extras {
		if g.extras[i].Limit.Name == l.w.Name && g.extras[i].Key == string(b) {
			if d.kind == kindDebit {
				g.extras[i].Cost = min(g.extras[i].Cost+d.hits, maxHits)
			} else if d.kind == kindCharge {
				g.actual[i] = min(g.actual[i]+d.hits, maxHits)
				g.extras[i].Charged = g.actual[i]
			}
			return i
		}
	}
	e := gate.Extra{Limit: l.w, Unit: hitNames[d.n.hits], Key: string(b), Dimension: d.n.dim, Shadow: l.shadow, FailClosed: l.failClosed, Forget: l.forget}
	var actual int64
	switch d.kind {
	case kindDebit:
		e.Cost = d.hits
	case kindCharge:
		actual = d.hits
		e.Charged = d.hits
	}
	g.extras = append(g.extras, e)
	g.actual = append(g.actual, actual)
	return len(g.extras) - 1
}

// appendValue appends an entry's value v as appendEscaped does; a value
// longer than maxEntryLen as the start of it, "%~" and its SHA-256 in hex,
// which no escaped value holds, so that the key stays short and no two
// values share it.
func appendValue(b []byte, v string) []byte {
	if len(v) <= maxEntryLen {
		return appendEscaped(b, v, false)
	}
	return appendDigest(appendEscaped(b, v[:64], false), v)
}

// appendEscaped appends v with '%' and ':' escaped, and '=' too when eq is
// set (an entry's key before its '=' and value), so that the parts of a
// key cannot run into each other.
func appendEscaped(b []byte, v string, eq bool) []byte {
	if strings.IndexByte(v, '%') < 0 && strings.IndexByte(v, ':') < 0 && (!eq || strings.IndexByte(v, '=') < 0) {
		return append(b, v...)
	}
	for i := 0; i < len(v); i++ {
		switch {
		case v[i] == '%':
			b = append(b, "%25"...)
		case v[i] == ':':
			b = append(b, "%3A"...)
		case v[i] == '=' && eq:
			b = append(b, "%3D"...)
		default:
			b = append(b, v[i])
		}
	}
	return b
}

func addSat(a, b costmodel.NanoUSD) costmodel.NanoUSD {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}
