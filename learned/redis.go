package learned

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/costmodel/sketch"
)

// Redis is what a Table needs of a Redis client (a single node's or a
// Cluster's): pipelines, and SCAN to find the keys at Open.
type Redis interface {
	Pipeline() redis.Pipeliner
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// masters is a Redis Cluster client, whose keys are scanned node by node.
type masters interface {
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, c *redis.Client) error) error
}

// field is a bucket's field in a key's hash.
func field(i int) string {
	if i == sketch.ZeroBucket {
		return "z"
	}
	return strconv.Itoa(i)
}

// parseField is the bucket of a field, or an error.
func parseField(f string) (int, error) {
	if f == "z" {
		return sketch.ZeroBucket, nil
	}
	i, err := strconv.Atoi(f)
	if err != nil || i < 0 || i > sketch.MaxIndex || strconv.Itoa(i) != f {
		return 0, fmt.Errorf("field %q is not a bucket (z or 0..%d)", f, sketch.MaxIndex)
	}
	return i, nil
}

// parseHash is the sketch a key's hash holds; buckets that do not parse
// are left out and logged.
func (t *Table) parseHash(name string, h map[string]string) *sketch.Sketch {
	s := &sketch.Sketch{}
	for f, v := range h {
		i, err := parseField(f)
		if err == nil {
			var n int64
			n, err = strconv.ParseInt(v, 10, 64)
			if err == nil && n < 0 {
				err = fmt.Errorf("count %d is negative", n)
			}
			if err == nil {
				err = s.AddBucket(i, uint64(n))
			}
		}
		if err != nil {
			t.badData("learned: Redis key %s: %v; left out", name, err)
		}
	}
	return s
}

// syncRedis adds the pending observations to Redis, then reads back the
// keys used since the last sync.
func (t *Table) syncRedis(ctx context.Context) error {
	type flush struct {
		e *entry
		s *sketch.Sketch
	}
	var flushes []flush
	var reads []Key
	cur := t.gen.Add(1) - 1
	p := t.cfg.Redis.Pipeline()
	t.each(func(k Key, e *entry) {
		e.mu.Lock()
		if e.pending.Count() > 0 {
			s := e.pending.Clone()
			e.pending.Reset()
			e.mu.Unlock()
			name := k.encode()
			s.Each(func(i int, n uint64) { p.HIncrBy(ctx, name, field(i), int64(min(n, math.MaxInt64))) })
			p.Expire(ctx, name, t.cfg.TTL)
			flushes = append(flushes, flush{e, s})
		} else {
			e.mu.Unlock()
		}
		if s := e.seen.Load(); s+1 >= cur {
			reads = append(reads, k)
		}
	})
	if len(flushes) > 0 {
		cmds, err := p.Exec(ctx)
		if err != nil && !replyErrors(cmds) {
			// Not added: they go with the next sync. (A reply lost after
			// Redis applied them counts them twice, which only widens
			// the sketch a little.)
			for _, f := range flushes {
				f.e.mu.Lock()
				f.e.pending.Merge(f.s)
				f.e.mu.Unlock()
			}
			return fmt.Errorf("learned: add observations to Redis: %w", err)
		}
		for _, c := range cmds {
			if c.Err() != nil {
				// Redis refused it (the key is not a hash of counts):
				// that bucket's observations are dropped.
				t.badData("learned: Redis refused %v: %v", c.Args(), c.Err())
			}
		}
	}
	return t.read(ctx, reads)
}

// read replaces the sketches of keys with what Redis holds.
func (t *Table) read(ctx context.Context, keys []Key) error {
	const batch = 256
	for len(keys) > 0 {
		n := min(len(keys), batch)
		p := t.cfg.Redis.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, n)
		for i, k := range keys[:n] {
			cmds[i] = p.HGetAll(ctx, k.encode())
		}
		if _, err := p.Exec(ctx); err != nil && !replyErrors(cmdsOf(cmds)) {
			return fmt.Errorf("learned: read estimates from Redis: %w", err)
		}
		for i, k := range keys[:n] {
			if err := cmds[i].Err(); err != nil {
				t.badData("learned: Redis key %s: %v; left out", k.encode(), err)
				continue
			}
			t.set(k, t.parseHash(k.encode(), cmds[i].Val()))
		}
		keys = keys[n:]
	}
	return nil
}

// loadRedis reads every learned key in Redis, up to MaxKeys.
func (t *Table) loadRedis(ctx context.Context) error {
	var (
		mu   sync.Mutex // a Cluster's nodes are scanned at once
		keys []Key
	)
	scan := func(ctx context.Context, c Redis) error {
		var cursor uint64
		for {
			names, next, err := c.Scan(ctx, cursor, redisPrefix+"*", 1000).Result()
			if err != nil {
				return err
			}
			for _, name := range names {
				k, err := decodeKey(name)
				if err != nil {
					t.badData("%v; left out", err)
					continue
				}
				mu.Lock()
				if len(keys) < t.cfg.MaxKeys {
					keys = append(keys, k)
				}
				mu.Unlock()
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	if m, ok := t.cfg.Redis.(masters); ok {
		err = m.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, t.cfg.Redis)
	}
	if err != nil {
		return err
	}
	return t.read(ctx, keys)
}

// replyErrors tells whether every failed command of a pipeline failed with
// Redis's own error reply (a command Redis refused), not for want of an
// answer.
func replyErrors(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			var reply redis.Error
			if !errors.As(err, &reply) {
				return false
			}
		}
	}
	return len(cmds) > 0
}

func cmdsOf(cmds []*redis.MapStringStringCmd) []redis.Cmder {
	out := make([]redis.Cmder, len(cmds))
	for i, c := range cmds {
		out[i] = c
	}
	return out
}
