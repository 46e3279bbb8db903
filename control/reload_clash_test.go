package control_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/proxy"
)

// TestReloadRefusesAnAPITenantsName: a config reload that declares a
// tenant whose name a tenant created through the admin API has is
// refused, naming the field: the two would be one tenant to the ledger,
// the limiter and the usage API (the new key would read the API tenant's
// spend). CreateTenant refuses the same clash the other way round.
func TestReloadRefusesAnAPITenantsName(t *testing.T) {
	dsn := pgtest.New(t)
	up := simulatorURL(t)
	dir := t.TempDir()
	r := newReplica(t, up, replicaOptions{dsn: dsn, dir: dir})

	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"beta","plan":"free"}`, nil)
	var k created
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"beta"}`, &k)
	for i := 0; i < 3; i++ {
		if st, body := r.chat(t, k.Key); st != 200 {
			t.Fatalf("chat: %d %s", st, body)
		}
	}
	r.srv.Ledger().Flush(t.Context())

	// The operator onboards another customer in the file, named "beta".
	yaml := clashingConfig(dir, up)
	r.srv.SetLoader(func() (*config.Config, error) {
		cfg, err := config.Parse([]byte(yaml))
		if err != nil {
			return nil, err
		}
		cfg.Ledger.DSN = dsn
		return cfg, nil
	})
	err := r.srv.Reload()
	if err == nil || !strings.Contains(err.Error(), "tenants[1].name") {
		t.Fatalf("reload declaring the API tenant's name %q: %v, want an error naming tenants[1].name", "beta", err)
	}
	// The last good config stays: the new key is unknown, the API
	// tenant's key serves.
	req, _ := http.NewRequest("GET", r.data+"/v1/costgate/usage", nil)
	req.Header.Set("Authorization", "Bearer cg-other-customer")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("the refused config's key: %d %s, want 401", resp.StatusCode, b)
	}
	if st, body := r.chat(t, k.Key); st != 200 {
		t.Fatalf("the API tenant after the refused reload: %d %s", st, body)
	}
}

// clashingConfig is a config file with data_dir dir and upstream up that
// declares tenants yamlco and beta.
func clashingConfig(dir, up string) string {
	return planAtkConfig(dir, up, `  - name: beta
    plan: free
    keys:
      - id: other-key
        key: cg-other-customer
`, "")
}

// TestStartRefusesAnAPITenantsName: a replica that starts with a config
// file declaring a tenant created through the admin API refuses to
// start, naming the field, as a reload would be refused.
func TestStartRefusesAnAPITenantsName(t *testing.T) {
	dsn := pgtest.New(t)
	up := simulatorURL(t)
	r := newReplica(t, up, replicaOptions{dsn: dsn})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"beta","plan":"free"}`, nil)
	cfg, err := config.Parse([]byte(clashingConfig(t.TempDir(), up)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ledger.DSN = dsn
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{})
	if err == nil {
		srv.Close()
		t.Fatal("a replica started with a config declaring the API tenant beta")
	}
	if !strings.Contains(err.Error(), "tenants[1].name") {
		t.Fatalf("start: %v, want an error naming tenants[1].name", err)
	}
}
