package examples_test

import (
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/examples"
	"github.com/costgate/costgate/policies"
)

// TestEmbedded: the embedded configs parse and their policies load (which
// runs their Rego tests).
func TestEmbedded(t *testing.T) {
	t.Setenv("COSTGATE_ADMIN_TOKEN", "x")
	for _, c := range []struct {
		name string
		yaml []byte
		pols fs.FS
	}{
		{"quickstart", examples.QuickstartConfig(), examples.QuickstartPolicies()},
		{"demo", examples.DemoConfig(), examples.DemoPolicies()},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := config.Parse(c.yaml); err != nil {
				t.Fatalf("config: %v", err)
			}
			if _, err := policies.Load(c.pols); err != nil {
				t.Fatalf("policies: %v", err)
			}
		})
	}
}

// TestOnDisk: the examples run from disk parse, and their policies load.
func TestOnDisk(t *testing.T) {
	for _, path := range []string{"quickstart/costgate.yaml", "teams/costgate.yaml", "search-guard/costgate.yaml", "demo/costgate.yaml"} {
		t.Run(path, func(t *testing.T) {
			t.Setenv("COSTGATE_ADMIN_TOKEN", "x")
			cfg, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Policies.Dir == "" {
				t.Fatal("no policies")
			}
			if _, err := policies.LoadDir(filepath.Join(filepath.Dir(path), cfg.Policies.Dir)); err != nil {
				t.Fatalf("policies: %v", err)
			}
		})
	}
}
