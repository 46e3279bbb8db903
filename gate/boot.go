package gate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
// restore of each tenant. A Redis Cluster's primaries are checked each
// on its own: each keeps its run_id in a key of a slot it serves
// (nodeBootKey), so that a primary rolled back rolls that key back too,
// and only its own markers are deleted.

// bootKey holds the run_id of the limiter store's Redis as the gate last
// checked it.
const bootKey = "cg:boot"

// bootEvery is how often the gate checks the limiter store's run_id.
const bootEvery = time.Second

// checkBoot checks whether the limiter store's Redis, or a primary of its
// Redis Cluster, restarted since a replica last checked, and if so
// forgets its generation markers (see above). Its error is Redis's; a
// store that cannot answer is checked again later.
func (g *Gate) checkBoot(ctx context.Context) error {
	switch c := g.redis.(type) {
	case *redis.Client:
		return g.checkNode(ctx, c, bootKey)
	case *redis.ClusterClient:
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		slots, err := c.ClusterSlots(cctx).Result()
		cancel()
		if err != nil {
			return err
		}
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			key, ok := nodeBootKey(slots, n.Options().Addr, "")
			if !ok {
				// Known to the client by another address than the
				// cluster's own (a remapped one): found by its id.
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				id, err := n.Do(cctx, "CLUSTER", "MYID").Text()
				cancel()
				if err != nil {
					return err
				}
				if key, ok = nodeBootKey(slots, "", id); !ok {
					return nil // a primary that serves no slot holds no marker
				}
			}
			return g.checkNode(ctx, n, key)
		})
	}
	return nil
}

// nodeBootKey is the key in which the Cluster primary at addr, or of id,
// keeps its run_id: bootKey with a hash tag of the first slot it serves,
// as slots say; ok is false when it serves none.
func nodeBootKey(slots []redis.ClusterSlot, addr, id string) (key string, ok bool) {
	for _, s := range slots {
		if len(s.Nodes) > 0 && (addr != "" && s.Nodes[0].Addr == addr || id != "" && s.Nodes[0].ID == id) {
			return bootKey + ":{" + slotTag(s.Start) + "}", true
		}
	}
	return "", false
}

// slotTag returns a hash tag whose keys are in Redis Cluster slot slot
// (0 to 16383): the first "b" and a decimal number that CRC16 puts there.
func slotTag(slot int) string {
	for i := 0; ; i++ {
		t := "b" + strconv.Itoa(i)
		if int(crc16([]byte(t))%16384) == slot {
			return t
		}
	}
}

// crc16 is CRC-16/XMODEM, the checksum of Redis Cluster's key slots.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// checkNode checks one Redis, which keeps its run_id in key: when it
// finds another there, it deletes the node's generation markers, then
// writes its run_id.
func (g *Gate) checkNode(ctx context.Context, c *redis.Client, key string) error {
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
	old, err := c.Get(cctx, key).Result()
	cancel()
	if err != nil && err != redis.Nil {
		return err
	}
	if old == id {
		return nil // the same Redis
	}
	if old != "" {
		// The new run_id is written once every marker is gone: a scan
		// cut short (a timeout, a store that failed) is made again at
		// the next check, by this replica or another. Each marker is
		// deleted on its own: a Cluster's are in many slots.
		var cursor uint64
		deleted := 0
		for {
			cctx, cancel = call()
			keys, next, err := c.Scan(cctx, cursor, g.markerMatch, 1000).Result()
			if err == nil && len(keys) > 0 {
				_, err = c.Pipelined(cctx, func(p redis.Pipeliner) error {
					for _, k := range keys {
						p.Unlink(cctx, k)
					}
					return nil
				})
			}
			cancel()
			if err != nil {
				return fmt.Errorf("%w: the markers of a Redis that restarted (run_id %s, was %s) are not all deleted; its counters may be rolled back: %w",
					errBootUnchecked, id, old, err)
			}
			deleted += len(keys)
			if cursor = next; cursor == 0 {
				break
			}
		}
		g.log.Warn("the limiter store's Redis restarted or failed over (its data may be older than its last writes): every tenant is restored from the ledger at its next request",
			"addr", c.Options().Addr, "run_id", id, "was", old, "markers_deleted", deleted)
	}
	// old is "" for a Redis none checked before (this version's first
	// start), or one that lost the key with its data (a restart empty, a
	// flush), and the markers with it: nothing more to forget.
	cctx, cancel = call()
	defer cancel()
	return c.Set(cctx, key, id, 0).Err()
}

// errBootUnchecked is checkNode's error when it found a Redis that
// restarted and could not delete all its generation markers.
var errBootUnchecked = errors.New("gate: a restarted Redis is not checked")

// bootLoop runs checkBoot every bootEvery until ctx ends. A check that
// found a restart and could not finish is a warning, at most once a
// minute (a Redis that refuses SCAN fails each one); another failure, a
// store that does not answer, is the breaker's to tell.
func (g *Gate) bootLoop(ctx context.Context) {
	t := time.NewTicker(bootEvery)
	defer t.Stop()
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := g.checkBoot(ctx)
		switch {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, errBootUnchecked) && time.Since(warned) >= time.Minute:
			warned = time.Now()
			g.log.Warn("the limiter store's run_id check", "err", err)
		default:
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
