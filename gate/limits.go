package gate

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/weighted"
)

// compiledLimit is a limit or budget ready for the request path.
type compiledLimit struct {
	limit      weighted.Limit
	unit       string
	cost       func(costmodel.Usage, costmodel.NanoUSD) int64 // nil for requests and extra limits
	plans      []string                                       // empty: every plan
	dims       []string
	dimension  string // dims joined by "+", as telemetry and messages name them
	budget     bool   // a denial is 402 budget_exceeded rather than 429
	period     string // a budget's period: day or month
	shadow     bool   // a denial is recorded, never enforced
	failClosed bool
	tagged     bool        // the key carries the tenant as its hash tag
	global     bool        // a limit of the whole deployment (globalLimit): the key carries globalTag as its hash tag
	byIP       bool        // the key has the ip dimension
	byModel    bool        // the key has the model dimension
	byUpstream bool        // the key has the upstream dimension
	byCaller   bool        // the key has the user or api_key dimension
	attrs      []string    // the attributes the key names (attr.NAME), without the prefix
	extra      int         // 1 + the index of a request's extra limit; 0 for a configured one
	fixedKey   string      // a control-plane level's limit: its key, whatever the request
	level      *LevelLimit // a control-plane level's limit, nil for a configured one
	// model is the other model (canonical) whose item this copy of a
	// limit keyed by model is, for a request that may run models besides
	// its own (see others.go); empty for the request's own model's.
	model string
}

// costOf is the limit's cost of a request that counts for requests
// requests and uses u, which costs c.
func (l *compiledLimit) costOf(requests int64, u costmodel.Usage, c costmodel.NanoUSD) int64 {
	if l.unit == "requests" {
		return requests
	}
	return l.cost(u, c)
}

func compileLimit(l config.LimitConfig) (*compiledLimit, error) {
	wl, err := l.Weighted()
	if err != nil {
		return nil, err
	}
	return &compiledLimit{
		limit:      wl,
		unit:       l.Unit,
		cost:       config.Units[l.Unit],
		plans:      l.Plans,
		dims:       l.Dimensions,
		dimension:  strings.Join(l.Dimensions, "+"),
		shadow:     l.Mode == "shadow",
		failClosed: l.OnStoreFailure == "fail_closed",
		tagged:     callerDims(l.Dimensions),
		global:     globalLimit(l),
		byIP:       slices.Contains(l.Dimensions, "ip"),
		byModel:    slices.Contains(l.Dimensions, "model"),
		byUpstream: slices.Contains(l.Dimensions, "upstream"),
		byCaller:   slices.Contains(l.Dimensions, "user") || slices.Contains(l.Dimensions, "api_key"),
		attrs:      attrDims(l.Dimensions),
	}, nil
}

// attrDims lists the attributes that dims name, without their prefix.
func attrDims(dims []string) []string {
	var out []string
	for _, d := range dims {
		if name, ok := strings.CutPrefix(d, config.AttributePrefix); ok {
			out = append(out, name)
		}
	}
	return out
}

// compileBudget makes a budget a fixed-window limit in nano-dollars whose
// window is the budget's period: a day from UTC midnight, or a UTC calendar
// month.
func compileBudget(b config.BudgetConfig) *compiledLimit {
	l := weighted.Limit{Name: b.Name, Algorithm: weighted.FixedWindow, Rate: int64(b.Amount), Period: 24 * time.Hour}
	if b.Period == "month" {
		l.Period, l.Calendar = 0, weighted.Month
	}
	l.Lease = b.Lease.Weighted(l.Rate)
	return &compiledLimit{
		limit:      l,
		unit:       "usd",
		cost:       config.Units["usd"],
		plans:      b.Plans,
		dims:       []string{b.Scope},
		dimension:  b.Scope,
		budget:     true,
		byCaller:   b.Scope != "tenant",
		period:     b.Period,
		tagged:     true,
		failClosed: b.OnStoreFailure == "fail_closed",
	}
}

// window is the length of the limit's window that holds now: its period,
// or for a calendar month the month's length.
func (l *compiledLimit) window(now time.Time) time.Duration {
	if l.limit.Calendar != weighted.Month {
		return l.limit.Period
	}
	now = now.UTC()
	start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	return start.AddDate(0, 1, 0).Sub(start)
}

func (l *compiledLimit) appliesTo(plan string) bool {
	return len(l.plans) == 0 || slices.Contains(l.plans, plan)
}

// keyedFor tells whether req carries what l's key needs: a limit keyed by
// ip does not apply to a request that comes with no client address (the
// rate limit service's, a trusted caller's), whose key would be one
// ":ip=" shared by every tenant's such requests; nor does a limit keyed by
// an attribute apply to a request without it (or with it empty), as every
// proxied request is, whose key would be one ":attr.NAME=" shared by all
// of them: one tenant's proxied traffic would spend it for the others,
// and hold each tenant's proxied traffic to one attribute value's rate.
// (A caller that leaves an attribute out gains nothing it could not have
// by naming a value of its own.) Likewise a limit keyed by model does not
// apply to a request that uses no model (a generic upstream's, a
// reservation or a rate limit call that names none: its estimate counted
// no tokens), nor one keyed by upstream to a request that names no
// upstream (a reservation's, a rate limit call's): each would be one
// ":model=" or ":upstream=" key every tenant's such requests spend. A
// request to a model API that names no model still counts under the
// empty model, as what the upstream serves it is not known.
func (l *compiledLimit) keyedFor(req *Request) bool {
	if l.byIP && req.IP == "" ||
		l.byModel && req.Estimate.Model == "" && req.Estimate.Encoding == "" ||
		l.byUpstream && req.Upstream == "" {
		return false
	}
	for _, a := range l.attrs {
		if req.Attributes[a] == "" {
			return false
		}
	}
	return true
}

// key builds the limit's key from the request's attributes. Keys that carry
// a tenant put it in a hash tag, so that all of one tenant's limits live in
// one Redis Cluster slot and are debited by one script call.
func (l *compiledLimit) key(r *Reservation) string {
	if l.fixedKey != "" {
		return l.fixedKey
	}
	var b strings.Builder
	b.Grow(64)
	switch {
	case l.tagged:
		b.WriteString("{")
		b.WriteString(r.req.Caller.Tenant)
		b.WriteString("}")
	case l.global:
		b.WriteString("{" + globalTag + "}")
	}
	for _, d := range l.dims {
		b.WriteByte(':')
		b.WriteString(d)
		b.WriteByte('=')
		if l.model != "" && d == "model" {
			writeKeyValue(&b, l.model)
			continue
		}
		if r.written != nil {
			if v, ok := r.written.of(d); ok {
				b.WriteString(v)
				continue
			}
		}
		writeKeyValue(&b, r.dimension(d))
	}
	return b.String()
}

// ipKey is what a limit's key holds of a client address: an IPv4
// address (an IPv4-mapped IPv6 address as its IPv4 form), or an IPv6
// address's /64, the least a host is given and which it picks addresses
// in as it likes (RFC 4941 privacy addresses change on their own): keyed
// by the whole address, a per-IP limit would be a fresh key for each
// request of an IPv6 client. Text that is no address is kept as it is.
func ipKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	switch {
	case a.Is4():
		return ip // already its one spelling: ParseAddr takes no other
	case a.Is4In6():
		return a.Unmap().String()
	}
	p, err := a.WithZone("").Prefix(64)
	if err != nil {
		return ip
	}
	return p.String()
}

// writeKeyValue writes a dimension's value into a limit's key with '%',
// ':', '=', '{' and '}' percent-encoded, so that no value can run into the
// next dimension (user "a:model=b" with model "c" and user "a" with model
// "b:model=c" are two keys, not one), nor give a key without the tenant's
// tag a hash tag of the caller's choosing: a model "x{acme}" would put a
// global limit's counter in tenant acme's Redis Cluster slot, under acme's
// generation marker, and a stale answer there would restore acme's
// counters. A value without them, which every configured name and priced
// model is, is written as it is. A value longer than maxKeyValue bytes
// is written as its first bytes, "%~" and its SHA-256 in hex, which no
// shorter value's writing holds (each of its '%' starts a %XX): a key
// stays within a few kilobytes whatever a caller sends, and no two values
// share one.
func writeKeyValue(b *strings.Builder, v string) {
	if plainKeyValue(v) {
		b.WriteString(v)
		return
	}
	if len(v) > maxKeyValue {
		sum := sha256.Sum256([]byte(v))
		writeKeyValue(b, v[:maxKeyValue-2-2*sha256.Size])
		b.WriteString("%~")
		b.WriteString(hex.EncodeToString(sum[:]))
		return
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '%':
			b.WriteString("%25")
		case ':':
			b.WriteString("%3A")
		case '=':
			b.WriteString("%3D")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
}

// plainKeyValue tells whether writeKeyValue writes v as it is: short
// enough, and without a byte it escapes.
func plainKeyValue(v string) bool {
	return len(v) <= maxKeyValue && !strings.ContainsAny(v, "%:={}")
}

// maxKeyValue bounds the bytes of a dimension's value a limit's key holds
// as it is (before escaping): the longest model name costgate takes
// (costmodel.MaxModelName), above the longest tenant, user or key the
// ledger records (ledger.MaxKeyField), so that no counter the ledger
// restores is written any other way.
const maxKeyValue = costmodel.MaxModelName

// callerScoped tells whether the limit's key depends on the caller alone
// (tenant, user, api_key), so that it has one state per caller: budgets,
// and the limits a tenant's usage view shows.
func (l *compiledLimit) callerScoped() bool {
	for _, d := range l.dims {
		if d != "tenant" && d != "user" && d != "api_key" {
			return false
		}
	}
	return true
}

// restorable tells whether the limit's counter is brought up to the
// ledger's count when the store lost it, as a budget's is: a configured
// limit keyed by the caller alone (tenant, user, api_key), or by the
// caller and what an entry records of the request (see keyedByEntry), or
// a limit of the whole deployment (see globalLimit), of an algorithm that
// counts an amount over a window (a sliding log too: its count comes back
// as one mark at the restore's time, see weighted.Restorer; not a
// concurrency limit's units in flight), in any unit. Its count is the
// ledger's, what the entries in the limit's window of the caller (every
// tenant's for a limit of the deployment; and of the model, route,
// upstream, region, client address or attributes its key names) counted
// in its unit (see spentSince, ledgerCount). An entry stored before the
// ledger kept the keys' address and attributes counts on no counter of a
// limit keyed by them (see ledger.Entry.KeyIP).
func (l *compiledLimit) restorable() bool {
	return !l.budget && l.level == nil && l.extra == 0 && (l.global || l.callerScoped() || l.keyedByEntry()) &&
		l.limit.Algorithm != weighted.Concurrency
}

// keyedByEntry tells whether the limit's key names the caller (tenant,
// user or api_key: the key's hash tag is the tenant) and, besides it,
// only what a ledger entry records of a request (see entryDim), at least
// one such dimension. Its
// counters are restored from the tenant's entries grouped by those (see
// Gate.ledgerGroupCounters).
func (l *compiledLimit) keyedByEntry() bool {
	more := false
	for _, d := range l.dims {
		switch {
		case d == "tenant", d == "user", d == "api_key":
		case entryDim(d):
			more = true
		default:
			return false
		}
	}
	return more && l.tagged
}

// entryDim tells whether a ledger entry records what a limit's key holds
// of dimension d: the request's model, route, upstream or region, or
// what the key held of its client address or an attribute
// (ledger.Entry.KeyIP, KeyAttrs). The ledger restores a limit keyed by
// these, with the caller (keyedByEntry) or without (globalLimit).
func entryDim(d string) bool {
	switch d {
	case "model", "route", "upstream", "region", "ip":
		return true
	}
	return strings.HasPrefix(d, config.AttributePrefix)
}

// callerRestorable tells whether the limit is restorable and keyed by
// the caller alone: its counters are restored per caller (see
// Gate.limitCounters, Gate.ledgerLimitCounters).
func (l *compiledLimit) callerRestorable() bool {
	return l.restorable() && l.tagged && l.callerScoped()
}

// ledgerCount is what the ledger's counts c (ledger.Counts) are in the
// limit's unit: requests, tokens (input and output together), input or
// output tokens; 0 for usd, which the ledger's spend counts instead.
func (l *compiledLimit) ledgerCount(c ledger.Counts) int64 {
	switch l.unit {
	case "requests":
		return c.Requests
	case "tokens":
		return c.Tokens()
	case "input_tokens":
		return c.InputTokens
	case "output_tokens":
		return c.OutputTokens
	}
	return 0
}

// globalTag is the hash tag of the keys of the limits of the whole
// deployment (see globalLimit), "{{global}:...", so that their store
// keeps a generation marker for them as for a tenant's: no tenant has
// it, as no tenant's name holds a '{' (the configuration refuses one, the
// control plane's names are [a-z0-9_.-], the rate limit service writes
// %7B).
const globalTag = "{global"

// globalLimit tells whether configured limit l is a limit of the whole
// deployment: keyed by none of the caller's dimensions, only by what a
// ledger entry records of a request (see entryDim), or by nothing (one key for every request: the
// deployment's spend cap or allowance). Its keys carry globalTag, whose
// generation marker tells a loss: its counters are then restored from
// every tenant's entries in the ledger (see freshStore.restoreGlobal), an
// address's requests a minute across every tenant too, and a
// concurrency limit's requests in flight are held again by their
// holders' renewals, this replica's before the request that found the
// loss is decided (see freshStore.restored). Without the tag, the key
// would have no marker, and the limit would come back empty.
func globalLimit(l config.LimitConfig) bool {
	return !slices.ContainsFunc(l.Dimensions, func(d string) bool { return !entryDim(d) })
}

// spendCap tells whether l is a limit of the whole deployment in dollars
// with one key for every request (no dimension, or the region alone) and
// for every plan: without regions, its counter is restored from the
// ledger's roll-up of every tenant's spend (Ledger.TotalSpend), which
// reads no entry. One of some plans is restored from their entries (see
// Gate.ledgerGroupCounters): the roll-up does not say the plans.
func (l *compiledLimit) spendCap() bool {
	return l.global && l.unit == "usd" && len(l.plans) == 0 && l.limit.Algorithm != weighted.Concurrency &&
		!slices.ContainsFunc(l.dims, func(d string) bool { return d != "region" })
}

// spentSince is when the spend that the limit's counter holds at now
// starts: a fixed window's start (the store's windows are multiples of
// the period since the Unix epoch, or calendar months); a sliding
// window's or a sliding log's period back; for a token bucket or GCRA,
// the time it takes to refill from empty back, which holds its debt
// but for what a charge beyond empty made longer ago left owed (the
// ledger's totals do not say how the spend spread over it).
// The start is rounded down to the minute, which counts at most a minute
// more.
func (l *compiledLimit) spentSince(now time.Time) time.Time {
	now = now.UTC()
	var from time.Time
	switch p := l.limit.Period; l.limit.Algorithm {
	case weighted.FixedWindow:
		if l.limit.Calendar == weighted.Month {
			return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
		}
		return time.UnixMicro(now.UnixMicro() / p.Microseconds() * p.Microseconds()).UTC()
	case weighted.SlidingWindow, weighted.SlidingLog:
		from = now.Add(-p)
	default:
		burst := cmp.Or(l.limit.Burst, l.limit.Rate)
		refill := time.Duration(min(float64(p)*float64(burst)/float64(max(l.limit.Rate, 1)), float64(weighted.MaxPeriod)))
		from = now.Add(-refill)
	}
	return from.Truncate(time.Minute)
}

// keyedBy sets e's KeyModel and KeyRoute (see ledger.Entry.KeyModel) to
// the model and the route r's limits are keyed by (see key), where they
// are not e's Model and Route: a downgrade serves another model than the
// one asked for, and a reserve API request the caller names is keyed by
// the API's route. An alias or another spelling of the model, the
// upstream's dated name, is not: the restore keys by the canonical name
// of the entry's model. It sets e's KeyIP and KeyAttrs to what the keys
// of the configuration's limits hold of r's client address and
// attributes (see keyDims.record). A restore of the counters of limits
// keyed by model, route, address or attribute (Gate.ledgerGroupCounters)
// reads them.
func (r *Reservation) keyedBy(e *ledger.Entry) {
	e.KeyModel, e.KeyRoute = "", ""
	if !r.keysRead {
		// Once a reservation: its entry is written at its record, its
		// extensions and its settlement.
		r.keyIP, r.keyAttrs = r.st.keyDims.record(&r.req)
		r.keysRead = true
	}
	e.KeyIP, e.KeyAttrs = r.keyIP, r.keyAttrs
	// A model the limiter would key by the same canonical name (an alias,
	// the upstream's dated name) needs none: the restore canonicalizes
	// the entry's model, and the spool and the store keep one string
	// less for most settlements.
	if r.model != e.Model && r.st.est.Canonical(e.Model) != r.model {
		e.KeyModel = r.model
	}
	if r.req.Route != e.Route {
		e.KeyRoute = r.req.Route
	}
}

// callerKey is the key of a caller-scoped limit for caller c, outside any
// request (the usage view, budget reconciliation).
func (l *compiledLimit) callerKey(c *Caller) string {
	return l.key(&Reservation{req: Request{Caller: c}})
}

// callerOfKey is the caller of tenant whose key of l, a caller-scoped
// budget, is key; false when key is none of tenant's.
func (l *compiledLimit) callerOfKey(tenant, key string) (*Caller, bool) {
	if len(l.dims) != 1 {
		return nil, false
	}
	v, ok := strings.CutPrefix(key, "{"+tenant+"}:"+l.dims[0]+"=")
	if !ok {
		return nil, false
	}
	if u, err := url.PathUnescape(v); err == nil {
		v = u
	}
	c := &Caller{Tenant: tenant}
	switch l.dims[0] {
	case "user":
		c.User = v
	case "api_key":
		c.KeyID = v
	}
	return c, l.callerKey(c) == key
}

// callerDims tells whether any dimension names the caller, which puts the
// tenant in the key's hash tag.
func callerDims(dims []string) bool {
	return slices.Contains(dims, "tenant") || slices.Contains(dims, "user") || slices.Contains(dims, "api_key")
}
