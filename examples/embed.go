// Package examples holds costgate's runnable example configurations and
// policies. The quickstart and the demo are embedded in the binary: the
// quickstart is what `costgate serve` runs when no config is given, the
// demo is what `costgate demo` runs.
package examples

import (
	"embed"
	"io/fs"
)

//go:embed quickstart/costgate.yaml quickstart/policies demo/costgate.yaml demo/policies
var files embed.FS

// QuickstartConfig is the YAML of examples/quickstart/costgate.yaml.
func QuickstartConfig() []byte { return read("quickstart/costgate.yaml") }

// QuickstartPolicies is the quickstart's policy directory.
func QuickstartPolicies() fs.FS { return sub("quickstart/policies") }

// DemoConfig is the YAML of examples/demo/costgate.yaml.
func DemoConfig() []byte { return read("demo/costgate.yaml") }

// DemoPolicies is the demo's policy directory.
func DemoPolicies() fs.FS { return sub("demo/policies") }

// read and sub panic only if the embed directive and the names above
// disagree, which the package's test catches at build time.
func read(name string) []byte {
	b, err := files.ReadFile(name)
	if err != nil {
		panic("examples: " + err.Error())
	}
	return b
}

func sub(dir string) fs.FS {
	s, err := fs.Sub(files, dir)
	if err != nil {
		panic("examples: " + err.Error())
	}
	return s
}
