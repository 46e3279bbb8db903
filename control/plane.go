package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/dashboard"
	"github.com/costgate/costgate/gate"
)

// Plane is one replica's control plane: the store, the in-memory
// directory the gate identifies control-plane keys by, the poll that
// keeps the directory up to the database, and the budget alerts. Open
// starts it; Close stops it. It is safe for concurrent use.
type Plane struct {
	gate  *gate.Gate
	store *Store
	dir   *Directory
	log   *slog.Logger
	poll  time.Duration
	alert *alerter // nil when no alert URL is configured

	promos atomic.Pointer[[]Promotion] // the policy promotions, as of the last poll
	seen   map[string]string           // policy id -> promoted source seen loaded; the poll's

	snapVersion  int64        // the version of the last snapshot written or read; the poll's
	snapAt       time.Time    // when the poll last wrote one (or tried to)
	resnap       atomic.Bool  // the directory was replaced: the next poll writes the snapshot
	syncMu       sync.Mutex   // one sync at a time: the poll's, and a write's read of itself (Wait, Refresh)
	fromSnapshot atomic.Int64 // Unix nanoseconds the snapshot served was written; 0 once the database answered

	// The configuration and version warnUnknownPlans last looked at, and
	// the tenants it warned of, with their plan; the poll's.
	planCfg     *config.Config
	planVersion int64
	planWarned  map[string]string

	lastErr   error // the last poll's error, nil once one succeeds
	errMu     sync.Mutex
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	synced    chan struct{} // closed after the first successful load
	closeOnce sync.Once
}

// Options are the control plane's optional collaborators and knobs.
type Options struct {
	// Logger receives the structured logs; nil logs nowhere.
	Logger *slog.Logger
}

// Open opens the control plane of g's configuration (control, ledger.dsn,
// data_dir), loads the directory and starts the poll. A database that
// cannot be reached is no error: the data plane serves the configured keys
// meanwhile, the admin API answers 503, and the poll loads the directory
// once the database answers.
func Open(ctx context.Context, g *gate.Gate, opts Options) (*Plane, error) {
	cfg := g.Config()
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	st, err := OpenStore(octx, cfg.Ledger.DSN, cfg.DataDirPath())
	cancel()
	if err != nil {
		return nil, err
	}
	p := &Plane{gate: g, store: st, dir: NewDirectory(), log: log, poll: cfg.Control.Poll, synced: make(chan struct{}),
		seen: map[string]string{}, planWarned: map[string]string{}}
	if g != nil {
		p.dir.planMoved = g.MarkPlanMoved
	}
	if a := cfg.Control.Alerts; a.URL != "" {
		p.alert = newAlerter(p, a)
	}
	if err := p.sync(ctx); err != nil {
		log.Warn("control plane: database unavailable at start", "err", err)
		p.loadSnapshot()
	}
	// As a reload would be (gate.Apply), a config file that declares a
	// tenant created through the API is refused: the two would be one.
	if err := gate.TenantClash(cfg, p.dir); err != nil {
		st.Close()
		return nil, fmt.Errorf("control plane: %w", err)
	}
	g.SetDirectory(p.dir)
	rctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.wg.Go(func() { p.pollLoop(rctx) })
	if p.alert != nil {
		g.ObserveBudgets(p.alert.observe)
		p.alert.start(rctx, &p.wg)
	}
	return p, nil
}

// Close stops the poll and the alerts and closes the store.
func (p *Plane) Close() error {
	var err error
	p.closeOnce.Do(func() {
		p.gate.ObserveBudgets(nil)
		p.gate.SetDirectory(nil)
		p.cancel()
		p.wg.Wait()
		p.saveSnapshot(context.Background(), true)
		err = p.store.Close()
	})
	return err
}

// Directory is the replica's in-memory copy.
func (p *Plane) Directory() *Directory { return p.dir }

// Store is the control plane's store.
func (p *Plane) Store() *Store { return p.store }

// sync brings the directory up to the database.
func (p *Plane) sync(ctx context.Context) error {
	// One at a time: a sync that read an older version than another one
	// applied must not take the database for one behind the copy.
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ents, v, err := p.store.Changes(ctx, p.dir.Version())
	p.errMu.Lock()
	p.lastErr = err
	p.errMu.Unlock()
	if err != nil {
		return err
	}
	have := p.dir.Version()
	behind := v < have
	if !behind && have > 0 && p.dir.Head() != "" {
		// A database restored to an older version and written to since
		// can be back at this copy's version, or past it, with other
		// writes: the entity it holds at this copy's version tells.
		id, ok, err := p.store.EntityAt(ctx, have)
		if err != nil {
			p.errMu.Lock()
			p.lastErr = err
			p.errMu.Unlock()
			return err
		}
		behind = ok && id != p.dir.Head()
	}
	if behind {
		// The database is behind this copy: restored from a backup, or
		// another one. Changes made there after its version would carry
		// versions this copy has seen, and be missed (a key revoked there
		// would keep working here): the database's data replaces the copy.
		if err := p.reload(ctx, have); err != nil {
			p.errMu.Lock()
			p.lastErr = err
			p.errMu.Unlock()
			return err
		}
		ents, v = nil, p.dir.Version()
	}
	if v > p.dir.Version() {
		// Read before the directory advances, so that a failure reads
		// them again at the next poll.
		if err := p.loadPromotions(ctx); err != nil {
			p.errMu.Lock()
			p.lastErr = err
			p.errMu.Unlock()
			return err
		}
		for _, t := range p.dir.Apply(ents, v) {
			if err := p.gate.ReconcileTenant(ctx, t); err != nil {
				p.log.Warn("control plane: a budget's period changed; its counter is reconciled at the next interval", "tenant", t, "err", err)
			}
		}
	}
	p.dir.loadedAt.Store(time.Now().UnixNano())
	if p.fromSnapshot.Swap(0) != 0 {
		p.log.Info("control plane: database available; the snapshot is replaced by its data", "version", v)
	}
	select {
	case <-p.synced:
	default:
		close(p.synced)
	}
	return nil
}

// reload replaces the directory, at version have, with the database's
// whole data, which is behind it.
func (p *Plane) reload(ctx context.Context, have int64) error {
	ents, v, err := p.store.Changes(ctx, 0)
	if err != nil {
		return err
	}
	if err := p.loadPromotions(ctx); err != nil {
		return err
	}
	n := NewDirectory()
	n.Apply(ents, v)
	p.dir.replace(n)
	// The snapshot on disk is of the newer copy: the next poll writes the
	// database's.
	p.resnap.Store(true)
	p.log.Warn("control plane: the database is behind this replica's copy (restored from a backup, or another database); its data replaces the copy",
		"database_version", v, "copy_version", have, "entities", len(ents))
	return nil
}

// pollLoop polls the database for changes every poll interval. While it
// fails, the directory keeps its last copy.
func (p *Plane) pollLoop(ctx context.Context) {
	t := time.NewTicker(p.poll)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := p.sync(ctx)
		if err == nil {
			p.checkDrift(ctx)
			p.warnUnknownPlans()
			p.saveSnapshot(ctx, false)
		}
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			failing = true
			p.log.Warn("control plane: database unavailable; serving the last copy of the keys", "err", err)
		case err == nil && failing:
			failing = false
			p.log.Info("control plane: database available again")
		}
	}
}

// Health is the state of the replica's copy: the version it holds, when
// it last reached the database, and the last error (nil when the last
// poll succeeded).
func (p *Plane) Health() (version int64, loadedAt time.Time, err error) {
	p.errMu.Lock()
	err = p.lastErr
	p.errMu.Unlock()
	if n := p.dir.loadedAt.Load(); n > 0 {
		loadedAt = time.Unix(0, n)
	}
	return p.dir.Version(), loadedAt, err
}

// Wait waits until the directory holds version v (or ctx ends): a
// replica's read of its own write.
func (p *Plane) Wait(ctx context.Context, v int64) error {
	for p.dir.Version() < v {
		if err := p.sync(ctx); err != nil {
			return err
		}
		if p.dir.Version() >= v {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// Refresh loads the changes at once (after a write on this replica).
func (p *Plane) Refresh(ctx context.Context) {
	if err := p.sync(ctx); err != nil {
		p.log.Warn("control plane: refresh failed", "err", err)
	}
}

// fromConfig tells whether the config file declares tenant.
func (p *Plane) fromConfig(tenant string) bool {
	for _, t := range p.gate.Config().Tenants {
		if t.Name == tenant {
			return true
		}
	}
	return false
}

// configEntity is the config file's tenant named tenant, read-only; nil
// when the file does not declare it.
func (p *Plane) configEntity(tenant string) *Entity {
	for _, t := range p.gate.Config().Tenants {
		if t.Name == tenant {
			return &Entity{ID: t.Name, Kind: KindTenant, Tenant: t.Name, Name: t.Name, Plan: t.Plan,
				Budgets: []Budget{}, Limits: []Limit{}, Active: true, Source: "config"}
		}
	}
	return nil
}

// ConfigTenants are the tenants the config file declares, read-only.
func (p *Plane) ConfigTenants() []*Entity {
	var out []*Entity
	for _, t := range p.gate.Config().Tenants {
		out = append(out, p.configEntity(t.Name))
	}
	return out
}

// LevelState is one budget or limit of a level with its state.
type LevelState struct {
	Level     string `json:"level"`
	Entity    string `json:"entity"`
	Name      string `json:"name"`
	Budget    bool   `json:"budget"`
	Period    string `json:"period,omitempty"`
	Unit      string `json:"unit"`
	Capacity  int64  `json:"capacity"`
	Remaining int64  `json:"remaining"`
	// Used is the share of the capacity used, in percent.
	Used   float64 `json:"used_percent"`
	ResetS int64   `json:"reset_seconds"`
	// AmountUSD and SpentUSD are a budget's, as decimals.
	AmountUSD string `json:"amount_usd,omitempty"`
	SpentUSD  string `json:"spent_usd,omitempty"`
	// Closest marks the limit closest to refusing, among those shown.
	Closest bool `json:"closest,omitempty"`
}

// KeyLevels is the state of every level budget and limit a key falls
// under (key, user, team, tenant), with the one closest to refusing
// marked.
func (p *Plane) KeyLevels(ctx context.Context, e *Entity) ([]LevelState, error) {
	var (
		lls   []*gate.LevelLimit
		kinds []Kind
	)
	add := func(kind Kind, name string) {
		if lv := p.dir.Level(kind, e.Tenant, name); lv != nil {
			for _, ll := range lv.Limits {
				lls, kinds = append(lls, ll), append(kinds, kind)
			}
		}
	}
	add(KindKey, e.ID)
	if e.User != "" {
		add(KindUser, e.User)
	}
	if e.Team != "" {
		add(KindTeam, e.Team)
	}
	add(KindTenant, e.Tenant)
	return p.states(ctx, lls, kinds)
}

// EntityLevels is the state of one entity's own budgets and limits.
func (p *Plane) EntityLevels(ctx context.Context, e *Entity) ([]LevelState, error) {
	name := e.Name
	if e.Kind == KindKey {
		name = e.ID
	}
	lv := p.dir.Level(e.Kind, e.Tenant, name)
	if lv == nil {
		return []LevelState{}, nil
	}
	kinds := make([]Kind, len(lv.Limits))
	for i := range kinds {
		kinds[i] = e.Kind
	}
	return p.states(ctx, lv.Limits, kinds)
}

func (p *Plane) states(ctx context.Context, lls []*gate.LevelLimit, kinds []Kind) ([]LevelState, error) {
	out := []LevelState{}
	if len(lls) == 0 {
		return out, nil
	}
	sts, err := p.gate.PeekLevel(ctx, lls)
	if err != nil {
		return nil, fmt.Errorf("control: limiter store: %w", err)
	}
	closest, best := -1, -1.0
	for i, st := range sts {
		ls := LevelState{Level: string(kinds[i]), Entity: lls[i].Entity, Name: st.Name, Budget: st.Budget, Period: lls[i].Period,
			Unit: st.Unit, Capacity: st.Capacity, Remaining: st.Remaining, ResetS: int64(st.ResetAfter / time.Second)}
		if st.Capacity > 0 {
			ls.Used = float64(st.Capacity-st.Remaining) * 100 / float64(st.Capacity)
		}
		if st.Budget {
			ls.AmountUSD = nanoString(st.Capacity)
			ls.SpentUSD = nanoString(st.Capacity - st.Remaining)
		}
		if ls.Used > best {
			closest, best = i, ls.Used
		}
		out = append(out, ls)
	}
	if closest >= 0 {
		out[closest].Closest = true
	}
	return out, nil
}

// IsStoreDown tells whether err is the database's failure.
func IsStoreDown(err error) bool { return errors.Is(err, ErrStoreDown) }

// BudgetRows lists the budgets of up to limit teams and limit keys (in id
// order) with their spend in the current period, for the dashboard. A
// key's row carries its own budgets; the levels above it are the team's
// and tenant's rows, and the key's page (KeyLevels) puts them together.
func (p *Plane) BudgetRows(ctx context.Context, limit int) ([]dashboard.BudgetRow, error) {
	var (
		rows []dashboard.BudgetRow
		lls  []*gate.LevelLimit
	)
	for _, kind := range []Kind{KindTeam, KindKey} {
		es, err := p.store.List(ctx, Query{Kind: kind, Limit: limit})
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			name := e.Name
			if kind == KindKey {
				name = e.ID
				if e.RevokedAt != nil {
					continue
				}
			}
			lv := p.dir.Level(kind, e.Tenant, name)
			if lv == nil {
				continue
			}
			for _, ll := range lv.Limits {
				if !ll.Budget {
					continue
				}
				rows = append(rows, dashboard.BudgetRow{Kind: string(kind), ID: e.ID, Name: name, Tenant: e.Tenant, Team: e.Team,
					Budget: ll.ID, Limit: ll.Name(), Period: ll.Period})
				lls = append(lls, ll)
			}
		}
	}
	if len(lls) == 0 {
		return rows, nil
	}
	sts, err := p.gate.PeekLevel(ctx, lls)
	if err != nil {
		return nil, fmt.Errorf("control: limiter store: %w", err)
	}
	for i, st := range sts {
		rows[i].AmountNanoUSD, rows[i].SpentNanoUSD = st.Capacity, st.Capacity-st.Remaining
	}
	return rows, nil
}
