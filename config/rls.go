package config

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/costgate/costgate/weighted"
)

// RLSConfig maps the requests of Envoy's rate limit service (a domain and
// its descriptors) to costgate's tenants, limits and budgets. Its shape
// follows envoyproxy/ratelimit's descriptor configuration: nested
// descriptors, each with a key, an optional value (exact, or a prefix
// ending in "*"), an optional rate_limit, shadow_mode and unlimited. It
// adds what costgate knows and Envoy does not: which entry names the
// tenant, the user or the model, what a hit counts (requests or tokens),
// and what a hit costs.
//
// A descriptor of a request matches the node reached by its entries one
// level each: at each level the entry's key must be a node's key, and its
// value the node's exact value, else the longest wildcard prefix that
// matches it, else any value (a node without a value). A descriptor with
// more or fewer entries than the path to a node does not match it. The
// node reached decides the descriptor's limit; the nodes on the way may
// name the tenant, the user and the model.
type RLSConfig struct {
	// Reflection turns on the gRPC reflection service on rls_listen, for
	// tools such as grpcurl. It is read when the listener starts. Default
	// false.
	Reflection bool `yaml:"reflection"`
	// Transport is the gRPC server that serves rls_listen: "grpcwire"
	// (costgate's own, for the calls the service answers: a fraction of
	// grpc-go's CPU per call) or "grpc-go" (grpc-go's server, which the
	// reflection service needs). Empty: grpcwire, or grpc-go with
	// reflection. It is read when the listener starts.
	Transport string `yaml:"transport"`
	// Domains are the rate limit domains served. A request for a domain
	// not listed is answered OK with no limit, as envoyproxy/ratelimit
	// does.
	Domains []RLSDomain `yaml:"domains"`
}

// The transports of rls.transport.
const (
	RLSTransportWire   = "grpcwire"
	RLSTransportGRPCGo = "grpc-go"
)

// RLSDomain is one rate limit domain: the descriptors Envoy sends with it.
type RLSDomain struct {
	// Domain is the name Envoy's rate limit filter sends. Required.
	Domain      string          `yaml:"domain"`
	Descriptors []RLSDescriptor `yaml:"descriptors"`
}

// RLSDescriptor is one node of a domain's descriptor tree.
type RLSDescriptor struct {
	// Key is the descriptor entry's key. Required.
	Key string `yaml:"key"`
	// Value is the entry's value: empty matches any value (each value
	// counting on its own), "prefix*" any value that starts with prefix
	// (each value counting on its own), anything else exactly that value.
	Value string `yaml:"value"`

	// As says what the entry's value is to costgate: "tenant" (a tenant:
	// its plan's limits and budgets apply to the request), "user" (the
	// tenant's user, for limits and budgets by user), "model" (the model
	// token hits are priced and model limits keyed by). Empty: nothing.
	As string `yaml:"as"`
	// Tenant names the tenant a request matching this node comes from,
	// whatever the entry's value; it conflicts with as: tenant.
	Tenant string `yaml:"tenant"`
	// Plan is the plan of a tenant named here that the configuration does
	// not list (tenants listed keep their own plan). Empty: no plan, and
	// only the limits and budgets for every plan apply.
	Plan string `yaml:"plan"`
	// Model names the model of a request matching this node; it conflicts
	// with as: model.
	Model string `yaml:"model"`

	// Hits is what a hit of a descriptor ending here counts: requests
	// (default), or tokens (a total: input plus output tokens),
	// input_tokens or output_tokens. A descriptor in tokens is the
	// two-phase pattern: a hits_addend of 0 checks that its limits have
	// room left and debits nothing, and a positive one is the actual
	// usage of a request already served (Envoy's apply_on_stream_done),
	// debited whatever the limits say. A request's total bills only the
	// tokens it reports beyond its input and output tokens, at the
	// model's dearer price.
	Hits string `yaml:"hits"`
	// PricePerHit is what one hit costs, in dollars, debited from the
	// tenant's usd limits and budgets and written to the ledger. Only for
	// hits in requests: token hits are priced by their model.
	PricePerHit USD `yaml:"price_per_hit"`

	// RateLimit is the limit of a descriptor ending here; none means the
	// descriptor is limited only by its tenant's limits and budgets.
	RateLimit *RLSRateLimit `yaml:"rate_limit"`
	// ShadowMode records the limit's denials and never enforces them.
	ShadowMode bool `yaml:"shadow_mode"`
	// OnStoreFailure is the limit's posture when the limiter store fails:
	// fail_open (default, within the local fallback budget) or
	// fail_closed (OVER_LIMIT).
	OnStoreFailure string `yaml:"on_store_failure"`
	// OnDataLoss is what the limit's counters do when the limiter store
	// loses its data (a Redis restarted empty, FLUSHALL, a lagging
	// failover): restore (default) brings each back from the ledger,
	// where every call that counts on a tenant's descriptor limit is
	// recorded (an entry per call, at no cost when it costs nothing);
	// forget lets them start empty, one more window each, and records
	// nothing for them, as envoyproxy/ratelimit and gubernator do.
	OnDataLoss string `yaml:"on_data_loss"`

	// Descriptors are the nodes one level down.
	Descriptors []RLSDescriptor `yaml:"descriptors"`
}

// RLSRateLimit is a descriptor's limit, as envoyproxy/ratelimit writes it:
// requests_per_unit hits per unit of time.
type RLSRateLimit struct {
	// Name names the limit in the RateLimit fields, the telemetry and the
	// limiter's keys. Default: the domain and the path of keys and values,
	// joined with dots ("costgate.tenant.generic_key_search"). Names are
	// unique among all limits and budgets.
	Name string `yaml:"name"`
	// Unit is second, minute, hour, day, week, month (30 days) or year
	// (365 days), as in Envoy.
	Unit string `yaml:"unit"`
	// UnitMultiplier makes the period UnitMultiplier units. Default 1.
	UnitMultiplier int64 `yaml:"unit_multiplier"`
	// RequestsPerUnit is the number of hits (in Hits) admitted per period.
	// 0 refuses every request that matches (a block list).
	RequestsPerUnit int64 `yaml:"requests_per_unit"`
	// Unlimited answers OK without counting, with limit_remaining at its
	// largest.
	Unlimited bool `yaml:"unlimited"`
	// Algorithm counts the hits: token_bucket (default, as costgate's
	// limits: RequestsPerUnit a period, a burst of RequestsPerUnit),
	// fixed_window (as envoyproxy/ratelimit counts), gcra, sliding_window
	// or sliding_log. A window algorithm costs each request a second
	// limiter call, which settles its reservation.
	Algorithm string `yaml:"algorithm"`
	// Burst is a token bucket's or GCRA's capacity; default
	// RequestsPerUnit.
	Burst int64 `yaml:"burst"`
	// Lease makes the limit leased, as a configured limit's lease (see
	// LeaseConfig): each replica spends slices of a key's allowance in
	// process. Nil is strict.
	Lease *LeaseConfig `yaml:"lease"`
	// Replaces names limits of descriptors of the same domain that this
	// one overrides, as in envoyproxy/ratelimit: when a request's
	// descriptors match this limit and a replaced one, the replaced one
	// is not applied (its descriptor still names its tenant, user and
	// model).
	Replaces []RLSReplace `yaml:"replaces"`
}

// RLSReplace names a replaced limit.
type RLSReplace struct {
	Name string `yaml:"name"`
}

// RLSUnits are the rate limit units of time, as Envoy names them.
var RLSUnits = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// RLSHits are what a descriptor's hits may count.
var RLSHits = []string{"requests", "tokens", "input_tokens", "output_tokens"}

// Period is the limit's period: its unit times its multiplier.
func (r *RLSRateLimit) Period() time.Duration {
	return RLSUnits[r.Unit] * time.Duration(max(r.UnitMultiplier, 1))
}

// Weighted converts the limit to the limiter's form; it is valid when the
// configuration is, and the limit is neither unlimited nor a block
// (RequestsPerUnit 0).
func (r *RLSRateLimit) Weighted() (weighted.Limit, error) {
	alg, err := weighted.ParseAlgorithm(r.Algorithm)
	if err != nil {
		return weighted.Limit{}, err
	}
	l := weighted.Limit{Name: r.Name, Algorithm: alg, Rate: r.RequestsPerUnit, Period: r.Period(), Burst: r.Burst}
	l.Lease = r.Lease.Weighted(l.Capacity())
	return l, l.Validate()
}

func (c *RLSConfig) applyDefaults() {
	for i := range c.Domains {
		d := &c.Domains[i]
		for j := range d.Descriptors {
			d.Descriptors[j].applyDefaults(d.Domain, "")
		}
	}
}

func (n *RLSDescriptor) applyDefaults(domain, parent string) {
	if n.Hits == "" {
		n.Hits = "requests"
	}
	if n.OnStoreFailure == "" {
		n.OnStoreFailure = "fail_open"
	}
	if n.OnDataLoss == "" {
		n.OnDataLoss = "restore"
	}
	path := parent + "." + n.Key
	if n.Value != "" {
		path += "_" + n.Value
	}
	if r := n.RateLimit; r != nil && !r.Unlimited {
		if r.Algorithm == "" {
			r.Algorithm = "token_bucket"
		}
		if r.UnitMultiplier == 0 {
			r.UnitMultiplier = 1
		}
		if r.Name == "" {
			r.Name = limitName(domain + path)
		}
	}
	for i := range n.Descriptors {
		n.Descriptors[i].applyDefaults(domain, path)
	}
}

// limitName makes s fit to name a limit: ':', '{' and '}' delimit the
// limiter's keys, and become '_'.
func limitName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ':' || r == '{' || r == '}' {
			return '_'
		}
		return r
	}, s)
}

// validateRLS checks rls_listen and the rls section; names holds the
// names of the limits and budgets, which the RLS limits must not reuse.
// While some limit or budget applies by plan, a descriptor's plan must be
// one the configuration knows (see Plans).
func (c *Config) validateRLS(names map[string]bool, bad func(path, format string, args ...any)) {
	known, scoped := c.Plans()
	if c.RLSListen != "" {
		if _, _, err := net.SplitHostPort(c.RLSListen); err != nil {
			bad("rls_listen", "must be host:port, such as 127.0.0.1:8081 (%v)", err)
		} else if !loopback(c.RLSListen) && c.publishedSecrets() {
			bad("rls_listen", "this configuration holds published demo keys: serve the rate limit service on a loopback address, not %q, or give the tenants keys and an admin token of your own", c.RLSListen)
		}
	}
	switch c.RLS.Transport {
	case "", RLSTransportGRPCGo:
	case RLSTransportWire:
		if c.RLS.Reflection {
			bad("rls.transport", "the reflection service (rls.reflection) needs transport %q, or no transport", RLSTransportGRPCGo)
		}
	default:
		bad("rls.transport", "must be %q or %q, not %q", RLSTransportWire, RLSTransportGRPCGo, c.RLS.Transport)
	}
	domains := map[string]bool{}
	for i, d := range c.RLS.Domains {
		p := fmt.Sprintf("rls.domains[%d]", i)
		switch {
		case d.Domain == "":
			bad(p+".domain", "required: the domain Envoy's rate limit filter sends")
		case domains[d.Domain]:
			bad(p+".domain", "duplicate domain %q", d.Domain)
		}
		domains[d.Domain] = true
		validateRLSLevel(d.Descriptors, p, false, names, bad)
		validateReplaces(d.Descriptors, p, rlsLimitNames(d.Descriptors, map[string]bool{}), bad)
		if scoped {
			validateRLSPlans(d.Descriptors, p, known, bad)
		}
	}
}

// validateRLSPlans reports a descriptor's plan that is not one of known,
// the configuration's plans, while limits or budgets apply by plan: a tenant only
// the rate limit service names, on a misspelt plan, would get none of
// its plan's limits and budgets, silently (the control plane refuses
// such a plan for the tenants it holds).
func validateRLSPlans(nodes []RLSDescriptor, p string, known []string, bad func(path, format string, args ...any)) {
	for j, n := range nodes {
		np := fmt.Sprintf("%s.descriptors[%d]", p, j)
		if n.Plan != "" && !slices.Contains(known, n.Plan) {
			bad(np+".plan", "no tenant has plan %q, and limits or budgets apply by plan: a tenant on it would get none of them (the tenants' plans: %s)", n.Plan, strings.Join(known, ", "))
		}
		validateRLSPlans(n.Descriptors, np, known, bad)
	}
}

// Limits are the counted limits (not unlimited) of every domain's
// descriptors, in the order of the configuration, depth first.
func (c *RLSConfig) Limits() []*RLSRateLimit {
	var out []*RLSRateLimit
	for i := range c.Domains {
		out = rlsLimits(c.Domains[i].Descriptors, out)
	}
	return out
}

// rlsLimits appends to out the counted limits of nodes and of the nodes
// below them.
func rlsLimits(nodes []RLSDescriptor, out []*RLSRateLimit) []*RLSRateLimit {
	for i := range nodes {
		if r := nodes[i].RateLimit; r != nil && !r.Unlimited {
			out = append(out, r)
		}
		out = rlsLimits(nodes[i].Descriptors, out)
	}
	return out
}

// rlsLimitNames adds to names the names of the limits of nodes and of
// the nodes below them.
func rlsLimitNames(nodes []RLSDescriptor, names map[string]bool) map[string]bool {
	for _, r := range rlsLimits(nodes, nil) {
		names[r.Name] = true
	}
	return names
}

// validateReplaces checks that the limits nodes replace are limits of
// the domain's descriptors (names), other than their own.
func validateReplaces(nodes []RLSDescriptor, p string, names map[string]bool, bad func(path, format string, args ...any)) {
	for j, n := range nodes {
		np := fmt.Sprintf("%s.descriptors[%d]", p, j)
		if r := n.RateLimit; r != nil {
			for k, rp := range r.Replaces {
				rpp := fmt.Sprintf("%s.rate_limit.replaces[%d].name", np, k)
				switch {
				case rp.Name == "":
					bad(rpp, "required: the name of a rate_limit of this domain's descriptors")
				case rp.Name == r.Name:
					bad(rpp, "a limit cannot replace itself")
				case !names[rp.Name]:
					bad(rpp, "no descriptor of this domain has a rate_limit named %q", rp.Name)
				}
			}
		}
		validateReplaces(n.Descriptors, np, names, bad)
	}
}

// validateRLSLevel checks nodes, one level of descriptors at path p;
// tenanted is set when a node above names a tenant (tenant or as: tenant).
func validateRLSLevel(nodes []RLSDescriptor, p string, tenanted bool, names map[string]bool, bad func(path, format string, args ...any)) {
	seen := map[[2]string]bool{}
	// The keys some node of the level reads as a model: costgate reads
	// every value of such a key as a model's name (lowercased, an alias as
	// its model), which would make two tenants or users one.
	models := map[string]bool{}
	for _, n := range nodes {
		if n.As == "model" {
			models[n.Key] = true
		}
	}
	for j, n := range nodes {
		np := fmt.Sprintf("%s.descriptors[%d]", p, j)
		if (n.As == "tenant" || n.As == "user") && models[n.Key] {
			bad(np+".as", "key %q is read as a model's name by another descriptor of this level: a %s is read as it is; give the %s its own key", n.Key, n.As, n.As)
		}
		if n.Key == "" {
			bad(np+".key", "required: the descriptor entry's key")
		}
		switch k := [2]string{n.Key, n.Value}; {
		case seen[k] && n.Value == "":
			bad(np, "duplicate descriptor key %q with any value", n.Key)
		case seen[k]:
			bad(np+".value", "duplicate descriptor key %q with value %q", n.Key, n.Value)
		default:
			seen[k] = true
		}
		if n.Value == "*" {
			bad(np+".value", "leave the value out to match any value")
		} else if i := strings.IndexByte(n.Value, '*'); i >= 0 && i != len(n.Value)-1 {
			bad(np+".value", "only a trailing * is a wildcard (%q)", n.Value)
		}
		if !slices.Contains([]string{"", "tenant", "user", "model"}, n.As) {
			bad(np+".as", "must be tenant, user or model, not %q", n.As)
		}
		if n.Tenant != "" && n.As == "tenant" {
			bad(np+".tenant", "set tenant or as: tenant, not both")
		}
		if n.Model != "" && n.As == "model" {
			bad(np+".model", "set model or as: model, not both")
		}
		if strings.ContainsAny(n.Tenant, "{}") {
			bad(np+".tenant", "must not contain '{' or '}' (they delimit the limiter's hash tags)")
		}
		checkRecorded(bad, np+".tenant", n.Tenant)
		checkRecorded(bad, np+".plan", n.Plan)
		if n.Plan != "" && n.Tenant == "" && n.As != "tenant" {
			bad(np+".plan", "a plan is for the tenant this node names: set tenant or as: tenant")
		}
		if !slices.Contains(RLSHits, n.Hits) {
			bad(np+".hits", "must be one of %s, not %q", strings.Join(RLSHits, ", "), n.Hits)
		}
		if n.PricePerHit < 0 {
			bad(np+".price_per_hit", "must not be negative")
		}
		if n.PricePerHit != 0 && n.Hits != "requests" {
			bad(np+".price_per_hit", "only hits in requests take a price; %s are priced by their model (model or as: model)", n.Hits)
		}
		if n.OnStoreFailure != "fail_open" && n.OnStoreFailure != "fail_closed" {
			bad(np+".on_store_failure", "must be fail_open or fail_closed, not %q", n.OnStoreFailure)
		}
		if n.OnDataLoss != "restore" && n.OnDataLoss != "forget" {
			bad(np+".on_data_loss", "must be restore or forget, not %q", n.OnDataLoss)
		}
		if r := n.RateLimit; r != nil {
			validateRLSLimit(r, np+".rate_limit", names, bad)
			// An unlimited descriptor is answered without the gate: a price
			// or a usage in tokens on it would go uncounted and unbilled.
			if r.Unlimited && n.PricePerHit != 0 {
				bad(np+".price_per_hit", "an unlimited descriptor is neither counted nor charged: drop unlimited (without a rate_limit, a descriptor counts on its tenant's limits and budgets only) or the price")
			}
			if r.Unlimited && n.Hits != "requests" {
				bad(np+".hits", "an unlimited descriptor is neither counted nor charged: its %s would go unbilled; drop unlimited (without a rate_limit, a descriptor counts on its tenant's limits and budgets only)", n.Hits)
			}
		}
		named := tenanted || n.Tenant != "" || n.As == "tenant"
		if n.PricePerHit > 0 && !named {
			// A call's price is billed to the tenant its descriptor's
			// path names; with none, nobody would pay it.
			bad(np+".price_per_hit", "no tenant would be billed: set tenant or as: tenant on this descriptor or one above it")
		}
		validateRLSLevel(n.Descriptors, np, named, names, bad)
	}
}

func validateRLSLimit(r *RLSRateLimit, p string, names map[string]bool, bad func(path, format string, args ...any)) {
	if r.Unlimited {
		if r.Unit != "" || r.RequestsPerUnit != 0 || r.Algorithm != "" || r.Burst != 0 || r.Name != "" || r.UnitMultiplier != 0 || len(r.Replaces) > 0 || r.Lease != nil {
			bad(p+".unlimited", "an unlimited descriptor takes no other rate_limit field")
		}
		return
	}
	switch {
	case names[r.Name]:
		bad(p+".name", "duplicate limit or budget name %q (the default name is the domain and the descriptor's path: set a name)", r.Name)
	case strings.ContainsAny(r.Name, ":{}"):
		bad(p+".name", "must not contain ':', '{' or '}' (they delimit the limiter's keys)")
	case strings.Contains(r.Name, ".override."):
		bad(p+".name", "must not contain \".override.\": DOMAIN.override.UNIT.N.RATE names the limits of Envoy's limit overrides")
	}
	names[r.Name] = true
	if _, ok := RLSUnits[r.Unit]; !ok {
		bad(p+".unit", "must be second, minute, hour, day, week, month or year, not %q", r.Unit)
		return
	}
	alg, err := weighted.ParseAlgorithm(r.Algorithm)
	switch {
	case err != nil:
		bad(p+".algorithm", "%s", strings.TrimPrefix(err.Error(), "weighted: "))
		return
	case alg == weighted.Concurrency:
		bad(p+".algorithm", "concurrency needs a release that Envoy never sends")
		return
	}
	r.Lease.validate(p+".lease", false, bad)
	if r.Lease != nil && r.RequestsPerUnit == 0 {
		bad(p+".lease", "a limit of 0 refuses everything and has nothing to lease")
	}
	switch {
	case r.RequestsPerUnit < 0:
		bad(p+".requests_per_unit", "must not be negative")
	case r.UnitMultiplier < 1:
		bad(p+".unit_multiplier", "must be positive")
	case r.Period() > weighted.MaxPeriod || r.Period()/RLSUnits[r.Unit] != time.Duration(r.UnitMultiplier):
		bad(p+".unit_multiplier", "the period is longer than the longest, %s", weighted.MaxPeriod)
	case r.Burst < 0:
		bad(p+".burst", "must not be negative")
	case r.RequestsPerUnit == 0:
		if r.Burst != 0 {
			bad(p+".burst", "a limit of 0 refuses everything and takes no burst")
		}
	case alg != weighted.TokenBucket && alg != weighted.GCRA && r.Burst != 0 && r.Burst != r.RequestsPerUnit:
		bad(p+".burst", "does not apply to %s (leave it out: the capacity is requests_per_unit)", alg)
	default:
		if _, err := r.Weighted(); err != nil {
			reason := err.Error()
			if _, rest, ok := strings.Cut(reason, fmt.Sprintf("limit %q: ", r.Name)); ok {
				reason = rest
			}
			bad(p, "%s", reason)
		}
	}
}

// publishedSecrets tells whether the configuration uses a published demo
// key or admin token.
func (c *Config) publishedSecrets() bool {
	if publicSecrets[c.AdminToken] {
		return true
	}
	for _, t := range c.Tenants {
		for _, k := range t.Keys {
			if publicSecrets[k.Secret()] {
				return true
			}
		}
	}
	return false
}

// Plans are what the configuration knows of plans: known, sorted, are the
// plans its tenants are on and its limits and budgets name; scoped tells
// whether some limit or budget applies by plan (plans: [...]). A tenant
// on a plan the configuration does not know gets none of the limits and
// budgets of a plan, so while scoped a tenant's plan (a control-plane
// tenant's, a rate limit service descriptor's) must be one of known;
// otherwise a plan is a free-form label.
func (c *Config) Plans() (known []string, scoped bool) {
	seen := map[string]bool{}
	add := func(plan string) {
		if plan != "" && !seen[plan] {
			seen[plan] = true
			known = append(known, plan)
		}
	}
	for _, t := range c.Tenants {
		add(t.Plan)
	}
	for _, l := range c.Limits {
		scoped = scoped || len(l.Plans) > 0
		for _, p := range l.Plans {
			add(p)
		}
	}
	for _, b := range c.Budgets {
		scoped = scoped || len(b.Plans) > 0
		for _, p := range b.Plans {
			add(p)
		}
	}
	slices.Sort(known)
	return known, scoped
}
