package redistest

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Monitor records the commands a Redis receives from its clients (Redis's
// MONITOR), not those its scripts run, from its start until the test
// ends.
type Monitor struct {
	mu    sync.Mutex
	lines []string
}

// NewMonitor starts monitoring the Redis at addr (host:port) for t; it
// returns once Redis has acknowledged, so that every later command is
// seen.
func NewMonitor(t testing.TB, addr string) *Monitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("redistest: monitor %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatalf("redistest: monitor %s: %v", addr, err)
	}
	if ok, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(ok, "+OK") {
		t.Fatalf("redistest: monitor %s: %q %v", addr, ok, err)
	}
	conn.SetDeadline(time.Time{})
	m := &Monitor{}
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if strings.Contains(line, " lua] ") {
				continue // run by a script
			}
			m.mu.Lock()
			m.lines = append(m.lines, strings.TrimSpace(line))
			m.mu.Unlock()
		}
	}()
	return m
}

// Count returns how many commands seen so far, each as MONITOR prints it
// (`"set" "key" "value" "px" "600000" "nx"`), contain every one of parts.
func (m *Monitor) Count(parts ...string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, l := range m.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			n++
		}
	}
	return n
}

var markers atomic.Int64

// CaughtUp returns once m has seen every command the Redis at addr
// received before the call: it sends a marker there and waits for it.
func (m *Monitor) CaughtUp(t testing.TB, addr string) {
	t.Helper()
	marker := "redistest-marker-" + strconv.FormatInt(markers.Add(1), 10)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Echo(ctx, marker).Err(); err != nil {
		t.Fatalf("redistest: monitor marker: %v", err)
	}
	for m.Count(marker) == 0 {
		if ctx.Err() != nil {
			t.Fatalf("redistest: the monitor never saw its marker")
		}
		time.Sleep(time.Millisecond)
	}
}
