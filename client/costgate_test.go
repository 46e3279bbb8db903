package client_test

import (
	"context"
	"fmt"
	"io/fs"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/proxy"
)

// costgate is costgate's data plane, started in process on loopback.
type costgate struct {
	srv *proxy.Server
	url string

	ts      *httptest.Server
	dataDir string
}

// openCostgate starts costgate with the config yaml (without data_dir,
// which it adds), on the given stores: an empty redisURL is the in-memory
// store and an empty ledgerDSN the embedded ledger. pol holds the Rego
// policies; nil means none.
func openCostgate(yaml, redisURL, ledgerDSN string, pol fs.FS) (*costgate, error) {
	dir, err := os.MkdirTemp("", "costgate-client-")
	if err != nil {
		return nil, err
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf("data_dir: %q\n", dir) + yaml))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// The environment's REDIS_URL and DATABASE_URL must not leak in: the
	// server uses exactly the stores it is given.
	cfg.Store.Redis, cfg.Ledger.DSN = redisURL, ledgerDSN
	if pol != nil {
		cfg.WithPolicyFS(pol)
	}
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ts := httptest.NewServer(srv.Handler())
	return &costgate{srv: srv, url: ts.URL, ts: ts, dataDir: dir}, nil
}

// Close stops the server and removes its data.
func (c *costgate) Close() {
	c.ts.Close()
	c.srv.Close()
	os.RemoveAll(c.dataDir)
}

// stores are the two deployments the integration tests run on.
var stores = []string{"memory", "redis+postgres"}

// startCostgate starts costgate for t on store: "memory" (the in-memory
// limiter and the embedded ledger) or "redis+postgres" (a private Redis
// and a PostgreSQL database of the test's own; the test fails under CI
// when either is missing, and is skipped elsewhere).
func startCostgate(t *testing.T, store, yaml string, pol fs.FS) *costgate {
	t.Helper()
	var redisURL, dsn string
	if store == "redis+postgres" {
		redisURL = redistest.New(t).URL
		dsn = pgtest.New(t)
	}
	c, err := openCostgate(yaml, redisURL, dsn, pol)
	if err != nil {
		t.Fatalf("start costgate: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// entries returns tenant's ledger entries once every settlement under way
// has been written.
func (c *costgate) entries(t *testing.T, tenant string) []ledger.Entry {
	t.Helper()
	ctx := context.Background()
	if err := c.srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	l := c.srv.Ledger()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := l.Entries(ctx, ledger.Query{Tenant: tenant, From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return page.Entries
}

// entry returns the ledger entry of request id, waiting up to 10 seconds
// for it to satisfy ok.
func (c *costgate) entry(t *testing.T, tenant, id string, ok func(ledger.Entry) bool) ledger.Entry {
	t.Helper()
	var last *ledger.Entry
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, e := range c.entries(t, tenant) {
			if e.RequestID == id {
				last = &e
				if ok(e) {
					return e
				}
			}
		}
	}
	if last == nil {
		t.Fatalf("no ledger entry %s", id)
	}
	t.Fatalf("ledger entry %s: %+v", id, *last)
	return ledger.Entry{}
}
