package policies

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"
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
