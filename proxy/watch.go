package proxy

import (
	"context"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch reloads the configuration when the config file at path, or a file
// in the active policy directory, changes. Changes are debounced by a
// quarter second, so that an editor's write-rename-chmod counts once. The
// watching goroutine is the server's: it stops when ctx ends or the server
// closes. Watch watches directories, not files, so that a file replaced by
// rename (as editors and Kubernetes ConfigMaps do) is still seen.
func (s *Server) Watch(ctx context.Context, path string) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	dirs := map[string]bool{filepath.Dir(path): true}
	if pd := s.state.Load().cfg.policyDir(); pd != "" && s.state.Load().cfg.policyFS == nil {
		dirs[pd] = true
	}
	for d := range dirs {
		if err := w.Add(d); err != nil {
			w.Close()
			return err
		}
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
				// Only the config file and policy files count: a log
				// written beside the config must not reload it forever.
				relevant := filepath.Clean(ev.Name) == filepath.Clean(path) || strings.HasSuffix(ev.Name, ".rego") ||
					filepath.Base(ev.Name) == "..data" // a Kubernetes ConfigMap's atomic swap
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
