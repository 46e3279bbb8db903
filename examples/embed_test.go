package examples_test

import (
	"io/fs"
	"testing"

	"github.com/costgate/costgate/examples"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/proxy"
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
			if _, err := proxy.Parse(c.yaml); err != nil {
				t.Fatalf("config: %v", err)
			}
			if _, err := policies.Load(c.pols); err != nil {
				t.Fatalf("policies: %v", err)
			}
		})
	}
}
