package gate

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/replay"
	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// Gate is the decision pipeline on the active configuration: the limiter
// store (Redis behind a circuit breaker, or memory), its local fallback,
// the ledger, the policies and the cost model. Open starts it; Close stops
// what Open started, also after a partial start. A Gate is safe for
// concurrent use.
type Gate struct {
	log   *slog.Logger
	tel   *telemetry.Telemetry
	store *freshStore // the limiter store (Redis behind a breaker, or memory)
	// failClosedExtras holds the names of the fail-closed extra limits
	// requests have named (see descCounters): limit name → true.
	failClosedExtras sync.Map
	fallback         atomic.Pointer[fallback] // the local fallback budgets while the store is out
	breaker          *breaker                 // nil for the in-memory store
	ledger           *ledger.Ledger
	ping             func(context.Context) error // checks the limiter store; nil for memory
	redis            redis.UniversalClient       // the limiter store's Redis; nil for memory
	// markerMatch is the SCAN pattern of the store's generation markers
	// (see checkBoot); "" for memory.
	markerMatch string
	renewer     *renewer         // renews the concurrency leases of reservations held
	leases      *weighted.Leased // leased limits' leases; nil for memory
	regions     *Regions         // this region's caps of global budgets; nil without regions
	refusals    Refusals         // refusals by limit, for the dashboard
	secret      []byte           // signs held reservations' ids (see Hold)
	macs        sync.Pool        // of hash.Hash, HMAC-SHA256 keyed with secret (see sign)
	holds       holds            // the reservations this replica holds
	// replayed tells that a flush of the ledger succeeded since Open, so
	// that its store holds what the spool kept of the previous run (see
	// ledgerEntry).
	replayed atomic.Bool
	capture  *replay.Writer // records the policies' inputs; nil when capture is off
	learned  *learning      // the learned output estimates; nil unless output_reserve is a quantile
	dir      directory      // the control plane's keys and budget observer
	objects  objects        // upstream objects' tenants, when the store is memory (see OwnObject)
	keys     *keyCap        // the counters of values each tenant chose (store.max_keys_per_tenant)
	// objTimeout bounds a limiter call as the guard does (the store's
	// queue and call timeouts), and a record's Redis call (objectCall).
	objTimeout time.Duration
	// expireEvery is the expiry pass's period; see Options.
	expireEvery time.Duration

	// behind holds the tenants (hash tags) whose counters in the store lag
	// the ledger: charged on the fallback, or a settlement the store
	// failed; behindN counts them, and those being caught up. The store's
	// next call on one catches it up first (see freshStore.catchUp), and
	// a call on one being caught up (in catching) waits for it.
	behind   sync.Map
	behindN  atomic.Int64
	catching sync.Map
	// planMoved holds the tenants whose plan the control plane changed
	// (MarkPlanMoved), each with restores as it was then; planMovedN
	// counts them. restores counts the restores ReconcileTenant started.
	planMoved  sync.Map
	planMovedN atomic.Int64
	restores   atomic.Uint64
	// pending are the settlements the store failed, by tenant (hash tag),
	// made again (each idempotent by its id) before the store's next call
	// on the tenant; at most maxPending. nil until the first.
	pendingMu sync.Mutex
	pending   *queues[pendingSettle]

	promoMu   sync.Mutex        // orders promotions with Apply
	promotion map[string]string // promoted policy id -> source SHA-256; see SetPromotions

	// state is the active configuration, compiled; Apply swaps it whole,
	// and a request keeps the state its caller was identified under.
	state atomic.Pointer[state]

	settles sync.WaitGroup // settlements under way; Close waits for them
	closers []func() error
	wg      sync.WaitGroup
}

// Options are a Gate's optional collaborators.
type Options struct {
	// Logger receives the structured logs; nil logs nowhere.
	Logger *slog.Logger
	// Telemetry records metrics and traces; nil makes one with defaults.
	Telemetry *telemetry.Telemetry

	// expireEvery is how often the expiry pass (expireLoop: held
	// reservations, then the key cap's counters) runs: every second when
	// zero, never when negative (tests that order the pass against other
	// events run expireHolds themselves).
	expireEvery time.Duration
}

// state is one configuration, compiled for the request path. It is
// immutable once built.
type state struct {
	cfg      *config.Config
	est      *costmodel.Estimator
	policy   *policies.Set                // nil when no policy is configured; as its files declare
	promoted atomic.Pointer[policies.Set] // policy with the promotions applied; nil for none
	keys     map[[sha256.Size]byte]*Caller
	tenants  map[string]string // tenant -> plan
	// plans are the configuration's plans when it applies limits or
	// budgets by plan (config.Config.Plans), nil when it does not: a
	// control-plane tenant on another plan would get none of them.
	plans     map[string]bool
	limits    []*compiledLimit
	prefilter *prefilter // request-count limits known to be spent
	keyDims   keyDims    // the address and attributes limits are keyed by, which entries record

	// moved tells that a reload to this state gave budgets counters that
	// have not counted their period (see budgetsMoved): a tenant's request
	// restores the tenant's counters from the ledger before its first
	// debit, unless restored holds the tenant or allRestored is set.
	moved       bool
	restored    sync.Map // tenant -> struct{}
	allRestored atomic.Bool

	// counts counts the reservations decided on this state's counters
	// whose ledger entries are not written yet (see Reservation.track),
	// shared with the states it replaced without moving budgets. moveGen
	// is how many reloads that moved budgets made it: a state older than
	// the active one's moveGen was replaced by one that did, and a request
	// identified on it is decided on the active one, while the restore of
	// the new counters waits for counts to drain, so that the ledger it
	// reads holds what was spent on the old ones (see Gate.drain). prev is
	// the state this one moved budgets from, until it drained; drainBy is
	// when the restores stop waiting (Unix nanoseconds).
	counts  *inflight
	moveGen uint64
	drainBy atomic.Int64
	prev    atomic.Pointer[state]
}

// Caller is who a request comes from: a tenant, one of its users and the
// key it used, and the tenant's plan. A Caller also holds the
// configuration it was identified under, which the rest of its request
// uses. Callers come from Identify and Trusted; they are immutable.
type Caller struct {
	Tenant string
	User   string
	KeyID  string
	Plan   string
	// Team is the control-plane team the key belongs to; empty for none.
	Team string

	levels [4]*Level // the control plane's levels (see Directory)
	st     *state
	// trusted says that a front door named the caller (Trusted): its user
	// and key are the front door's word, any string, not the
	// configuration's (see keyCap).
	trusted bool
	// controlPlan says that Plan is the control plane's word (its
	// tenant's plan), which the configuration may not know (see
	// planRefusal).
	controlPlan bool
}

// Estimator is the cost model of the caller's configuration.
func (c *Caller) Estimator() *costmodel.Estimator { return c.st.est }

// Config is the configuration the caller was identified under. It must not
// be modified.
func (c *Caller) Config() *config.Config { return c.st.cfg }

// Open builds a Gate from cfg: it connects the limiter store and the
// ledger, compiles the configuration and the policies, and brings the
// budgets' counters up to the ledger.
func Open(ctx context.Context, cfg *config.Config, opts Options) (*Gate, error) {
	g := &Gate{log: opts.Logger, tel: opts.Telemetry, keys: newKeyCap(), expireEvery: opts.expireEvery}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if err := g.open(ctx, cfg); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

func (g *Gate) open(ctx context.Context, cfg *config.Config) error {
	if g.tel == nil {
		tel, err := telemetry.New(ctx, telemetry.Config{})
		if err != nil {
			return fmt.Errorf("gate: telemetry: %w", err)
		}
		g.tel = tel
		g.closers = append(g.closers, func() error { return tel.Shutdown(context.Background()) })
	}
	store, err := g.openStore(ctx, cfg)
	if err != nil {
		return err
	}
	g.store = store
	g.fallback.Store(&fallback{freshStore: g.fresh(weighted.NewMemory(weighted.MemoryConfig{Generations: true}), cfg.Store.FallbackReplicas)})
	// Closed before the stores, which closed earlier in open.
	g.renewer = newRenewer(g)
	g.renewer.start()
	g.closers = append(g.closers, g.renewer.close)
	if g.ledger, err = ledger.Open(ctx, ledger.Config{DSN: cfg.Ledger.DSN, Dir: cfg.DataDirPath(), PeerWait: cfg.Ledger.PeerWait,
		CloseTimeout: cmp.Or(cfg.Ledger.CloseTimeout, defaultCloseTimeout),
		OnPeerSync:   g.peerRestored, Logf: ledgerLogf(g.log)}); err != nil {
		return fmt.Errorf("gate: ledger: %w", err)
	}
	g.closers = append(g.closers, g.ledger.Close)
	if c := cfg.Capture; c.Enabled {
		// Started at Open and kept across Apply: changing it needs a restart.
		if g.capture, err = replay.Open(replay.WriterConfig{Dir: cfg.CaptureDir(), Sample: c.Sample,
			MaxBytes: c.MaxBytes, MaxFiles: c.MaxFiles, Logf: func(format string, args ...any) {
				g.log.Warn(fmt.Sprintf(format, args...), "component", "capture")
			}}); err != nil {
			return fmt.Errorf("gate: capture: %w", err)
		}
		g.closers = append(g.closers, func() error {
			err := g.capture.Close()
			if written, dropped := g.capture.Stats(); dropped > 0 {
				g.log.Warn("capture dropped records: its queue was full", "written", written, "dropped", dropped)
			}
			return err
		})
	}
	st, err := compile(cfg)
	if err != nil {
		return err
	}
	g.state.Store(st)
	if err := g.openLearned(ctx, cfg); err != nil {
		return fmt.Errorf("gate: learned estimates: %w", err)
	}
	if g.secret, err = reservationSecret(cfg); err != nil {
		return err
	}
	g.holds.m = map[string]*hold{}
	g.tel.ObserveLedger(func() (float64, int64) {
		st := g.ledger.Stats()
		return st.Lag.Seconds(), st.Pending
	})
	g.closers = append(g.closers, func() error { g.tel.ObserveLedger(nil); return nil })

	if err := g.openRegions(ctx, cfg); err != nil {
		return err
	}
	// Budgets start from the ledger: a restart (or a Redis that lost its
	// data) must not give every tenant a fresh budget.
	start, cancelStart := context.WithTimeout(ctx, 10*time.Second)
	if err := g.ReconcileBudgets(start); err != nil {
		g.log.Warn("budget reconciliation at start failed; it is retried", "err", err)
	}
	cancelStart()
	rctx, cancel := context.WithCancel(context.Background())
	g.closers = append(g.closers, func() error { cancel(); return nil })
	g.wg.Go(func() { g.reconcileLoop(rctx, cfg.Store.ReconcileInterval) })
	if every := cmp.Or(g.expireEvery, time.Second); every > 0 {
		g.wg.Go(func() { g.expireLoop(rctx, every) })
	}
	if g.redis != nil {
		g.wg.Go(func() { g.bootLoop(rctx) })
	}
	if g.breaker != nil {
		// Every breaker cooldown (a probe's pace), at least every 10 ms.
		g.wg.Go(func() { g.catchUpLoop(rctx, max(cfg.Store.BreakerCooldown, 10*time.Millisecond)) })
	}
	return nil
}

// defaultCloseTimeout is the ledger's close timeout when the
// configuration sets none: 0 leaves the ledger's own default (10 s). The
// package's tests shorten it (export_test.go): a gate they close with its
// database down or held waits that long.
var defaultCloseTimeout time.Duration

func (g *Gate) openStore(ctx context.Context, cfg *config.Config) (*freshStore, error) {
	if cfg.Store.Redis == "" {
		return g.fresh(weighted.NewMemory(weighted.MemoryConfig{Generations: true}), 1), nil
	}
	c, err := redisClient(cfg.Store.Redis)
	if err != nil {
		return nil, fmt.Errorf("gate: store.redis: %w", config.RedactErr(err))
	}
	// go-redis prints every failed dial to stderr; during an outage that
	// is thousands of lines. The breaker's state and the metrics say it.
	redis.SetLogger(redisLog{g.log})
	g.closers = append(g.closers, c.Close)
	g.redis = c
	g.ping = func(ctx context.Context) error { return c.Ping(ctx).Err() }
	if err := c.Ping(ctx).Err(); err != nil {
		// Redis may come back; the limits' failure posture applies meanwhile.
		g.log.Warn("limiter store unreachable at start", "err", err)
	} else {
		g.checkEviction(ctx, c)
	}
	g.breaker = newBreaker(cfg.Store.BreakerFailures, cfg.Store.BreakerCooldown, time.Now)
	g.tel.ObserveBreaker(g.breaker.State)
	r := weighted.NewRedis(c, weighted.RedisConfig{
		MaxBatch: cfg.Store.MaxBatch, Generations: true,
		QueueTimeout: cfg.Store.QueueTimeout, CallTimeout: cfg.Store.Timeout,
		ReplyTimeout: max(weighted.DefaultReplyTimeout, cfg.Store.Timeout), ContextDeadlines: true,
	})
	g.markerMatch = r.MarkerMatch()
	if g.ping(ctx) == nil {
		// Before any decision: a Redis rolled back since (see checkBoot).
		if err := g.checkBoot(ctx); err != nil {
			g.log.Warn("the limiter store's run_id could not be checked at start", "err", err)
		}
	}
	g.tel.ObserveStore(func() telemetry.StoreStats {
		st := r.Stats()
		return telemetry.StoreStats{Overloaded: st.Overloaded, UnknownOutcomes: st.UnknownOutcomes, LateCancels: st.LateCancels, LateLost: st.LateLost}
	})
	// The guard's own bound backs up the store's two (the queue and the
	// call) without cutting them short.
	g.objTimeout = cfg.Store.QueueTimeout + cfg.Store.Timeout + 50*time.Millisecond
	gs := &guardedStore{store: r, restorer: r, breaker: g.breaker, timeout: g.objTimeout, bounded: true, tel: g.tel}
	return g.fresh(g.leased(gs), 1), nil
}

// checkEviction warns when Redis may evict keys (a memory limit with an
// eviction policy, as managed Redis services set by default): a counter
// evicted while its tenant's generation marker stays is an unnoticed data
// loss, and its tenant is admitted again what it had spent of its limits.
// The generation markers see a restart, a flush or a failover, not an
// eviction. A Redis that refuses CONFIG is logged and trusted.
func (g *Gate) checkEviction(ctx context.Context, c redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		g.log.Info("cannot read the limiter store's eviction policy (CONFIG GET); make sure it is noeviction", "err", err)
		return
	}
	if policy := cfg["maxmemory-policy"]; cfg["maxmemory"] != "0" && policy != "" && policy != "noeviction" {
		g.log.Warn("the limiter store may evict keys: a counter evicted is forgotten, and its tenant is admitted again what it spent; set maxmemory-policy noeviction (Redis then refuses writes when full, which the limits' failure posture handles)",
			"maxmemory", cfg["maxmemory"], "maxmemory-policy", policy)
	}
}

// redisClient connects to one Redis (redis:// or rediss://) or to a Redis
// Cluster: redis+cluster://host:port[,host:port...] or a comma list of
// redis:// URLs naming some of its nodes (credentials and TLS from the
// first).
//
// A limiter call is sent once: weighted sends its scripts as commands that
// go-redis must not resend whatever MaxRetries or MaxRedirects say (a
// resent debit whose reply was lost would count twice), and the client's
// other commands are not resent either unless the URL's max_retries says
// so. A failed call is a store failure, which the limits' posture and the
// breaker handle. A Cluster client still follows MOVED and ASK, which are
// answered before a script runs. The client speaks
// RESP2 unless the URL says protocol=3: costgate uses no RESP3 push
// notification, and their handling costs every call.
func redisClient(u string) (redis.UniversalClient, error) {
	rest, cluster := strings.CutPrefix(u, "redis+cluster://")
	if !cluster && !strings.Contains(u, ",") {
		opt, err := redis.ParseURL(u)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(u, "max_retries=") {
			opt.MaxRetries = -1
		}
		if !strings.Contains(u, "protocol=") {
			opt.Protocol = 2 // RESP3's push notifications are not used: their checks cost every call
		}
		opt.ContextTimeoutEnabled = true // a call ends at its context's deadline (see weighted.RedisConfig.ContextDeadlines)
		return redis.NewClient(opt), nil
	}
	if cluster {
		u = "redis://" + rest
	}
	parts := strings.Split(u, ",")
	first, err := redis.ParseURL(strings.TrimSpace(parts[0]))
	if err != nil {
		return nil, err
	}
	opt := &redis.ClusterOptions{
		Addrs: []string{first.Addr}, Username: first.Username, Password: first.Password,
		TLSConfig: first.TLSConfig, MaxRedirects: 16, MaxRetries: -1, Protocol: 2, ContextTimeoutEnabled: true,
	}
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "://") {
			p = "redis://" + p
		}
		o, err := redis.ParseURL(p)
		if err != nil {
			return nil, err
		}
		opt.Addrs = append(opt.Addrs, o.Addr)
	}
	return redis.NewClusterClient(opt), nil
}

// compile turns a config into the lookup structures the pipeline uses.
func compile(cfg *config.Config) (*state, error) {
	st := &state{
		cfg:       cfg,
		keys:      make(map[[sha256.Size]byte]*Caller),
		tenants:   map[string]string{},
		prefilter: &prefilter{},
		counts:    &inflight{},
	}
	var err error
	if st.est, err = costmodel.NewEstimator(cfg.CostModel()); err != nil {
		return nil, fmt.Errorf("gate: cost model: %w", err)
	}
	if fsys := cfg.PolicyFS(); fsys != nil {
		if st.policy, err = policies.Load(fsys); err != nil {
			return nil, fmt.Errorf("gate: policies: %w", err)
		}
	}
	if known, scoped := cfg.Plans(); scoped {
		st.plans = make(map[string]bool, len(known))
		for _, p := range known {
			st.plans[p] = true
		}
	}
	for _, t := range cfg.Tenants {
		st.tenants[t.Name] = t.Plan
		for _, k := range t.Keys {
			st.keys[sha256.Sum256([]byte(k.Secret()))] = &Caller{Tenant: t.Name, User: k.User, KeyID: k.KeyID(), Plan: t.Plan, st: st}
		}
	}
	for _, l := range cfg.Limits {
		cl, err := compileLimit(l)
		if err != nil {
			return nil, fmt.Errorf("gate: limit %s: %w", l.Name, err)
		}
		st.limits = append(st.limits, cl)
	}
	for _, b := range cfg.Budgets {
		st.limits = append(st.limits, compileBudget(b))
	}
	st.keyDims = keyDimsOf(st.limits)
	return st, nil
}

// Apply makes cfg the active configuration once it compiles (its policies
// included). The stores cannot change without a restart: a cfg that
// changes store.redis, ledger.dsn, ledger.peer_wait or data_dir is
// refused, and the active configuration stays.
func (g *Gate) Apply(cfg *config.Config) error {
	prev := g.state.Load()
	old := prev.cfg
	switch {
	case cfg.Store.Redis != old.Store.Redis:
		return errors.New("store.redis changed: restart costgate to change the limiter store")
	case cfg.Ledger.DSN != old.Ledger.DSN || cfg.DataDirPath() != old.DataDirPath():
		return errors.New("ledger.dsn or data_dir changed: restart costgate to change the ledger")
	case cfg.Ledger.PeerWait != old.Ledger.PeerWait || cfg.Ledger.CloseTimeout != old.Ledger.CloseTimeout:
		return errors.New("ledger.peer_wait or ledger.close_timeout changed: restart costgate to change them")
	case cfg.Costs.OutputReserve.Quantile > 0 && g.learned == nil:
		return errors.New("costs.output_reserve: a learned quantile needs a restart when costgate started with a percentage")
	case cfg.Reservations.SigningSecret() != old.Reservations.SigningSecret():
		return errors.New("reservations.secret changed: restart costgate to change the key that signs reservation ids")
	}
	if dp := g.dir.dir.Load(); dp != nil {
		if td, ok := (*dp).(TenantDirectory); ok {
			if err := TenantClash(cfg, td); err != nil {
				return err
			}
		}
		if pl, ok := (*dp).(PlanLister); ok {
			if err := PlanClash(cfg, pl); err != nil {
				return err
			}
		}
	}
	st, err := compile(cfg)
	if err != nil {
		return err
	}
	// A change that moves no budget after one whose restore has not run
	// for every tenant (the ledger's database or Redis out) leaves the
	// same new counters unrestored: st restores them as prev would have.
	st.moved = budgetsMoved(old, cfg)
	if !st.moved && prev.moved && !prev.allRestored.Load() {
		st.moved = true
		prev.restored.Range(func(t, v any) bool { st.restored.Store(t, v); return true })
	}
	if st.moved {
		st.moveGen = prev.moveGen + 1
		st.prev.Store(prev)
		st.drainBy.Store(time.Now().Add(drainWait).UnixNano())
	} else {
		st.moveGen, st.counts = prev.moveGen, prev.counts
	}
	g.promoMu.Lock()
	g.promote(st)
	g.state.Store(st)
	g.promoMu.Unlock()
	if st.moved {
		// A budget renamed, made monthly, given another scope or plans, or
		// a tenant given another plan, has counters that have not counted
		// their period: bring them up to the ledger's spend now, not at the
		// next reconciliation. Until a tenant's are, its requests restore
		// them before they debit (see Reservation.restoreCounters).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := g.ReconcileBudgets(ctx); err != nil {
			g.log.Warn("budget reconciliation after a reload failed; it is retried", "err", err)
		}
		cancel()
	}
	return nil
}

// budgetsMoved tells whether going from old to cfg may give a budget a
// counter that has not counted its period.
func budgetsMoved(old, cfg *config.Config) bool {
	// A budget's counter is its name, scope and period, applied by plans;
	// its amount and lease change how much it admits, not what it counted.
	counters := func(bs []config.BudgetConfig) []config.BudgetConfig {
		out := make([]config.BudgetConfig, len(bs))
		for i, b := range bs {
			out[i] = config.BudgetConfig{Name: b.Name, Plans: b.Plans, Scope: b.Scope, Period: b.Period}
		}
		return out
	}
	if !reflect.DeepEqual(counters(old.Budgets), counters(cfg.Budgets)) || len(old.Tenants) != len(cfg.Tenants) {
		return true
	}
	for i, t := range cfg.Tenants {
		if t.Name != old.Tenants[i].Name || t.Plan != old.Tenants[i].Plan {
			return true
		}
	}
	return false
}

// MarkPlanMoved tells that the control plane moved tenant to another plan:
// the new plan's budgets have counters that have not counted the period,
// and the tenant's next request restores them from the ledger before it
// is decided (see Reservation.restoreCounters). Mark before the
// directory serves the new plan.
func (g *Gate) MarkPlanMoved(tenant string) {
	if _, had := g.planMoved.Swap(tenant, g.restores.Load()); !had {
		g.planMovedN.Add(1)
	}
}

// Config is the active configuration. It must not be modified.
func (g *Gate) Config() *config.Config { return g.state.Load().cfg }

// Estimator is the active configuration's cost model.
func (g *Gate) Estimator() *costmodel.Estimator { return g.state.Load().est }

// Ledger is the gate's ledger.
func (g *Gate) Ledger() *ledger.Ledger { return g.ledger }

// Telemetry is the gate's telemetry.
func (g *Gate) Telemetry() *telemetry.Telemetry { return g.tel }

// Refusals are the refusals recorded by limit, for the dashboard.
func (g *Gate) Refusals() *Refusals { return &g.refusals }

// Ready checks that the limiter store answers; an in-memory store always
// does.
func (g *Gate) Ready(ctx context.Context) error {
	if g.ping == nil {
		return nil
	}
	return g.ping(ctx)
}

// Identify returns the caller an API key belongs to under the active
// configuration, or nil for an empty or unknown key. It compares hashes,
// in constant time per lookup.
func (g *Gate) Identify(key string) *Caller {
	if key == "" {
		return nil
	}
	st := g.state.Load()
	sum := sha256.Sum256([]byte(key))
	if c := st.keys[sum]; c != nil {
		return c
	}
	return g.lookup(st, sum)
}

// Trusted returns a caller for a front door that authenticates its
// requests by other means than a costgate key (the RLS server trusts
// Envoy): tenant with the plan the configuration gives it, else the plan
// the control plane gives it (a tenant the control plane holds but has
// deactivated is refused, 403, as its keys identify nobody), else plan.
// user and keyID may be empty.
func (g *Gate) Trusted(tenant, user, keyID, plan string) *Caller {
	st := g.state.Load()
	c := &Caller{Tenant: tenant, User: user, KeyID: keyID, Plan: plan, st: st, trusted: true}
	if p, ok := st.tenants[tenant]; ok {
		c.Plan = p
	} else {
		g.controlTenant(c)
	}
	return c
}

// closeWait bounds how long Close waits for settlements.
const closeWait = 10 * time.Second

// Close stops everything Open started, in reverse order, after the
// settlements under way have finished; it flushes the ledger.
func (g *Gate) Close() error {
	done := make(chan struct{})
	go func() { g.settles.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeWait):
		g.log.Warn("settlements still running at close")
	}
	var errs []error
	for i := len(g.closers) - 1; i >= 0; i-- {
		if err := g.closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	g.closers = nil
	g.wg.Wait()
	return errors.Join(errs...)
}
