package policies

import (
	"context"
	"io/fs"
	"os"
	"sync/atomic"
)

// Engine holds the active Set and swaps it atomically on reload. Decisions in
// flight finish on the set they started with. An Engine is safe for
// concurrent use; its zero value is not usable, use NewEngine.
type Engine struct {
	set      atomic.Pointer[Set]
	reloads  atomic.Int64
	failures atomic.Int64
	lastErr  atomic.Pointer[errBox]
}

type errBox struct{ err error }

// NewEngine loads fsys (see Load) and returns an Engine deciding with it.
func NewEngine(fsys fs.FS) (*Engine, error) {
	s, err := Load(fsys)
	if err != nil {
		return nil, err
	}
	e := &Engine{}
	e.set.Store(s)
	return e, nil
}

// Set returns the active set.
func (e *Engine) Set() *Set { return e.set.Load() }

// Decide decides with the active set.
func (e *Engine) Decide(ctx context.Context, in *Input) (Decision, error) {
	return e.set.Load().Decide(ctx, in)
}

// Reload loads fsys and makes it the active set. On error the last good set
// stays active and the error (an *Error for policy problems) is returned.
func (e *Engine) Reload(fsys fs.FS) error {
	return e.reload(context.Background(), fsys, "")
}

// ReloadDir is Reload of the directory dir, with problems naming files by
// their path under dir.
func (e *Engine) ReloadDir(dir string) error {
	return e.reload(context.Background(), os.DirFS(dir), dir)
}

func (e *Engine) reload(ctx context.Context, fsys fs.FS, root string) error {
	s, err := load(ctx, fsys, root)
	if err != nil {
		e.failures.Add(1)
		e.lastErr.Store(&errBox{err})
		return err
	}
	e.set.Store(s)
	e.reloads.Add(1)
	e.lastErr.Store(nil)
	return nil
}

// Status reports how many reloads succeeded and failed since NewEngine, and
// the error of the last reload when it failed (the active set is then older
// than the files on disk).
func (e *Engine) Status() (reloads, failures int64, lastErr error) {
	if b := e.lastErr.Load(); b != nil {
		lastErr = b.err
	}
	return e.reloads.Load(), e.failures.Load(), lastErr
}
