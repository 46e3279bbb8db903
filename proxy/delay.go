package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// maxFrictionDelay bounds a policy's delay_ms.
const maxFrictionDelay = 30 * time.Second

// maxDelayedPerTenant bounds the requests of one tenant that wait out a
// policy's friction delay on one replica at once. A delayed request holds
// its goroutine, its connection and its reservation (every slot it took,
// of limits other tenants may share) until its delay ends; a tenant the
// policies slow down must not hold an unbounded number of them.
const maxDelayedPerTenant = 64

// errDelayBacklog is a delayed request of a tenant that has
// maxDelayedPerTenant requests in a delay already.
var errDelayBacklog = errors.New("too many requests of this tenant are waiting out a friction delay")

// delays counts each tenant's requests waiting out a friction delay. Its
// zero value counts none; it is safe for concurrent use.
type delays struct {
	mu sync.Mutex
	n  map[string]int // tenant -> requests in a delay; no zero entries
}

func (d *delays) acquire(tenant string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n[tenant] >= maxDelayedPerTenant {
		return false
	}
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[tenant]++
	return true
}

func (d *delays) release(tenant string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n[tenant]--; d.n[tenant] <= 0 {
		delete(d.n, tenant)
	}
}

// frictionDelay waits out a policy's delay of ms milliseconds (at most
// maxFrictionDelay) for a request of tenant. It returns errDelayBacklog at
// once when tenant has maxDelayedPerTenant requests in a delay already,
// and ctx's error when ctx ends first.
func (s *Server) frictionDelay(ctx context.Context, tenant string, ms int64) error {
	if !s.delays.acquire(tenant) {
		return errDelayBacklog
	}
	defer s.delays.release(tenant)
	t := time.NewTimer(frictionDuration(ms))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func frictionDuration(ms int64) time.Duration {
	return time.Duration(min(ms, maxFrictionDelay.Milliseconds())) * time.Millisecond
}

// writeDelayBacklog refuses a delayed request past its tenant's bound:
// 429, to come back once the delay it was given has passed.
func writeDelayBacklog(w http.ResponseWriter, path string, ms int64) {
	secs := int64((frictionDuration(ms) + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	writeError(w, path, http.StatusTooManyRequests, apiError{
		Type: "rate_limit_exceeded", Code: "friction_delay_backlog",
		Message:      errDelayBacklog.Error() + ": retry after the delay",
		RetryAfterMS: secs * 1000,
	})
}
