package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/simulator"
	"github.com/costgate/costgate/weighted"
)

// Server is a running costgate: its stores, its policies and its two HTTP
// handlers. Open starts it; Close stops what Open started, also after a
// partial start. A Server is safe for concurrent use.
type Server struct {
	cfg    *Config
	log    *slog.Logger
	est    *costmodel.Estimator
	store  weighted.Store
	ledger *ledger.Ledger
	policy *policies.Engine // nil when no policy is configured

	keys      map[[sha256.Size]byte]*caller
	limits    []*compiledLimit
	upstreams map[string]*upstream
	routes    map[string]*upstream // by API path
	models    []string             // priced models, sorted, for GET /v1/models

	data  http.Handler
	admin http.Handler

	closers []func() error
	wg      sync.WaitGroup
}

// caller is who a key belongs to.
type caller struct {
	tenant string
	user   string
	keyID  string
	plan   string
}

// Open builds a Server from cfg: it connects the limiter store and the
// ledger, compiles the policies and starts in-process simulators for the
// upstreams that use them. Pass a nil logger to log nowhere.
func Open(ctx context.Context, cfg *Config, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, upstreams: map[string]*upstream{}, routes: map[string]*upstream{}}
	if err := s.open(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) open(ctx context.Context) (err error) {
	cfg := s.cfg

	if s.est, err = costmodel.NewEstimator(cfg.costmodel()); err != nil {
		return fmt.Errorf("proxy: cost model: %w", err)
	}
	if s.store, err = s.openStore(ctx); err != nil {
		return err
	}
	dir := cfg.DataDir
	if cfg.dir != "" && !filepath.IsAbs(dir) {
		dir = filepath.Join(cfg.dir, dir)
	}
	if s.ledger, err = ledger.Open(ctx, ledger.Config{DSN: cfg.Ledger.DSN, Dir: dir}); err != nil {
		return fmt.Errorf("proxy: ledger: %w", err)
	}
	s.closers = append(s.closers, s.ledger.Close)
	if err = s.loadPolicies(); err != nil {
		return err
	}
	if err = s.compile(); err != nil {
		return err
	}
	s.data = s.dataHandler()
	s.admin = s.adminHandler()
	return nil
}

func (s *Server) openStore(ctx context.Context) (weighted.Store, error) {
	if s.cfg.Store.Redis == "" {
		return weighted.NewMemory(weighted.MemoryConfig{}), nil
	}
	opt, err := redis.ParseURL(s.cfg.Store.Redis)
	if err != nil {
		return nil, fmt.Errorf("proxy: store.redis: %w", err)
	}
	c := redis.NewClient(opt)
	s.closers = append(s.closers, c.Close)
	if err := c.Ping(ctx).Err(); err != nil {
		// Redis may come back; fail-open limits serve meanwhile. Say so.
		s.log.Warn("limiter store unreachable at start", "err", err)
	}
	return weighted.NewRedis(c, weighted.RedisConfig{}), nil
}

func (s *Server) loadPolicies() error {
	fsys := s.cfg.policyFS
	if fsys == nil && s.cfg.Policies.Dir != "" {
		dir := s.cfg.Policies.Dir
		if s.cfg.dir != "" && !filepath.IsAbs(dir) {
			dir = filepath.Join(s.cfg.dir, dir)
		}
		fsys = os.DirFS(dir)
	}
	if fsys == nil {
		return nil
	}
	e, err := policies.NewEngine(fsys)
	if err != nil {
		return fmt.Errorf("proxy: policies: %w", err)
	}
	s.policy = e
	return nil
}

// compile turns the config's tenants, limits, budgets, upstreams and routes
// into the lookup structures the request path uses.
func (s *Server) compile() error {
	cfg := s.cfg
	s.keys = make(map[[sha256.Size]byte]*caller)
	for _, t := range cfg.Tenants {
		for _, k := range t.Keys {
			h := sha256.Sum256([]byte(k.secret()))
			id := k.ID
			if id == "" {
				id = "key-" + hex.EncodeToString(h[:4])
			}
			s.keys[h] = &caller{tenant: t.Name, user: k.User, keyID: id, plan: t.Plan}
		}
	}
	for _, l := range cfg.Limits {
		cl, err := compileLimit(l)
		if err != nil {
			return fmt.Errorf("proxy: limit %s: %w", l.Name, err)
		}
		s.limits = append(s.limits, cl)
	}
	for _, b := range cfg.Budgets {
		s.limits = append(s.limits, compileBudget(b))
	}
	for _, u := range cfg.Upstreams {
		up, err := s.newUpstream(u)
		if err != nil {
			return err
		}
		s.upstreams[u.Name] = up
	}
	for m := range costmodel.BuiltinPrices() {
		s.models = append(s.models, m)
	}
	for m := range cfg.Costs.Prices {
		if !slices.Contains(s.models, m) {
			s.models = append(s.models, m)
		}
	}
	slices.Sort(s.models)
	for path := range routeKinds {
		i := slices.IndexFunc(cfg.Routes, func(r RouteConfig) bool { return r.Path == path })
		if i >= 0 {
			s.routes[path] = s.upstreams[cfg.Routes[i].Upstream]
			continue
		}
		want := upstreamKindFor(path)
		for _, u := range cfg.Upstreams {
			if u.Kind == want {
				s.routes[path] = s.upstreams[u.Name]
				break
			}
		}
	}
	return nil
}

// startSimulator serves the built-in simulator on a loopback port owned by
// the server and returns its base URL.
func (s *Server) startSimulator() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("proxy: simulator: %w", err)
	}
	srv := &http.Server{Handler: simulator.New(simulator.Config{Estimator: s.est})}
	s.wg.Go(func() { _ = srv.Serve(ln) })
	s.closers = append(s.closers, srv.Close)
	return "http://" + ln.Addr().String(), nil
}

// Handler is the data plane: the API routes clients call.
func (s *Server) Handler() http.Handler { return s.data }

// AdminHandler is the admin plane: health, readiness and operator routes.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// Ledger is the server's ledger, for operator commands and tests.
func (s *Server) Ledger() *ledger.Ledger { return s.ledger }

// Close stops everything Open started, in reverse order, and waits for
// the server's goroutines. It flushes the ledger.
func (s *Server) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	s.closers = nil
	s.wg.Wait()
	return errors.Join(errs...)
}

func init() {
	// gin's debug mode prints every route at start and warns; costgate
	// logs for itself.
	gin.SetMode(gin.ReleaseMode)
}

func (s *Server) dataHandler() http.Handler {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	for path, kind := range routeKinds {
		r.POST(path, s.serveLLM(path, kind))
	}
	r.GET("/v1/models", s.serveModels)
	r.NoRoute(func(c *gin.Context) {
		writeError(c.Writer, c.Request.URL.Path, http.StatusNotFound, apiError{
			Type: "invalid_request_error", Code: "unknown_route",
			Message: "costgate does not serve " + c.Request.Method + " " + c.Request.URL.Path,
		})
	})
	return r
}

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ready\n"))
	})
	return mux
}

func (c *Config) costmodel() costmodel.Config {
	cc := costmodel.Config{FreeUnknown: c.Costs.FreeUnknown, OutputReserve: c.Costs.OutputReserve}
	conv := func(p PriceConfig) costmodel.Price {
		return costmodel.Price{
			Input: costmodel.NanoUSD(p.Input), CachedInput: costmodel.NanoUSD(p.CachedInput),
			CacheWrite: costmodel.NanoUSD(p.CacheWrite), Output: costmodel.NanoUSD(p.Output),
			MaxOutputTokens: p.MaxOutputTokens,
		}
	}
	if len(c.Costs.Prices) > 0 {
		cc.Prices = make(map[string]costmodel.Price, len(c.Costs.Prices))
		for m, p := range c.Costs.Prices {
			cc.Prices[m] = conv(p)
		}
	}
	if c.Costs.DefaultPrice != nil {
		cc.DefaultPrice = conv(*c.Costs.DefaultPrice)
	}
	return cc
}

// Describe says in a few lines what the server runs on: its store, its
// ledger, and where each upstream's requests go.
func (s *Server) Describe() []string {
	store := "limiter store: in-memory (single node)"
	if s.cfg.Store.Redis != "" {
		store = "limiter store: Redis"
	}
	led := "ledger: embedded, under " + s.cfg.DataDir
	if s.cfg.Ledger.DSN != "" {
		led = "ledger: PostgreSQL"
	}
	lines := []string{store, led}
	for _, u := range s.cfg.Upstreams {
		where := u.BaseURL
		if u.simulated() {
			where = "the built-in simulator at " + s.upstreams[u.Name].target.String()
			if u.Simulate == "auto" && u.APIKeyEnv != "" {
				where += " (" + u.APIKeyEnv + " is unset)"
			}
		}
		lines = append(lines, fmt.Sprintf("upstream %s (%s): %s", u.Name, u.Kind, where))
	}
	return lines
}
