package rls_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	// The typed configs examples/envoy/envoy.yaml names.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/rls"
)

var exampleDir = filepath.Join("..", "examples", "envoy")

// TestEnvoyExampleConfig is the check of examples/envoy: in domain
// costgate, [tenant=demo-free] with hits_addend 1 is OK five times in a
// minute and OVER_LIMIT the sixth, with duration_until_reset set.
func TestEnvoyExampleConfig(t *testing.T) {
	cfg, err := config.Load(filepath.Join(exampleDir, "costgate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RLSListen != "127.0.0.1:8081" {
		t.Errorf("rls_listen %q, want 127.0.0.1:8081", cfg.RLSListen)
	}
	cfg.DataDir = t.TempDir()
	e := &env{}
	e.open(t, cfg, rls.Options{})
	for i := range 5 {
		resp := e.ask(t, "costgate", 1, d("tenant", "demo-free"))
		if resp.GetOverallCode() != OK {
			t.Fatalf("request %d: %s", i+1, codes_(resp))
		}
	}
	resp := e.ask(t, "costgate", 1, d("tenant", "demo-free"))
	if resp.GetOverallCode() != OVER {
		t.Fatalf("sixth request: %s", codes_(resp))
	}
	st := resp.GetStatuses()[0]
	if st.GetCode() != OVER || st.GetDurationUntilReset().AsDuration() <= 0 || st.GetCurrentLimit().GetRequestsPerUnit() != 5 ||
		st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("sixth request's status: %v", st)
	}
	if headerOf(resp, "Retry-After") == "" {
		t.Errorf("no Retry-After: %v", resp.GetResponseHeadersToAdd())
	}

	// The load test's descriptors (bench/rls.sh) all have a limit, and
	// far above any load.
	for _, ds := range [][]string{
		{"tenant", "bench-7"},
		{"tenant", "bench-7", "generic_key", "search"},
		{"remote_address", "10.0.0.7"},
	} {
		resp := e.ask(t, "costgate", 1, d(ds...))
		if c := resp.GetStatuses()[0].GetCurrentLimit(); resp.GetOverallCode() != OK || c.GetRequestsPerUnit() < 1e9 {
			t.Errorf("%v: %s, current_limit %v", ds, codes_(resp), c)
		}
	}
}

// TestEnvoyExampleIsAnEnvoyConfig reads examples/envoy/envoy.yaml as
// Envoy's bootstrap proto, with go-control-plane's types and validation.
func TestEnvoyExampleIsAnEnvoyConfig(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(exampleDir, "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		t.Fatalf("not a bootstrap: %v", err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("invalid: %v", err)
	}
	for _, c := range boot.GetStaticResources().GetClusters() {
		if c.GetName() != "costgate_rls" {
			continue
		}
		addr := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if addr.GetAddress() != "127.0.0.1" || addr.GetPortValue() != 8081 {
			t.Errorf("the RLS cluster points at %v, want costgate.yaml's rls_listen", addr)
		}
		return
	}
	t.Error("no costgate_rls cluster")
}
