package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/costgate/costgate/admin"
	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/simulator"
	"github.com/costgate/costgate/telemetry"
)

// Server is a running costgate data plane and admin plane: the gate (the
// decision pipeline, its stores and its ledger), the upstreams, and the
// two HTTP handlers. Open starts it; Close stops what Open started, also
// after a partial start. A Server is safe for concurrent use.
type Server struct {
	log    *slog.Logger
	tel    *telemetry.Telemetry
	gate   *gate.Gate
	ledger *ledger.Ledger
	loader func() (*config.Config, error)

	// stopping ends when Close starts: upstream exchanges still running
	// then end (see upstreamContext).
	stopping context.Context
	stop     context.CancelFunc

	inflight atomic.Int64 // requests in the pipeline, settlement included
	delays   delays       // each tenant's requests in a friction delay

	// state is the proxy's part of the active configuration, compiled; a
	// reload swaps it whole, and a request keeps the state it started with.
	state    atomic.Pointer[state]
	reloadMu sync.Mutex

	simMu sync.Mutex
	sims  map[string]string // simulated upstream name -> base URL

	data  http.Handler
	admin http.Handler

	closers []func() error
	wg      sync.WaitGroup
}

// Options are a Server's optional collaborators.
type Options struct {
	// Logger receives the structured logs; nil logs nowhere.
	Logger *slog.Logger
	// Telemetry records metrics and traces; nil makes one with defaults.
	Telemetry *telemetry.Telemetry
	// Loader reads the configuration again for a reload (SIGHUP, a file
	// change, POST /admin/v1/reload). Nil means reloads re-apply the config
	// given to Open.
	Loader func() (*config.Config, error)
}

// state is the proxy's part of one configuration: its upstreams and
// routes. It is immutable once built.
type state struct {
	cfg       *config.Config
	upstreams map[string]*upstream
	routes    map[string]*upstream // by API path
	models    []string             // priced models, sorted, for GET /v1/models
}

// Open builds a Server from cfg: it opens the gate (the limiter store, the
// ledger, the policies), and starts in-process simulators for the
// upstreams that use them.
func Open(ctx context.Context, cfg *config.Config, opts Options) (*Server, error) {
	s := &Server{log: opts.Logger, tel: opts.Telemetry, loader: opts.Loader, sims: map[string]string{}}
	s.stopping, s.stop = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.loader == nil {
		s.loader = func() (*config.Config, error) { return cfg, nil }
	}
	if err := s.open(ctx, cfg); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) open(ctx context.Context, cfg *config.Config) error {
	if s.tel == nil {
		tel, err := telemetry.New(ctx, telemetry.Config{})
		if err != nil {
			return fmt.Errorf("proxy: telemetry: %w", err)
		}
		s.tel = tel
		s.closers = append(s.closers, func() error { return tel.Shutdown(context.Background()) })
	}
	g, err := gate.Open(ctx, cfg, gate.Options{Logger: s.log, Telemetry: s.tel})
	if err != nil {
		return err
	}
	s.gate, s.ledger = g, g.Ledger()
	s.closers = append(s.closers, g.Close)
	st, err := s.compile(cfg, g.Estimator())
	if err != nil {
		return err
	}
	s.state.Store(st)
	s.tel.Reload(true) // the first load counts, so the gauge says the config is good
	s.data = s.dataHandler()
	ctl, err := s.openControl(ctx, cfg)
	if err != nil {
		return err
	}
	s.admin = admin.New(s.gate, admin.Options{Reload: s.Reload, Control: ctl})
	return nil
}

// compile builds the proxy's state of cfg: its upstreams and routes.
func (s *Server) compile(cfg *config.Config, est *costmodel.Estimator) (*state, error) {
	st := &state{
		cfg:       cfg,
		upstreams: map[string]*upstream{},
		routes:    map[string]*upstream{},
	}
	var err error
	for _, u := range cfg.Upstreams {
		base := u.BaseURL
		if u.Simulated() {
			if base, err = s.simulator(u.Name, est); err != nil {
				return nil, err
			}
		}
		up, err := newUpstream(u, base)
		if err != nil {
			return nil, err
		}
		st.upstreams[u.Name] = up
	}
	for m := range costmodel.BuiltinPrices() {
		st.models = append(st.models, m)
	}
	for m := range cfg.Costs.Prices {
		if !slices.Contains(st.models, m) {
			st.models = append(st.models, m)
		}
	}
	slices.Sort(st.models)
	for path := range config.RouteKinds {
		i := slices.IndexFunc(cfg.Routes, func(r config.RouteConfig) bool { return r.Path == path })
		if i >= 0 {
			st.routes[path] = st.upstreams[cfg.Routes[i].Upstream]
			continue
		}
		want := config.UpstreamKindFor(path)
		for _, u := range cfg.Upstreams {
			if u.Kind == want {
				st.routes[path] = st.upstreams[u.Name]
				break
			}
		}
	}
	return st, nil
}

// simulator returns the base URL of the built-in simulator serving the
// upstream name, starting it on a loopback port the first time. A
// simulator outlives reloads; the server closes it.
func (s *Server) simulator(name string, est *costmodel.Estimator) (string, error) {
	s.simMu.Lock()
	defer s.simMu.Unlock()
	if url, ok := s.sims[name]; ok {
		return url, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("proxy: simulator: %w", err)
	}
	srv := &http.Server{Handler: simulator.New(simulator.Config{Estimator: est})}
	s.wg.Go(func() { _ = srv.Serve(ln) })
	s.closers = append(s.closers, srv.Close)
	url := "http://" + ln.Addr().String()
	s.sims[name] = url
	return url, nil
}

// Reload reads the configuration again and, when it is valid and its
// policies compile, makes it the active one. On any error the last good
// configuration stays active; the error says why. The stores (store.redis,
// ledger.dsn, data_dir) and the listen addresses are not changed by a
// reload: they need a restart, and a reload that changes them is refused.
func (s *Server) Reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	err := s.reload()
	s.tel.Reload(err == nil)
	if err != nil {
		s.log.Error("config reload failed; the last good config stays active", "err", err)
		return err
	}
	s.log.Info("config reloaded")
	return nil
}

func (s *Server) reload() error {
	cfg, err := s.loader()
	if err != nil {
		return err
	}
	old := s.state.Load().cfg
	if cfg.Listen != old.Listen || cfg.AdminListen != old.AdminListen || cfg.RLSListen != old.RLSListen {
		return errors.New("listen, admin_listen or rls_listen changed: restart costgate to change its addresses")
	}
	est, err := costmodel.NewEstimator(cfg.CostModel())
	if err != nil {
		return err
	}
	st, err := s.compile(cfg, est)
	if err != nil {
		return err
	}
	if err := s.gate.Apply(cfg); err != nil {
		return err
	}
	s.state.Store(st)
	return nil
}

// Handler is the data plane: the API routes clients call.
func (s *Server) Handler() http.Handler { return s.data }

// AdminHandler is the admin plane: health, metrics, the admin API and the
// dashboard.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// Gate is the server's decision pipeline, which the other front doors
// (the RLS server) share.
func (s *Server) Gate() *gate.Gate { return s.gate }

// Ledger is the server's ledger, for operator commands and tests.
func (s *Server) Ledger() *ledger.Ledger { return s.ledger }

// Telemetry is the server's telemetry.
func (s *Server) Telemetry() *telemetry.Telemetry { return s.tel }

// closeWait bounds how long Close waits for requests still in the pipeline.
const closeWait = 10 * time.Second

// Close stops everything Open started, in reverse order, and waits for
// the server's goroutines. It flushes the ledger.
func (s *Server) Close() error {
	// Upstream exchanges still running end now (their clients are gone or
	// their drain timed out), and their requests settle with what was
	// read. Requests still in the pipeline are ending: wait for them (bounded),
	// so that they reach their settlement, then for the settlements, which
	// write to the stores, before the stores close. (Close is called once
	// the listeners have stopped, so no new request starts; one that was
	// accepted and starts late finds the ledger closed and is refused.)
	s.stop()
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	s.WaitIdle(ctx)
	cancel()
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
	for path, kind := range config.RouteKinds {
		r.POST(path, s.serveLLM(path, kind))
	}
	r.GET("/v1/models", s.serveModels)
	// Only the methods a generic upstream may be given are routed; each
	// upstream's own list is checked in the pipeline (upstream.admit).
	for _, m := range config.ForwardableMethods {
		r.Handle(m, "/u/:upstream/*path", s.serveGeneric)
	}
	r.GET("/v1/costgate/usage", func(c *gin.Context) { s.serveUsage(c.Writer, c.Request) })
	r.POST("/v1/costgate/reserve", func(c *gin.Context) { s.serveReserve(c.Writer, c.Request) })
	r.POST("/v1/costgate/settle", func(c *gin.Context) { s.serveSettle(c.Writer, c.Request) })
	r.POST("/v1/costgate/release", func(c *gin.Context) { s.serveRelease(c.Writer, c.Request) })
	r.NoMethod(func(c *gin.Context) {
		// gin has set Allow to the methods routed for the path; a generic
		// upstream's own list is narrower.
		if name, ok := strings.CutPrefix(c.Request.URL.Path, "/u/"); ok {
			name, _, _ = strings.Cut(name, "/")
			if u := s.state.Load().upstreams[name]; u != nil && u.kind == "generic" {
				c.Writer.Header().Set("Allow", strings.Join(u.methods, ", "))
			}
		}
		writeError(c.Writer, c.Request.URL.Path, http.StatusMethodNotAllowed, apiError{
			Type: "invalid_request_error", Code: "method_not_allowed",
			Message: "costgate does not serve " + c.Request.Method + " " + c.Request.URL.Path + " (allowed: " + c.Writer.Header().Get("Allow") + ")",
		})
	})
	r.NoRoute(func(c *gin.Context) {
		writeError(c.Writer, c.Request.URL.Path, http.StatusNotFound, apiError{
			Type: "invalid_request_error", Code: "unknown_route",
			Message: "costgate does not serve " + c.Request.Method + " " + c.Request.URL.Path,
		})
	})
	return r
}

// Describe says in a few lines what the server runs on: its store, its
// ledger, and where each upstream's requests go.
func (s *Server) Describe() []string {
	st := s.state.Load()
	store := "limiter store: in-memory (single node)"
	if st.cfg.Store.Redis != "" {
		store = "limiter store: Redis"
	}
	led := "ledger: embedded, under " + st.cfg.DataDirPath()
	if st.cfg.Ledger.DSN != "" {
		led = "ledger: PostgreSQL"
	}
	lines := []string{store, led}
	for _, u := range st.cfg.Upstreams {
		where := config.RedactURL(u.BaseURL)
		if u.Simulated() {
			where = "the built-in simulator at " + st.upstreams[u.Name].target.String()
			if u.Simulate == "auto" && u.APIKeyEnv != "" {
				where += " (" + u.APIKeyEnv + " is unset)"
			}
		}
		lines = append(lines, fmt.Sprintf("upstream %s (%s): %s", u.Name, u.Kind, where))
	}
	return lines
}

// Config is the active configuration. It must not be modified.
func (s *Server) Config() *config.Config { return s.state.Load().cfg }

// SetLoader replaces the function Reload reads the configuration with.
func (s *Server) SetLoader(f func() (*config.Config, error)) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	s.loader = f
}

// WaitIdle returns when no request is in the pipeline, its settlement
// included, or when ctx ends. A client has its answer before its request
// is settled; tests and operator commands that read the ledger wait here
// first.
func (s *Server) WaitIdle(ctx context.Context) error {
	for s.inflight.Load() != 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}
