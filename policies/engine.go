package policies

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
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

// watchDebounce is how long Watch waits after the last change before
// reloading, so that an editor's write-rename-chmod burst or a checkout of
// many files causes one reload.
const watchDebounce = 150 * time.Millisecond

// Watch reloads the policies of dir (and its subdirectories) whenever a .rego
// file in it changes. It watches synchronously, so that a change made after
// Watch returns is seen, and reloads in a goroutine it owns, which stops when
// ctx is done. onReload, when not nil, is called from that goroutine after
// every reload attempt with its result (nil on success); on error the last
// good set stays active. Watch returns an error only when dir cannot be
// watched.
func (e *Engine) Watch(ctx context.Context, dir string, onReload func(error)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("policies: watch: %w", err)
	}
	if err := addTree(w, dir); err != nil {
		w.Close()
		return fmt.Errorf("policies: watch %s: %w", dir, err)
	}
	go e.watch(ctx, w, dir, onReload)
	return nil
}

func addTree(w *fsnotify.Watcher, dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return w.Add(p)
		}
		return nil
	})
}

func (e *Engine) watch(ctx context.Context, w *fsnotify.Watcher, dir string, onReload func(error)) {
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Stat(ev.Name); err == nil && fi.IsDir() {
					_ = addTree(w, ev.Name) // a new subdirectory; its files count too
				}
			}
			if filepath.Ext(ev.Name) == ".rego" || ev.Has(fsnotify.Create) || ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				timer.Reset(watchDebounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			if onReload != nil && !errors.Is(err, fsnotify.ErrEventOverflow) {
				onReload(fmt.Errorf("policies: watch %s: %w", dir, err))
				continue
			}
			timer.Reset(watchDebounce) // events were lost: reload to be safe
		case <-timer.C:
			err := e.reload(ctx, os.DirFS(dir), dir)
			if onReload != nil {
				onReload(err)
			}
		}
	}
}
