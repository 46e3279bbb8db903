// Command costrules prices sample requests with the cost rules in this
// directory, to show what each rule charges:
//
//	go run ./examples/costrules            # every *.yaml here
//	go run ./examples/costrules search.yaml
//
// Each YAML file holds a `rule` (the `cost` section of a costgate route;
// see costmodel.Rule) and `samples`: requests with a method, a raw query
// string, headers and a body.
package main

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"

	"go.yaml.in/yaml/v3"

	"github.com/costgate/costgate/costmodel"
)

type sample struct {
	Name   string            `yaml:"name"`
	Method string            `yaml:"method"`
	Query  string            `yaml:"query"`
	Header map[string]string `yaml:"header"`
	Body   string            `yaml:"body"`
}

type file struct {
	Rule    costmodel.Rule `yaml:"rule"`
	Samples []sample       `yaml:"samples"`
}

func main() {
	paths := os.Args[1:]
	if len(paths) == 0 {
		dir := "examples/costrules"
		if _, err := os.Stat(dir); err != nil {
			dir = "."
		}
		paths, _ = filepath.Glob(filepath.Join(dir, "*.yaml"))
		sort.Strings(paths)
	}
	if len(paths) == 0 {
		fmt.Fprintln(os.Stderr, "costrules: no rule files")
		os.Exit(2)
	}
	for _, p := range paths {
		if err := run(p); err != nil {
			fmt.Fprintln(os.Stderr, "costrules:", err)
			os.Exit(1)
		}
	}
}

func run(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var f file
	if err := yaml.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := f.Rule.Validate(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Printf("%s (per call %s, per %s %s)\n", filepath.Base(path), f.Rule.PerCall, unitName(f.Rule.Unit), f.Rule.PerUnit)
	for _, s := range f.Samples {
		q, err := url.ParseQuery(s.Query)
		if err != nil {
			return fmt.Errorf("%s: sample %q: %w", path, s.Name, err)
		}
		h := http.Header{}
		for k, v := range s.Header {
			h.Set(k, v)
		}
		method := s.Method
		if method == "" {
			method = http.MethodGet
		}
		est, err := f.Rule.Estimate(costmodel.GenericRequest{Method: method, Path: "/", Query: q, Header: h, Body: []byte(s.Body)})
		if err != nil {
			fmt.Printf("  %-40s error: %v\n", s.Name, err)
			continue
		}
		fmt.Printf("  %-40s %5d %-18s %s\n", s.Name, est.Usage.Units, unitName(f.Rule.Unit), est.Cost)
	}
	return nil
}

func unitName(u string) string {
	if u == "" {
		return "unit"
	}
	return u
}
