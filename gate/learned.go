package gate

import (
	"context"
	"errors"
	"fmt"
	"github.com/costgate/costgate/costmodel"
	"path/filepath"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/learned"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/policies"
)

// learning is the gate's learned output estimates (output_reserve: pNN).
type learning struct {
	table *learned.Table
	// reservations counts output reservations by basis: the learned
	// quantile, or the fallback for a key with too few observations.
	reservations metric.Int64Counter
	// overruns counts answers whose output exceeded a learned reservation,
	// and overrunTokens the output tokens beyond it, which settlement
	// charges.
	overruns, overrunTokens metric.Int64Counter
	// exposure is, per tenant, what its learned reservations in flight
	// leave unreserved (see config.LearnedConfig.MaxExposure).
	exposure          sync.Map // tenant -> *exposure
	maxUSD, maxTokens int64
	exposed           metric.Int64Counter
}

// exposure is what one tenant's learned reservations in flight leave
// unreserved, in nano-dollars and output tokens.
type exposure struct {
	mu          sync.Mutex
	usd, tokens int64
}

// take adds usd and tokens if both stay within their bounds.
func (x *exposure) take(usd, tokens, maxUSD, maxTokens int64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if usd > maxUSD-x.usd || tokens > maxTokens-x.tokens {
		return false
	}
	x.usd += usd
	x.tokens += tokens
	return true
}

func (x *exposure) give(usd, tokens int64) {
	x.mu.Lock()
	x.usd -= usd
	x.tokens -= tokens
	x.mu.Unlock()
}

var (
	basisLearned  = metric.WithAttributeSet(attribute.NewSet(attribute.String("basis", "learned")))
	basisFallback = metric.WithAttributeSet(attribute.NewSet(attribute.String("basis", "fallback")))
)

// openLearned opens the learned output estimates when cfg reserves a
// learned quantile: in Redis when the limiter store is Redis, else in
// data_dir/learned.json.
func (g *Gate) openLearned(ctx context.Context, cfg *config.Config) error {
	if cfg.Costs.OutputReserve.Quantile == 0 {
		return nil
	}
	lc := cfg.Costs.Learned
	c := learnedConfig(cfg, func(format string, args ...any) { g.log.Warn(fmt.Sprintf(format, args...), "component", "learned") })
	if g.redis != nil {
		c.Redis = g.redis
	} else {
		c.File = filepath.Join(cfg.DataDirPath(), "learned.json")
	}
	t, err := learned.Open(ctx, c)
	if err != nil {
		return err
	}
	l := &learning{table: t, maxUSD: int64(lc.MaxExposure), maxTokens: lc.MaxExposureTokens}
	if l.maxUSD == 0 {
		l.maxUSD = 1_000_000_000 // $1
	}
	if l.maxTokens == 0 {
		l.maxTokens = 100_000
	}
	m := g.tel.Meter("github.com/costgate/costgate/gate")
	if l.reservations, err = m.Int64Counter("costgate.learned.reservations",
		metric.WithDescription("LLM requests reserved under output_reserve: pNN, by basis: learned (the quantile) or fallback (too few observations)")); err != nil {
		t.Close()
		return err
	}
	if l.overruns, err = m.Int64Counter("costgate.learned.overruns",
		metric.WithDescription("answers whose output exceeded their learned reservation; settlement charged the difference")); err != nil {
		t.Close()
		return err
	}
	if l.overrunTokens, err = m.Int64Counter("costgate.learned.overrun.tokens",
		metric.WithDescription("output tokens beyond learned reservations, charged at settlement")); err != nil {
		t.Close()
		return err
	}
	if l.exposed, err = m.Int64Counter("costgate.learned.exposure.fallbacks",
		metric.WithDescription("requests that reserved their whole output limit because the tenant's learned reservations in flight reached costs.learned.max_exposure")); err != nil {
		t.Close()
		return err
	}
	g.learned = l
	g.closers = append(g.closers, t.Close)
	return nil
}

// Learned is the gate's learned output estimates; nil unless costgate
// started with output_reserve: pNN.
func (g *Gate) Learned() *learned.Table {
	if g.learned == nil {
		return nil
	}
	return g.learned.table
}

// learnedOutput is a reservation's learned output estimate.
type learnedOutput struct {
	key      learned.Key
	on       bool // the request's output is learned at settlement
	quantile float64
	est      learned.Estimate
	applied  bool // the output reserved is est.Tokens
	// full is the request's estimate at its whole output limit, which an
	// expiry charges when applied: nobody reported the answer.
	full costmodel.Estimate
	// exposed is what the reservation leaves unreserved, held in x until
	// the reservation ends.
	x                    atomic.Pointer[exposure]
	exposedUSD, exposedT int64
}

// LearnedKey is the key a request's output is learned under (see
// learned.KeyOf), and whether it is learned at all.
func LearnedKey(c *Caller, route string, req *Request) (learned.Key, bool) {
	return learned.KeyOf(c.Tenant, route, c.st.est.Canonical(req.Estimate.Model), &req.Estimate)
}

// learnedConfig is the learned estimates' configuration in cfg, without
// their store.
func learnedConfig(cfg *config.Config, logf func(format string, args ...any)) learned.Config {
	lc := cfg.Costs.Learned
	return learned.Config{MinSamples: lc.MinSamples, MaxKeys: lc.MaxKeys, MaxKeysPerTenant: lc.MaxKeysPerTenant, Interval: lc.Interval, Logf: logf}
}

// OpenLearned opens the learned output estimates that a server running
// cfg keeps (in cfg's Redis, or in its data directory), for a command
// that reads them beside it; its Close writes nothing a reader did not
// change.
func OpenLearned(ctx context.Context, cfg *config.Config, logf func(format string, args ...any)) (*learned.Table, func() error, error) {
	c := learnedConfig(cfg, logf)
	closeAll := func() error { return nil }
	if cfg.Store.Redis != "" {
		rc, err := redisClient(cfg.Store.Redis)
		if err != nil {
			return nil, nil, fmt.Errorf("store.redis: %w", config.RedactErr(err))
		}
		c.Redis, closeAll = rc, rc.Close
	} else {
		c.File = filepath.Join(cfg.DataDirPath(), "learned.json")
	}
	t, err := learned.Open(ctx, c)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return t, func() error { return errors.Join(t.Close(), closeAll()) }, nil
}

// learn reserves the learned quantile of the request's output when
// output_reserve is one and its key has observations enough; otherwise
// the estimate stays what the configured rule gave.
func (r *Reservation) learn() {
	l := r.g.learned
	if l == nil || r.req.Check || r.req.ExtraOnly {
		return
	}
	key, ok := LearnedKey(r.req.Caller, r.req.Route, &r.req)
	if !ok {
		return
	}
	r.learnt = &learnedOutput{key: key, on: true}
	q := r.st.cfg.Costs.OutputReserve.Quantile
	if q == 0 {
		return // learned, not reserved
	}
	r.learnt.quantile = q
	r.learnt.est = l.table.Estimate(key, q)
	if !r.learnt.est.OK {
		l.reservations.Add(r.ctx, 1, basisFallback)
		return
	}
	full := r.req.Estimate
	est := r.st.est.WithOutput(full, r.learnt.est.Tokens)
	usd, tokens := int64(full.Cost-est.Cost), full.Usage.OutputTokens-est.Usage.OutputTokens
	v, _ := l.exposure.Load(r.req.Caller.Tenant)
	if v == nil {
		v, _ = l.exposure.LoadOrStore(r.req.Caller.Tenant, &exposure{})
	}
	x := v.(*exposure)
	if !x.take(usd, tokens, l.maxUSD, l.maxTokens) {
		l.exposed.Add(r.ctx, 1)
		l.reservations.Add(r.ctx, 1, basisFallback)
		return
	}
	r.learnt.exposedUSD, r.learnt.exposedT = usd, tokens
	r.learnt.full = full
	r.learnt.x.Store(x)
	r.req.Estimate = est
	r.learnt.applied = true
	l.reservations.Add(r.ctx, 1, basisLearned)
}

// unexpose gives back what the reservation left unreserved, once: its
// answer is settled, or it is cancelled or refused.
// It is safe to call from any goroutine: a held reservation that another
// replica ended is given back by the one that learns it.
func (r *Reservation) unexpose() {
	if r.learnt == nil {
		return
	}
	if x := r.learnt.x.Swap(nil); x != nil {
		x.give(r.learnt.exposedUSD, r.learnt.exposedT)
	}
}

// observe learns the output of a settled request, and counts an answer
// that produced more than its learned reservation. An answer that failed,
// never reached the upstream, or a held reservation that expired (charged
// its estimate, not an output) teaches nothing.
func (r *Reservation) observe(c Charge) {
	if r.learnt == nil || !r.learnt.on || (c.Status != "" && c.Status != ledger.StatusSettled) || c.Unreached || c.HTTPStatus >= 400 {
		return // failed, expired at its estimate, or never reached the upstream
	}
	out := c.Usage.OutputTokens
	r.g.learned.table.Observe(r.learnt.key, out)
	if reserved := r.req.Estimate.Usage.OutputTokens; r.learnt.applied && out > reserved {
		r.g.learned.overruns.Add(r.ctx, 1)
		r.g.learned.overrunTokens.Add(r.ctx, out-reserved)
	}
}

// estimateInput adds the learned estimate to the policies' input.
func (r *Reservation) estimateInput(e *policies.Estimate) {
	e.OutputBasis = "limit"
	if r.learnt == nil {
		return
	}
	if r.learnt.quantile > 0 {
		e.OutputQuantile = config.Reserve{Quantile: r.learnt.quantile}.String()
		e.OutputSamples = int64(min(r.learnt.est.Samples, 1<<62))
	}
	if r.learnt.applied {
		e.OutputBasis = "learned"
	}
}
