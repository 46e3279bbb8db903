package gate

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Redis that restarts on a snapshot older than its last writes (RDB
// persistence after a crash, an append-only file synced once a second, a
// failover to a replica that lags) comes back with its counters rolled
// back and its generation markers with them: a marker older than one a
// replica has seen reads as stale to that replica, but a replica that
// never saw the tag's newer marker (one started since, or one that
// serves the tenant for the first time) cannot tell, and decides on the
// rolled-back counters. So the gate keeps the run_id of the Redis it last
// checked in Redis (bootKey), and when it finds another there (Redis
// restarted or failed over since, its data kept or rolled back; a Redis
// that comes back empty lost the key and the markers alike, which the
// markers tell), it deletes every generation marker:
// every tag is then stale to every replica, and restored from the ledger
// at its next call, as after a FLUSHALL. It checks when it opens, before
// it decides anything, and every bootEvery; a lossless restart costs one
// restore of each tenant. A Redis Cluster is not checked.

// bootKey holds the run_id of the limiter store's Redis as the gate last
// checked it.
const bootKey = "cg:boot"

// bootEvery is how often the gate checks the limiter store's run_id.
const bootEvery = time.Second

// checkBoot checks whether the limiter store's Redis restarted since a
// replica last checked, and if so forgets its generation markers (see
// above). Its error is Redis's; a store that cannot answer is checked
// again later.
func (g *Gate) checkBoot(ctx context.Context) error {
	c, ok := g.redis.(*redis.Client)
	if !ok {
		return nil
	}
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 5*time.Second) }
	cctx, cancel := call()
	info, err := c.Info(cctx, "server").Result()
	cancel()
	if err != nil {
		return err
	}
	id := infoField(info, "run_id")
	if id == "" {
		return nil
	}
	cctx, cancel = call()
	old, err := c.Get(cctx, bootKey).Result()
	cancel()
	if err != nil && err != redis.Nil {
		return err
	}
	if old != id && old != "" {
		g.log.Warn("the limiter store's Redis restarted or failed over (its data may be older than its last writes): every tenant is restored from the ledger at its next request",
			"run_id", id, "was", old)
		// The new run_id is written once every marker is gone: a scan
		// cut short (a timeout, a store that failed) is made again at
		// the next check, by this replica or another.
		var cursor uint64
		for {
			cctx, cancel = call()
			keys, next, err := c.Scan(cctx, cursor, g.markerMatch, 1000).Result()
			if err == nil && len(keys) > 0 {
				err = c.Unlink(cctx, keys...).Err()
			}
			cancel()
			if err != nil {
				return err
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	if old == id {
		// The same Redis.
		return nil
	}
	// None checked before (this version's first start), or Redis lost
	// the key with its data (a restart empty, a flush), and the markers
	// with it: nothing more to forget.
	cctx, cancel = call()
	defer cancel()
	return c.Set(cctx, bootKey, id, 0).Err()
}

// bootLoop runs checkBoot every bootEvery until ctx ends.
func (g *Gate) bootLoop(ctx context.Context) {
	t := time.NewTicker(bootEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := g.checkBoot(ctx); err != nil && ctx.Err() == nil {
			g.log.Debug("the limiter store's run_id could not be checked", "err", err)
		}
	}
}

// infoField returns field's value in the text of an INFO reply.
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
