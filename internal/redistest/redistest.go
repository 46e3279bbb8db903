// Package redistest gives tests a real Redis.
//
// New starts a private redis-server (from PATH) on a free loopback port for
// the calling test and stops it when the test ends, so tests never share
// state. When redis-server is not installed, REDIS_URL names a server to use
// instead; the database is flushed before the test. When neither is
// available the test fails under CI (the CI environment variable is set) and
// is skipped elsewhere.
package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/servicetest"
)

// Server is a Redis that a test may use.
type Server struct {
	// URL is a redis:// URL for the server.
	URL string
	// Addr is host:port.
	Addr string
	cmd  *exec.Cmd
	dir  string // the private server's working directory
}

// New returns a Redis for t, started privately or taken from REDIS_URL.
func New(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err == nil {
		return start(t)
	}
	url := os.Getenv("REDIS_URL")
	if url == "" {
		servicetest.Unavailable(t, "redis-server is not on PATH and REDIS_URL is not set")
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redistest: REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.FlushDB(ctx).Err(); err != nil {
		servicetest.Unavailable(t, "REDIS_URL %s: %v", url, err)
	}
	return &Server{URL: url, Addr: opt.Addr}
}

// Private tells whether the server is the test's own, so that its
// statistics (INFO) count the test's calls alone.
func (s *Server) Private() bool { return s.cmd != nil }

// Client returns a go-redis client for the server, closed when t ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(s.URL)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// Stop kills a private server at once, as a crash would. It is for failure
// tests; Restart brings the server back on the same port. Stop on a server
// from REDIS_URL fails the test.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if s.cmd == nil {
		t.Fatalf("redistest: cannot stop a shared REDIS_URL server")
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts a stopped private server again on its port, empty, in
// the directory of its first start (which lives as long as the test that
// started it).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	_, port, _ := splitAddr(s.Addr)
	// A snapshot a test saved would be loaded: the server starts empty.
	_ = os.Remove(filepath.Join(s.dir, "dump.rdb"))
	cmd, err := run(port, s.dir)
	if err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
	s.cmd = cmd
}

// RestartOnSnapshot starts a stopped private server again on its port,
// loading the last snapshot a test saved (SAVE) in its directory, as a
// Redis persisted by snapshots comes back after a crash: with the data
// of that snapshot, not the writes made since.
func (s *Server) RestartOnSnapshot(t testing.TB) {
	t.Helper()
	_, port, _ := splitAddr(s.Addr)
	cmd, err := run(port, s.dir)
	if err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
	s.cmd = cmd
}

func start(t testing.TB) *Server {
	t.Helper()
	var lastErr error
	for range 5 {
		port := servicetest.FreePort(t)
		dir := t.TempDir()
		cmd, err := run(port, dir)
		if err != nil {
			lastErr = err
			continue
		}
		s := &Server{
			URL:  fmt.Sprintf("redis://127.0.0.1:%d/0", port),
			Addr: fmt.Sprintf("127.0.0.1:%d", port),
			cmd:  cmd,
			dir:  dir,
		}
		t.Cleanup(func() {
			if s.cmd != nil {
				_ = s.cmd.Process.Kill()
				_ = s.cmd.Wait()
			}
		})
		return s
	}
	t.Fatalf("redistest: could not start redis-server: %v", lastErr)
	return nil
}

// run starts redis-server on port, in dir, and waits until it answers
// PING.
func run(port int, dir string) (*exec.Cmd, error) {
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		// DEBUG RELOAD lets a test load an older snapshot, as a failover
		// to a replica that lags would.
		"--enable-debug-command", "local",
		"--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
	)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	err := waitOwn(fmt.Sprintf("127.0.0.1:%d", port), cmd.Process.Pid)
	if err == nil {
		return cmd, nil
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	return nil, fmt.Errorf("redis-server on port %d: %v: %s", port, err, log)
}

func splitAddr(addr string) (string, int, error) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			p, err := strconv.Atoi(addr[i+1:])
			return addr[:i], p, err
		}
	}
	return addr, 0, fmt.Errorf("no port in %q", addr)
}
