package policies

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"
)

const (
	allowAll = "package costgate.policies.p\n\ndecision := {\"outcome\": \"allow\"}\n"
	denyAll  = "package costgate.policies.p\n\ndecision := {\"outcome\": \"hard\", \"status\": 403, \"reason\": \"closed\"}\n"
	broken   = "package costgate.policies.p\n\ndecision := {\"outcome\": \n"
)

func mapFS(files map[string]string) fstest.MapFS {
	m := fstest.MapFS{}
	for k, v := range files {
		m[k] = &fstest.MapFile{Data: []byte(v)}
	}
	return m
}

func mustOutcome(t *testing.T, e *Engine, want Outcome) {
	t.Helper()
	d, err := e.Decide(context.Background(), baseInput())
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != want {
		t.Fatalf("outcome = %s, want %s", d.Outcome, want)
	}
}

func TestEngineReloadKeepsLastGoodSet(t *testing.T) {
	e, err := NewEngine(mapFS(map[string]string{"p.rego": allowAll}))
	if err != nil {
		t.Fatal(err)
	}
	mustOutcome(t, e, Allow)
	if err := e.Reload(mapFS(map[string]string{"p.rego": denyAll})); err != nil {
		t.Fatal(err)
	}
	mustOutcome(t, e, Hard)
	err = e.Reload(mapFS(map[string]string{"p.rego": broken}))
	var perr *Error
	if !errors.As(err, &perr) || perr.Problems[0].File != "p.rego" || perr.Problems[0].Line == 0 {
		t.Fatalf("Reload(broken) = %v, want an *Error at p.rego:line", err)
	}
	mustOutcome(t, e, Hard)
	reloads, failures, last := e.Status()
	if reloads != 1 || failures != 1 || last == nil {
		t.Fatalf("Status = %d, %d, %v; want 1, 1, the error", reloads, failures, last)
	}
}

func TestEngineWatch(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		// Write then rename, as editors and config management do.
		tmp := filepath.Join(dir, filepath.Dir(name), "."+filepath.Base(name)+".tmp")
		if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("p.rego", allowAll)
	e, err := NewEngine(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan error, 16)
	if err := e.Watch(ctx, dir, func(err error) { results <- err }); err != nil {
		t.Fatal(err)
	}
	next := func() error {
		t.Helper()
		select {
		case err := <-results:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no reload within 10s of a change")
			return nil
		}
	}

	write("p.rego", denyAll)
	if err := next(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	mustOutcome(t, e, Hard)

	write("p.rego", broken)
	err = next()
	var perr *Error
	if !errors.As(err, &perr) || perr.Problems[0].File != filepath.Join(dir, "p.rego") {
		t.Fatalf("reload of a broken file = %v, want an *Error naming %s", err, filepath.Join(dir, "p.rego"))
	}
	mustOutcome(t, e, Hard) // the last good set stays active

	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("p.rego", allowAll)
	for err := next(); err != nil; err = next() {
		// The mkdir may cause a reload of its own that still sees the broken file.
	}
	mustOutcome(t, e, Allow)

	// A policy added in the new subdirectory is watched too.
	write("sub/q.rego", "package costgate.policies.q\n\ndecision := {\"outcome\": \"hard\", \"status\": 429, \"reason\": \"q\"}\n")
	for len(e.Set().Policies()) != 2 {
		// A late event of the previous write may reload once more first.
		if err := next(); err != nil {
			t.Fatalf("reload: %v", err)
		}
	}
	mustOutcome(t, e, Hard)
}

// TestEngineDecideDuringReload decides from many goroutines while the set is
// swapped back and forth; run with -race.
func TestEngineDecideDuringReload(t *testing.T) {
	allow := mapFS(map[string]string{"p.rego": allowAll})
	deny := mapFS(map[string]string{"p.rego": denyAll})
	e, err := NewEngine(allow)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 4)
	for range 4 {
		go func() {
			in := baseInput()
			for ctx.Err() == nil {
				d, err := e.Decide(ctx, in)
				if err != nil {
					done <- err
					return
				}
				if d.Outcome != Allow && d.Outcome != Hard {
					done <- errors.New("unexpected outcome " + string(d.Outcome))
					return
				}
			}
			done <- nil
		}()
	}
	for i := range 20 {
		fsys := allow
		if i%2 == 0 {
			fsys = deny
		}
		if err := e.Reload(fsys); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestEngineWatchMissingDir(t *testing.T) {
	e, err := NewEngine(mapFS(map[string]string{"p.rego": allowAll}))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Watch(context.Background(), filepath.Join(t.TempDir(), "nope"), nil); err == nil {
		t.Fatal("Watch of a missing directory succeeded")
	}
}

// TestEngineWatchConfigMapLayout follows a Kubernetes ConfigMap volume:
// files are symlinks into a hidden ..data directory, itself a symlink that
// is swapped atomically on update.
func TestEngineWatchConfigMapLayout(t *testing.T) {
	dir := t.TempDir()
	version := func(name, src string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "p.rego"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", allowAll)
	if err := os.Symlink(filepath.Join("..data", "p.rego"), filepath.Join(dir, "p.rego")); err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(e.Set().Policies()); n != 1 {
		t.Fatalf("%d policies, want 1 (the hidden ..data directory must not be loaded twice)", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan error, 16)
	if err := e.Watch(ctx, dir, func(err error) { results <- err }); err != nil {
		t.Fatal(err)
	}
	version("..v2", denyAll)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-results:
			if err != nil {
				t.Fatalf("reload: %v", err)
			}
			d, err := e.Decide(context.Background(), baseInput())
			if err != nil {
				t.Fatal(err)
			}
			if d.Outcome == Hard {
				return
			}
		case <-deadline:
			t.Fatal("the ConfigMap update was not picked up within 10s")
		}
	}
}
