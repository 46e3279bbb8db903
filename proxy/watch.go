package proxy

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch reloads the configuration when the config file at path, or a .rego
// file in the active policy directory or any of its subdirectories
// (policies/lib/*.rego), changes. Changes are debounced by a quarter second,
// so that an editor's write-rename-chmod counts once. The watching goroutine
// is the server's: it stops when ctx ends or the server closes. Watch
// watches directories, not files, so that a file replaced by rename (as
// editors and Kubernetes ConfigMaps do) is still seen; a subdirectory
// created later is watched from its creation on. Hidden subdirectories
// (such as a ConfigMap's ..data) are not descended into: their swap is seen
// in the directory above.
func (s *Server) Watch(ctx context.Context, path string) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := w.Add(filepath.Dir(path)); err != nil {
		w.Close()
		return err
	}
	policyDir := ""
	if pd := s.state.Load().cfg.PolicyDir(); pd != "" && !s.state.Load().cfg.EmbeddedPolicies() {
		policyDir = filepath.Clean(pd)
		if err := addTree(w, policyDir); err != nil {
			w.Close()
			return err
		}
	}
	inPolicies := func(name string) bool {
		return policyDir != "" && (name == policyDir || strings.HasPrefix(name, policyDir+string(filepath.Separator)))
	}
	ctx, cancel := context.WithCancel(ctx)
	s.closers = append(s.closers, func() error { cancel(); return nil })
	s.wg.Go(func() {
		defer w.Close()
		var debounce <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				name := filepath.Clean(ev.Name)
				if ev.Has(fsnotify.Create) && inPolicies(name) {
					if fi, err := os.Stat(name); err == nil && fi.IsDir() && !hidden(filepath.Base(name)) {
						// A new subdirectory: watch it, and reload for the
						// files it came with.
						if err := addTree(w, name); err != nil {
							s.log.Warn("config watch: a new policy subdirectory is not watched", "dir", name, "err", err)
						}
						debounce = time.After(250 * time.Millisecond)
					}
				}
				// Only the config file and policy files count: a log
				// written beside the config must not reload it forever.
				relevant := name == filepath.Clean(path) || strings.HasSuffix(name, ".rego") ||
					filepath.Base(name) == "..data" // a Kubernetes ConfigMap's atomic swap
				if relevant && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Remove) != 0 {
					debounce = time.After(250 * time.Millisecond)
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				s.log.Warn("config watch error", "err", err)
			case <-debounce:
				debounce = nil
				_ = s.Reload()
			}
		}
	})
	return nil
}

// addTree watches dir and its subdirectories, hidden ones excepted.
func addTree(w *fsnotify.Watcher, dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != dir && hidden(d.Name()) {
			return filepath.SkipDir
		}
		return w.Add(p)
	})
}

func hidden(name string) bool { return strings.HasPrefix(name, ".") }
