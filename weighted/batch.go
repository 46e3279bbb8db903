package weighted

// Opportunistic batching: the script calls of concurrent requests share one
// EVALSHA. Each queue (the store's one, or a hash tag's on a sharded store)
// lets maxInFlight script calls run at a time. A request that finds room is
// sent at once, alone: nothing waits for company, so an idle store adds no
// latency. Otherwise it queues; when a script call of its queue returns, the
// caller that sent it hands up to MaxBatch queued requests, as one batch, to
// one of their callers, which sends it and hands on the next. No goroutine
// runs but the callers', except when a caller chosen to send a batch has
// given up: a goroutine then sends the batch for the others.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// DefaultMaxBatch is the most requests one script call carries when
// RedisConfig.MaxBatch is zero.
const DefaultMaxBatch = 64

// defaultMaxInFlight is how many script calls of one queue run at a time
// while others wait to be batched. One keeps Redis, which runs one script
// at a time anyway, busy with one batch while the next gathers (see
// BenchmarkRedisBatch).
const defaultMaxInFlight = 1

// callState is where a call is in its queue.
type callState uint8

const (
	queued    callState = iota // waiting in its queue's pending list
	sent                       // in a batch whose script call runs
	leading                    // handed a batch (its own) to send
	done                       // reply or err set
	abandoned                  // its caller left while it was sent; the batch's sender frees it
)

// A call is the script call of one request: a Debit, Peek, Settle or Cancel
// of one group of items. Calls are pooled.
type call struct {
	ctx  context.Context
	keys []string
	buf  []byte // header and items, as batch.lua reads them
	id   string
	q    *queue

	// Guarded by Redis.mu until the call is done.
	state callState
	batch *batch // the batch to send, when leading
	reply any
	err   error
	// wake is signalled, once, when the call becomes leading or done.
	wake chan struct{}
}

// A queue holds the calls that wait for a script call of theirs to run.
// Guarded by Redis.mu.
type queue struct {
	tag      string
	inflight int
	// pending is in order of arrival. It is empty unless inflight is at the
	// limit: a returning script call hands pending calls on at once.
	pending []*call
}

// A batch is the calls of one script call, and its arguments.
type batch struct {
	q     *queue
	calls []*call
	keys  []string
	args  []any
	buf   []byte
}

var (
	callPool  = sync.Pool{New: func() any { return &call{wake: make(chan struct{}, 1)} }}
	batchPool = sync.Pool{New: func() any { return new(batch) }}
)

func getCall(ctx context.Context) *call {
	c := callPool.Get().(*call)
	c.ctx = ctx
	return c
}

func putCall(c *call) {
	c.ctx, c.keys, c.id, c.q, c.batch, c.reply, c.err = nil, nil, "", nil, nil, nil, nil
	c.state = queued
	if cap(c.buf) <= 4096 {
		c.buf = c.buf[:0]
	} else {
		c.buf = nil
	}
	callPool.Put(c)
}

func putBatch(b *batch) {
	clear(b.calls)
	clear(b.keys)
	clear(b.args)
	b.q, b.calls, b.keys, b.args = nil, b.calls[:0], b.keys[:0], b.args[:0]
	if cap(b.buf) <= 64<<10 {
		b.buf = b.buf[:0]
	} else {
		b.buf = nil
	}
	batchPool.Put(b)
}

// exec runs c, whose keys share hash tag tag, in a batch of its queue's,
// and returns its reply. It frees c. A caller whose ctx is done while its
// call waits or runs in another caller's batch returns ctx's error at once;
// its request may still run.
func (r *Redis) exec(c *call, tag string) (any, error) {
	if r.maxBatch == 1 {
		reply, err := r.runOne(c.ctx, c.keys, c.buf, c.id)
		putCall(c)
		return reply, err
	}
	r.mu.Lock()
	q := r.queueOf(tag)
	c.q = q
	if q.inflight < r.maxInFlight {
		// pending is empty: send c alone, now.
		q.inflight++
		b := batchPool.Get().(*batch)
		b.q = q
		b.calls = append(b.calls, c)
		c.state = leading
		r.mu.Unlock()
		return r.lead(c, b)
	}
	q.pending = append(q.pending, c)
	r.mu.Unlock()

	select {
	case <-c.wake:
	case <-c.ctx.Done():
		err := fmt.Errorf("weighted: run script: %w", c.ctx.Err())
		r.mu.Lock()
		switch c.state {
		case queued:
			i := slices.Index(q.pending, c)
			q.pending = slices.Delete(q.pending, i, i+1)
			r.mu.Unlock()
			putCall(c)
			return nil, err
		case sent:
			c.state = abandoned
			r.mu.Unlock()
			return nil, err
		case leading:
			// Send the batch for the others, without waiting for it.
			c.state = abandoned
			b := c.batch
			r.mu.Unlock()
			<-c.wake
			go r.send(b, nil)
			return nil, err
		}
		r.mu.Unlock() // done: the reply is there
		<-c.wake
	}
	if c.state == leading {
		return r.lead(c, c.batch)
	}
	reply, err := c.reply, c.err
	putCall(c)
	return reply, err
}

// lead sends b, which holds c, and returns c's reply. It frees c.
func (r *Redis) lead(c *call, b *batch) (any, error) {
	r.send(b, c)
	reply, err := c.reply, c.err
	putCall(c)
	return reply, err
}

// runOne runs one request in a script call of its own.
func (r *Redis) runOne(ctx context.Context, keys []string, buf []byte, id string) (any, error) {
	return r.run(ctx, batchScript, keys, buf, id)
}

// splitReply checks that v, the reply of a batch of n > 1 requests, holds
// n replies. (A batch of one request replies as the request.)
func splitReply(v any, n int) ([]any, error) {
	replies, ok := v.([]any)
	if !ok || len(replies) != n {
		return nil, fmt.Errorf("%w: script returned %T of %d replies, want %d", errBadReply, v, len(replies), n)
	}
	return replies, nil
}

// queueOf returns the queue of tag (the store's one queue when it is not
// sharded). r.mu is held.
func (r *Redis) queueOf(tag string) *queue {
	if !r.sharded {
		return &r.queue
	}
	q := r.queues[tag]
	if q == nil {
		if n := len(r.freeQueues); n > 0 {
			q, r.freeQueues = r.freeQueues[n-1], r.freeQueues[:n-1]
		} else {
			q = new(queue)
		}
		q.tag = tag
		if r.queues == nil {
			r.queues = map[string]*queue{}
		}
		r.queues[tag] = q
	}
	return q
}

// send runs batch b and hands each call its reply; leader is the call
// whose caller sends it (nil for none), which is not woken. Then it hands
// the next batch of b's queue to one of its callers. It frees b, and the
// calls whose callers left.
func (r *Redis) send(b *batch, leader *call) {
	var ctx context.Context
	if len(b.calls) == 1 {
		c := b.calls[0]
		ctx = c.ctx
		b.keys = c.keys
		b.args = append(b.args, c.buf, c.id)
	} else {
		var cancel context.CancelFunc
		ctx, cancel = batchContext(b.calls)
		defer cancel()
		b.args = append(b.args, nil)
		for _, c := range b.calls {
			b.keys = append(b.keys, c.keys...)
			b.buf = append(b.buf, c.buf...)
			b.args = append(b.args, c.id)
		}
		b.args[0] = b.buf
	}
	v, err := r.run(ctx, batchScript, b.keys, b.args...)
	var replies []any
	if err == nil && len(b.calls) > 1 {
		replies, err = splitReply(v, len(b.calls))
	}

	r.mu.Lock()
	var free []*call
	for i, c := range b.calls {
		switch {
		case err != nil:
			c.err = err
		case replies == nil:
			c.reply = v
		default:
			c.reply = replies[i]
		}
		switch {
		case c == leader:
			c.state = done
		case c.state == abandoned:
			free = append(free, c)
		default:
			c.state = done
			c.wake <- struct{}{}
		}
	}
	q := b.q
	if len(q.pending) > 0 {
		r.handOn(q)
	} else {
		q.inflight--
		if r.sharded && q.inflight == 0 {
			delete(r.queues, q.tag)
			q.tag = ""
			r.freeQueues = append(r.freeQueues, q)
		}
	}
	r.mu.Unlock()
	for _, c := range free {
		putCall(c)
	}
	if len(b.calls) == 1 {
		b.keys = nil // c's, not the batch's
	}
	putBatch(b)
}

// handOn makes the first MaxBatch pending calls of q a batch and wakes the
// caller of the one with the latest deadline (or none) to send it, so that
// the caller that waits for the batch's script call is the one that would
// wait longest anyway. r.mu is held.
func (r *Redis) handOn(q *queue) {
	n := min(len(q.pending), r.maxBatch)
	b := batchPool.Get().(*batch)
	b.q = q
	b.calls = append(b.calls, q.pending[:n]...)
	rest := copy(q.pending, q.pending[n:])
	clear(q.pending[rest:])
	q.pending = q.pending[:rest]
	lead := b.calls[0]
	latest, bounded := lead.ctx.Deadline()
	for _, c := range b.calls {
		c.state = sent
		if !bounded {
			continue
		}
		if d, ok := c.ctx.Deadline(); !ok || d.After(latest) {
			lead, latest, bounded = c, d, ok
		}
	}
	lead.state = leading
	lead.batch = b
	lead.wake <- struct{}{}
}

// batchContext returns the context of a batch's script call: no caller's
// cancellation ends it, and its deadline is the latest of the callers'
// deadlines, or none when one of them has none. It keeps the values of
// the first call's context.
func batchContext(calls []*call) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithoutCancel(calls[0].ctx), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(calls[0].ctx), latest)
}
