package weighted

// Opportunistic batching: the script calls of concurrent requests share one
// EVALSHA. Each queue (the store's one, or a hash tag's on a sharded store)
// lets maxInFlight script calls run at a time. A request that finds room is
// sent at once, alone: nothing waits for company, so an idle store adds no
// latency. Otherwise it queues; when a script call of its queue returns, up
// to MaxBatch queued requests go in the next one. Each script call runs in
// a goroutine of the store's, which ends with it (after ReplyTimeout at
// most), so that a caller waits for its request with two bounds of its
// own: QueueTimeout while it is queued (ErrOverloaded: nothing was sent)
// and CallTimeout once it is sent (ErrUnknownOutcome). A debit whose
// caller left while it was sent is cancelled by the store when its late
// reply says it was admitted.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultMaxBatch is the most requests one script call carries when
// RedisConfig.MaxBatch is zero.
const DefaultMaxBatch = 64

// defaultMaxInFlight is how many script calls of one queue run at a time
// while others wait to be batched. One keeps Redis, which runs one script
// at a time anyway, busy with one batch while the next gathers (see
// BenchmarkRedisBatch). Without batching (MaxBatch 1) there is no bound.
const defaultMaxInFlight = 1

// The defaults of RedisConfig's timeouts.
const (
	DefaultQueueTimeout = 50 * time.Millisecond
	DefaultCallTimeout  = 100 * time.Millisecond
	DefaultReplyTimeout = 5 * time.Second
)

// callState is where a call is in its queue.
type callState uint8

const (
	queued    callState = iota // waiting in its queue's pending list
	sent                       // in a batch whose script call runs
	done                       // reply or err set, and wake signalled
	abandoned                  // its caller left while it was sent; the batch's sender frees it
)

// A call is the script call of one request: a Debit, Peek, Settle, Cancel,
// Renew or Restore of one group of items. Calls are pooled.
type call struct {
	ctx  context.Context
	keys []string
	buf  []byte // header and items, as batch.lua reads them
	id   string
	tag  string // the hash tag of its keys
	// tags are whose request it is, for a queue's bound per tag (see
	// queuedPerTag): its items' own hash tags (a tenant's, a global
	// limit's), else its keys' one; empty for a cancel of a debit whose
	// caller left.
	tags []string
	// shed: the call is a debit or peek, which the bound sheds; the
	// others (settlements, renewals, restores) are never shed, only
	// ordered (see nextBatch).
	shed bool
	// round orders the call in its queue (see queue.arrive).
	round int
	q     *queue
	b     *batch // its batch, once sent

	// Guarded by Redis.mu until the call is done.
	state  callState
	sentAt time.Time // when its batch was sent, if it was queued first
	reply  any
	err    error
	// wake is signalled, once, when the call is done.
	wake  chan struct{}
	timer *time.Timer
}

// A queue holds the calls that wait for a script call of theirs to run.
// Guarded by Redis.mu.
type queue struct {
	tag      string
	inflight int
	// pending is in order of arrival. It is empty unless inflight is at the
	// limit: a returning script call hands pending calls on at once.
	pending []*call
	// waiting counts the calls in pending by each of their tags (see
	// call.tags); a tag with none has no entry.
	waiting map[string]int
	// round is the round of the calls sent last, and rounds where each
	// tag with calls in pending puts its next one (see arrive).
	round  int
	rounds map[string]tagRound
}

// queuedPerTag is how many script calls' worth (MaxBatch each) of calls
// of one hash tag may wait in a queue ahead of another tag's: a debit or
// peek each of whose tags has that many waiting is shed at once
// (ErrCrowded, ErrOverloaded), and a call that is never shed (a
// settlement, a renewal, a restore) past them waits for a later script
// call than the other tags' calls (see nextBatch). On a store that is not
// sharded every tenant's requests share one queue: one tenant that kept
// thousands waiting put each other tenant's request behind them all,
// past QueueTimeout (debits: TestBatchFaultAtkOneTenantFloodsTheQueue;
// 400 settlements, 100 script calls: TestBatchFaultAtkOneTenantFloodsWithSettlements).
// A tenant's requests carry its tag, so another tenant's request waits
// behind at most this many script calls of one tenant's, even when both
// share a global limit's tag.
const queuedPerTag = 16

// A batch is the calls of one script call, and its arguments.
type batch struct {
	q *queue
	// detached: a call of the batch got no reply within CallTimeout, and
	// the batch gave its place in q back (see detach).
	detached bool
	calls    []*call
	keys     []string
	args     []any
	buf      []byte
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
	c.ctx, c.keys, c.id, c.tag, c.q, c.b, c.reply, c.err = nil, nil, "", "", nil, nil, nil, nil
	clear(c.tags)
	c.tags = c.tags[:0]
	c.state, c.sentAt, c.shed, c.round = queued, time.Time{}, false, 0
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
	b.q, b.detached, b.calls, b.keys, b.args = nil, false, b.calls[:0], b.keys[:0], b.args[:0]
	if cap(b.buf) <= 64<<10 {
		b.buf = b.buf[:0]
	} else {
		b.buf = nil
	}
	batchPool.Put(b)
}

// RedisStats counts what happened to the requests of a Redis store whose
// callers did not get a decision from it. Each count only grows.
type RedisStats struct {
	// Overloaded counts requests that waited QueueTimeout in their queue
	// and were not sent (ErrOverloaded).
	Overloaded int64
	// UnknownOutcomes counts requests sent whose callers left without a
	// reply (ErrUnknownOutcome): CallTimeout passed, or their context
	// ended.
	UnknownOutcomes int64
	// LateCancels counts the debits among those whose late reply said
	// they were admitted, and which the store then cancelled.
	LateCancels int64
	// LateLost counts the requests among those that never got a reply
	// (ReplyTimeout, or a transport error): a debit among them, if it ran,
	// holds its reservation until its limits refill and its concurrency
	// leases expire (a Period).
	LateLost int64
}

// redisStats are the counters of RedisStats.
type redisStats struct {
	overloaded, unknown, lateCancels, lateLost atomic.Int64
}

// Stats returns the store's counts of requests without a decision.
func (r *Redis) Stats() RedisStats {
	return RedisStats{
		Overloaded:      r.stats.overloaded.Load(),
		UnknownOutcomes: r.stats.unknown.Load(),
		LateCancels:     r.stats.lateCancels.Load(),
		LateLost:        r.stats.lateLost.Load(),
	}
}

// exec runs c, whose keys share hash tag tag, in a batch of its queue's,
// and returns its reply. It frees c. A caller waits at most QueueTimeout
// for its call to be sent and CallTimeout for its reply, and no longer
// than its ctx; see wait.
func (r *Redis) exec(c *call, tag string) (any, error) {
	return r.execOn(c, tag, false)
}

// execSettle is exec for a settlement: with RedisConfig.ContextDeadlines,
// one that finds its queue idle runs on the caller's goroutine (see
// sendInline), and its caller then waits up to CallTimeout for its reply
// even when its ctx ends first: a settlement is carried out whatever its
// caller does (the gate's callers pass contexts without cancel anyway).
func (r *Redis) execSettle(c *call, tag string) (any, error) {
	return r.execOn(c, tag, r.inline)
}

func (r *Redis) execOn(c *call, tag string, inline bool) (any, error) {
	r.mu.Lock()
	q := r.queueOf(tag)
	c.q, c.tag = q, tag
	if q.inflight < r.maxInFlight {
		// pending is empty: send c alone, now.
		q.inflight++
		b := batchPool.Get().(*batch)
		b.q = q
		b.calls = append(b.calls, c)
		c.state, c.b = sent, b
		r.mu.Unlock()
		if inline {
			return r.sendInline(b, c)
		}
		go r.send(b)
		return r.wait(c, false)
	}
	if len(c.tags) > 0 {
		if c.shed && q.crowded(c.tags, queuedPerTag*r.maxBatch) {
			r.mu.Unlock()
			putCall(c)
			r.stats.overloaded.Add(1)
			return nil, fmt.Errorf("weighted: run script: %d requests of each of its hash tags wait already: %w (%w)", queuedPerTag*r.maxBatch, ErrCrowded, ErrOverloaded)
		}
		if q.waiting == nil {
			q.waiting = map[string]int{}
		}
		for _, t := range c.tags {
			q.waiting[t]++
		}
	}
	c.round = q.arrive(c.tags, queuedPerTag*r.maxBatch)
	q.pending = append(q.pending, c)
	r.mu.Unlock()
	return r.wait(c, true)
}

// crowded tells whether each of tags has at least n calls waiting in q.
// r.mu is held.
func (q *queue) crowded(tags []string, n int) bool {
	for _, t := range tags {
		if q.waiting[t] < n {
			return false
		}
	}
	return true
}

// unwait counts c, which leaves q's pending calls, out of q.waiting. r.mu
// is held.
func (q *queue) unwait(c *call) {
	for _, t := range c.tags {
		if n := q.waiting[t] - 1; n > 0 {
			q.waiting[t] = n
		} else {
			delete(q.waiting, t)
			delete(q.rounds, t)
		}
	}
}

// sendInline runs b, of c alone, on the caller's goroutine, within
// CallTimeout (the client ends the call at its context's deadline), and
// returns c's reply: a call without a reply by then is an
// ErrUnknownOutcome, as one abandoned by its caller. It frees c.
func (r *Redis) sendInline(b *batch, c *call) (any, error) {
	if next := r.sendWithin(b, r.callTimeout); next != nil {
		go r.send(next) // others' calls: not on this caller's goroutine
	}
	<-c.wake // done: send signalled it
	reply, err := c.reply, c.err
	putCall(c)
	if err != nil && isTimeout(err) {
		r.stats.unknown.Add(1)
		return nil, fmt.Errorf("weighted: run script: no reply within %s: %w (%w)", r.callTimeout, ErrUnknownOutcome, errCallTimeout)
	}
	return reply, err
}

// isTimeout tells whether err is a call's deadline passing: the context's
// (context.DeadlineExceeded) or the connection's that the client set from
// it (os.ErrDeadlineExceeded); both are net.Errors that say Timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// wait waits for c's reply and frees c. A call still queued after
// QueueTimeout leaves its queue (ErrOverloaded); one sent that has no
// reply CallTimeout after it was sent is abandoned to its batch's sender
// (ErrUnknownOutcome); and so is one whose caller's ctx ends, with ctx's
// error.
func (r *Redis) wait(c *call, isQueued bool) (any, error) {
	d := r.callTimeout
	if isQueued {
		d = r.queueTimeout
	}
	expired := r.after(c, d)
	for {
		select {
		case <-c.wake:
			return r.finish(c)
		case <-c.ctx.Done():
			err := c.ctx.Err()
			r.mu.Lock()
			switch c.state {
			case queued:
				r.unqueue(c)
				r.mu.Unlock()
				r.stopTimer(c)
				putCall(c)
				if err == context.DeadlineExceeded {
					r.stats.overloaded.Add(1)
					return nil, fmt.Errorf("weighted: run script: %w: %w", ErrOverloaded, err)
				}
				return nil, fmt.Errorf("weighted: run script: %w", err)
			case sent:
				c.state = abandoned
				r.mu.Unlock()
				r.stopTimer(c)
				r.stats.unknown.Add(1)
				return nil, fmt.Errorf("weighted: run script: %w: %w", ErrUnknownOutcome, err)
			}
			r.mu.Unlock() // done: the reply is there
			<-c.wake
			return r.finish(c)
		case <-expired:
			r.mu.Lock()
			switch c.state {
			case queued:
				r.unqueue(c)
				r.mu.Unlock()
				putCall(c)
				r.stats.overloaded.Add(1)
				return nil, fmt.Errorf("weighted: run script: not sent within %s: %w", r.queueTimeout, ErrOverloaded)
			case sent:
				if isQueued {
					// Sent after it queued: its reply has CallTimeout from then.
					isQueued = false
					left := r.callTimeout - time.Since(c.sentAt)
					r.mu.Unlock()
					expired = r.after(c, max(left, 0))
					continue
				}
				c.state = abandoned
				r.detach(c.b)
				r.mu.Unlock()
				r.stopTimer(c)
				r.stats.unknown.Add(1)
				return nil, fmt.Errorf("weighted: run script: no reply within %s: %w (%w)", r.callTimeout, ErrUnknownOutcome, errCallTimeout)
			}
			r.mu.Unlock()
			<-c.wake
			return r.finish(c)
		}
	}
}

// finish returns the reply of c, which is done, and frees it.
func (r *Redis) finish(c *call) (any, error) {
	r.stopTimer(c)
	reply, err := c.reply, c.err
	putCall(c)
	return reply, err
}

// after returns a channel that receives once d has passed: c's timer, or
// the test's clock (Redis.afterFunc).
func (r *Redis) after(c *call, d time.Duration) <-chan time.Time {
	if r.afterFunc != nil {
		return r.afterFunc(d)
	}
	if c.timer == nil {
		c.timer = time.NewTimer(d)
	} else {
		c.timer.Reset(d)
	}
	return c.timer.C
}

func (r *Redis) stopTimer(c *call) {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// unqueue removes c, queued, from its queue. r.mu is held.
func (r *Redis) unqueue(c *call) {
	q := c.q
	i := slices.Index(q.pending, c)
	q.pending = slices.Delete(q.pending, i, i+1)
	q.unwait(c)
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

// send runs batch b and hands each call its reply. Then it runs the next
// batch of b's queue, if calls wait, and so on: one goroutine carries a
// queue's batches while calls keep coming. A call abandoned by its caller
// is freed, after its debit is cancelled if the reply says it was
// admitted. It frees b. Each script call's context keeps the values of
// its first call's and ends after ReplyTimeout, whatever the callers'
// contexts do.
func (r *Redis) send(b *batch) {
	for b != nil {
		b = r.sendWithin(b, r.replyTimeout)
	}
}

// sendWithin runs b as send does, the script call ending after d, and
// returns the next batch of b's queue, taken from the calls that wait (see
// nextBatch), for its caller to run; nil when none waits.
func (r *Redis) sendWithin(b *batch, d time.Duration) *batch {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.calls[0].ctx), d)
	defer cancel()
	if len(b.calls) == 1 {
		c := b.calls[0]
		b.keys = c.keys
		b.args = append(b.args, c.buf, c.id)
	} else {
		b.args = append(b.args, nil)
		for _, c := range b.calls {
			b.keys = append(b.keys, c.keys...)
			b.buf = append(b.buf, c.buf...)
			b.args = append(b.args, c.id)
		}
		b.args[0] = b.buf
	}
	v, err := r.run(ctx, batchScript, b.keys, b.args...)
	if err != nil && len(b.calls) == 1 {
		// A lone request's error is the script's (see batch.lua).
		err = unreadable(err)
	}
	var replies []any
	if err == nil && len(b.calls) > 1 {
		replies, err = splitReply(v, len(b.calls))
	}

	r.mu.Lock()
	var free []*call
	var next *batch
	q := b.q
	for i, c := range b.calls {
		switch {
		case err != nil:
			c.err = err
		case replies == nil:
			c.reply = v
		default:
			c.reply = replies[i]
			if rerr, ok := c.reply.(redis.Error); ok {
				// This request failed alone (see batch.lua): the others' replies stand.
				c.reply, c.err = nil, unreadable(fmt.Errorf("weighted: run script: %w", rerr))
			}
		}
		if c.state != abandoned {
			c.state = done
			c.wake <- struct{}{}
			continue
		}
		free = append(free, c)
		switch {
		case c.err != nil:
			r.stats.lateLost.Add(1)
		case admitted(c):
			// The caller took it for applied; it is not: cancel it.
			r.stats.lateCancels.Add(1)
			q.pending = append(q.pending, r.cancelOf(c))
		}
	}
	switch {
	case len(q.pending) > 0:
		if b.detached {
			q.inflight++ // the place b gave back is another's now
		}
		next = r.nextBatch(q)
	case !b.detached:
		q.inflight--
		fallthrough
	default:
		if r.sharded && q.inflight == 0 && q.tag != "" {
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
	return next
}

// detach gives b's place in its queue back before b's reply comes: a call of
// b got no reply within CallTimeout, so Redis may be hung, and the calls
// queued behind b must not wait for b's ReplyTimeout. They are sent at once
// (and, if Redis is hung, time out as store failures too, which is what
// opens the caller's breaker) instead of waiting to be shed as
// overloaded. r.mu is held.
func (r *Redis) detach(b *batch) {
	if b.detached {
		return
	}
	b.detached = true
	q := b.q
	if len(q.pending) > 0 {
		r.handOn(q)
		return
	}
	q.inflight--
}

// admitted reports whether c is a debit whose reply says it was admitted.
func admitted(c *call) bool {
	reply, ok := c.reply.(string)
	op := headerNumber(c.buf, 3)
	return ok && (op == opDebit || op == opFinal) && len(reply) >= 8 && replyNumber(reply, 0) == 1
}

// headerNumber returns the k-th double of a request's buffer.
func headerNumber(buf []byte, k int) int64 {
	return int64(math.Float64frombits(binary.LittleEndian.Uint64(buf[8*k:])))
}

// cancelOf returns a call, abandoned from the start, that cancels the
// debit of call c: the settle of its items with actual costs of zero.
func (r *Redis) cancelOf(c *call) *call {
	n, ng, nl := int(headerNumber(c.buf, 0)), int(headerNumber(c.buf, 6)), int(headerNumber(c.buf, 7))
	cc := getCall(context.WithoutCancel(c.ctx))
	cc.buf = append(cc.buf, c.buf[:8*6]...)
	binary.LittleEndian.PutUint64(cc.buf[8:], math.Float64bits(float64(n+1)))
	binary.LittleEndian.PutUint64(cc.buf[24:], math.Float64bits(opSettle))
	cc.buf = appendNumber(cc.buf, 0) // no markers
	cc.buf = appendNumber(cc.buf, 0) // no lease indexes
	items := c.buf[8*(8+ng+nl):]
	for i := range n {
		cc.buf = append(cc.buf, items[48*i:48*i+48]...)
		cc.buf = appendNumber(cc.buf, 0)
	}
	cc.keys = append(slices.Clip(c.keys[:n]), r.recordKey(c.tag, c.id))
	cc.id, cc.tag, cc.q = c.id, c.tag, c.q
	cc.state = abandoned
	return cc
}

// handOn makes the first MaxBatch pending calls of q a batch and sends it
// in a goroutine. r.mu is held.
func (r *Redis) handOn(q *queue) {
	go r.send(r.nextBatch(q))
}

// nextBatch makes MaxBatch pending calls of q a batch, sent from now, for
// its caller to run (send), by round, then in order of arrival (see
// queue.arrive). r.mu is held.
func (r *Redis) nextBatch(q *queue) *batch {
	n := min(len(q.pending), r.maxBatch)
	b := batchPool.Get().(*batch)
	b.q = q
	b.calls = q.take(b.calls, n)
	now := time.Now()
	for _, c := range b.calls {
		c.b = b
		if c.state == queued {
			c.state, c.sentAt = sent, now
			q.unwait(c)
		}
	}
	return b
}

// A tagRound is where a tag's calls arriving now go (see queue.arrive):
// round r, of which k calls arrived.
type tagRound struct{ r, k int }

// arrive returns the round of a call of tags arriving in q, with at most
// bound calls of each tag a round: the queue's current round, or, for a
// tag with bound calls in it already, a later one; the least of its
// tags'. The calls go by round, then in order of arrival, so that another
// tag's call arriving now waits behind at most bound calls of one tag.
// r.mu is held.
func (q *queue) arrive(tags []string, bound int) int {
	round := q.round
	if len(tags) > 0 && q.rounds == nil {
		q.rounds = map[string]tagRound{}
	}
	for j, t := range tags {
		tr := q.rounds[t]
		if tr.r < q.round {
			tr = tagRound{r: q.round}
		}
		if j == 0 || tr.r < round {
			round = tr.r
		}
		if tr.k++; tr.k == bound {
			tr.r, tr.k = tr.r+1, 0
		}
		q.rounds[t] = tr
	}
	return round
}

// take appends to calls n of q's pending calls, the earliest of the
// lowest rounds, removes them from pending, and moves q's round on to
// theirs. r.mu is held.
func (q *queue) take(calls []*call, n int) []*call {
	if n == 0 {
		return calls
	}
	from := len(calls)
	for len(calls)-from < n {
		low := -1
		for _, c := range q.pending {
			if c != nil && (low < 0 || c.round < low) {
				low = c.round
			}
		}
		q.round = max(q.round, low)
		for i, c := range q.pending {
			if c != nil && c.round == low {
				calls = append(calls, c)
				q.pending[i] = nil
				if len(calls)-from == n {
					break
				}
			}
		}
	}
	rest := 0
	for _, c := range q.pending {
		if c != nil {
			q.pending[rest] = c
			rest++
		}
	}
	clear(q.pending[rest:])
	q.pending = q.pending[:rest]
	return calls
}
