package weighted

import (
	"cmp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// clock is a settable time shared by the stores of a test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

// start is a time far from any window boundary's special cases: a whole
// number of days since the Unix epoch.
var start = time.Unix(1_800_000_000-1_800_000_000%86400, 0)

func newClock() *clock { return &clock{t: start} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// namedStore is a store under test.
type namedStore struct {
	name string
	Store
}

var prefixSeq atomic.Int64

// testRedis starts a private Redis for t and returns a client with a pool
// large enough for the concurrency tests. Call it from the top-level test:
// the server stops when t ends.
func testRedis(t *testing.T) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(redistest.New(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	opt.PoolSize = 256
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// newRedisStore returns a Redis store on c under a fresh prefix, whose time
// is clk's (nil: the server's).
func newRedisStore(c Scripter, clk *clock) *Redis {
	r := NewRedis(c, patient(RedisConfig{Prefix: "t" + strconv.FormatInt(prefixSeq.Add(1), 10) + ":"}))
	if clk != nil {
		r.now = clk.Now
	}
	return r
}

// bothStores returns a Memory and a Redis store on c that share clk.
func bothStores(c *redis.Client, clk *clock) []namedStore {
	return []namedStore{
		{"memory", NewMemory(MemoryConfig{Now: clk.Now})},
		{"redis", newRedisStore(c, clk)},
	}
}

// patient gives cfg timeouts of a minute where it sets none, so that
// tests of decisions under a loaded machine (the race detector, other
// processes) never shed or give up on a request: the timeouts have tests
// of their own, on a clock of the test's.
func patient(cfg RedisConfig) RedisConfig {
	cfg.QueueTimeout = cmp.Or(cfg.QueueTimeout, time.Minute)
	cfg.CallTimeout = cmp.Or(cfg.CallTimeout, time.Minute)
	cfg.ReplyTimeout = cmp.Or(cfg.ReplyTimeout, time.Minute)
	return cfg
}
