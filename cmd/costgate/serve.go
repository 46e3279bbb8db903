package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/examples"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/rls"
)

// drainTimeout is how long serve waits, when it stops, for requests in
// flight to finish before it cuts them.
var drainTimeout = 30 * time.Second

// configFlags are the flags that choose and override the config.
type configFlags struct {
	config, listen, adminListen, redis, ledger, dataDir string
}

func (f *configFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "config file (default: $COSTGATE_CONFIG, else the embedded quickstart)")
	fs.StringVar(&f.listen, "listen", "", "data plane address (overrides listen)")
	fs.StringVar(&f.adminListen, "admin-listen", "", "admin address (overrides admin_listen)")
	fs.StringVar(&f.redis, "redis", "", "limiter store Redis URL (overrides store.redis)")
	fs.StringVar(&f.ledger, "ledger", "", "ledger PostgreSQL DSN (overrides ledger.dsn)")
	fs.StringVar(&f.dataDir, "data-dir", "", "data directory for the embedded ledger (overrides data_dir)")
}

// envDefaults are the config's defaults from the environment: the config
// file wins over them, and the flags over the file.
func envDefaults() config.Defaults {
	return config.Defaults{
		AdminToken: os.Getenv("COSTGATE_ADMIN_TOKEN"),
		Redis:      os.Getenv("REDIS_URL"),
		LedgerDSN:  os.Getenv("DATABASE_URL"),
	}
}

// load reads the config the flags name, under the environment's defaults,
// and applies the flags' overrides. It reports which config it read.
func (f *configFlags) load() (*config.Config, string, error) {
	path := f.config
	if path == "" {
		path = os.Getenv("COSTGATE_CONFIG")
	}
	env := envDefaults()
	var cfg *config.Config
	var err error
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	source := path
	if path != "" {
		if _, statErr := os.Stat(path); errors.Is(statErr, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("config file %s does not exist: costgate needs your own config there, with your tenants' keys and admin token (in a container, mount it: -v ./costgate.yaml:%s:ro); see examples/quickstart/costgate.yaml", path, path)
		}
		cfg, err = config.LoadWith(path, env)
	} else {
		// The quickstart: simulated upstreams, published demo keys, and
		// loopback addresses (see examples/quickstart/costgate.yaml).
		source = "the embedded quickstart"
		cfg, err = config.ParseWith(examples.QuickstartConfig(), env)
		if err == nil {
			cfg.WithPolicyFS(examples.QuickstartPolicies())
			// The quickstart's published token gives way to the
			// operator's own.
			set(&cfg.AdminToken, env.AdminToken)
		}
	}
	if err != nil {
		return nil, "", err
	}
	set(&cfg.Listen, f.listen)
	set(&cfg.AdminListen, f.adminListen)
	set(&cfg.Store.Redis, f.redis)
	set(&cfg.Ledger.DSN, f.ledger)
	if f.dataDir != "" {
		// A flag's relative path is the working directory's, not the
		// config file's (as data_dir in the file is).
		dir, err := filepath.Abs(f.dataDir)
		if err != nil {
			return nil, "", fmt.Errorf("-data-dir %s: %w", f.dataDir, err)
		}
		cfg.DataDir = dir
	}
	// The flags may have moved a published demo key or token onto a public
	// address: the config is checked again as it will run.
	if err := cfg.Validate(); err != nil {
		return nil, "", fmt.Errorf("config %s with the command line's flags: %w", source, err)
	}
	return cfg, source, nil
}

// serve runs the proxy until ctx ends. Its startup lines and its logs are
// one stream: JSON log records (log/slog) on stderr.
func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf configFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, source, err := cf.load()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	loader := func() (*config.Config, error) {
		c, _, err := cf.load()
		return c, err
	}
	srv, err := proxy.Open(ctx, cfg, proxy.Options{Logger: log, Loader: loader})
	if err != nil {
		return err
	}
	defer srv.Close()

	// Reload on SIGHUP and when the config file or policy directory
	// changes; a bad config is logged and the last good one stays.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-hup:
				_ = srv.Reload()
			case <-ctx.Done():
				return
			}
		}
	}()
	if source != "the embedded quickstart" {
		if err := srv.Watch(ctx, source); err != nil {
			log.Warn("config files are not watched; reload with SIGHUP or POST /admin/v1/reload", "err", err)
		}
	}

	data, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	admin, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		data.Close()
		return fmt.Errorf("admin listen: %w", err)
	}
	dataSrv := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	adminSrv := &http.Server{Handler: srv.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 3)
	var rlsSrv *rls.Server
	if cfg.RLSListen != "" {
		rln, err := net.Listen("tcp", cfg.RLSListen)
		if err != nil {
			data.Close()
			admin.Close()
			return fmt.Errorf("rls listen: %w", err)
		}
		rlsSrv = rls.New(srv.Gate(), rls.Options{Logger: log, Reflection: cfg.RLS.Reflection, GRPCGo: cfg.RLS.Transport == config.RLSTransportGRPCGo})
		go func() { errc <- rlsSrv.Serve(rln) }()
		log.Info("costgate: Envoy rate limit service (gRPC) on "+rln.Addr().String(), "rls_listen", rln.Addr().String())
	}
	go func() { errc <- dataSrv.Serve(data) }()
	go func() { errc <- adminSrv.Serve(admin) }()
	// Tools find the addresses in this line's message ("serving ... on ADDR
	// (admin on ADDR)") as well as in its attributes.
	log.Info(fmt.Sprintf("costgate: serving %s on %s (admin on %s)", source, data.Addr(), admin.Addr()),
		"config", source, "listen", data.Addr().String(), "admin_listen", admin.Addr().String())
	for _, line := range srv.Describe() {
		log.Info("costgate: " + line)
	}

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	// Drain: stop accepting, let in-flight requests and streams finish and
	// settle, then close the stores (flushing the ledger).
	shutdown, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	e1 := dataSrv.Shutdown(shutdown)
	if e1 != nil {
		// Streams still running past the drain are cut: their upstream
		// requests end, and they settle with what was streamed. Without
		// this, Close would wait for their settlements as long as the
		// streams last.
		dataSrv.Close()
	}
	if rlsSrv != nil {
		rlsSrv.GracefulStop()
	}
	e2 := adminSrv.Shutdown(shutdown)
	e3 := srv.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, e1, e2, e3)
}
