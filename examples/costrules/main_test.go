package main

import (
	"path/filepath"
	"testing"
)

// TestExamples runs every rule file here: each must parse, validate and
// price its samples.
func TestExamples(t *testing.T) {
	paths, err := filepath.Glob("*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no rule files: %v", err)
	}
	for _, p := range paths {
		if err := run(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
