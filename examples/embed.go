// Package examples holds costgate's runnable example configurations and
// policies. The quickstart is embedded in the binary: it is what
// `costgate serve` runs when no config is given.
package examples

import (
	"embed"
	"io/fs"
)

//go:embed quickstart/costgate.yaml quickstart/policies
var quickstart embed.FS

// QuickstartConfig is the YAML of examples/quickstart/costgate.yaml.
func QuickstartConfig() []byte {
	b, err := quickstart.ReadFile("quickstart/costgate.yaml")
	if err != nil {
		panic("examples: quickstart config missing from the binary: " + err.Error())
	}
	return b
}

// QuickstartPolicies is the quickstart's policy directory.
func QuickstartPolicies() fs.FS {
	sub, err := fs.Sub(quickstart, "quickstart/policies")
	if err != nil {
		panic("examples: quickstart policies missing from the binary: " + err.Error())
	}
	return sub
}
