package ledger

// Peers: the processes that write one PostgreSQL ledger (replicas of one
// deployment) each hold the records of their last batch delay in their own
// spool. A reader that needs every process's records of before some moment
// (a limiter restoring its counters from the ledger after its store lost
// them) asks the others to flush, and waits for their answers: SyncPeers.
//
// They talk over PostgreSQL's LISTEN/NOTIFY on one channel, so the store
// they already share is the only thing they need. Each process listens on
// a connection of its own and says, in JSON payloads:
//
//   - beat: "I am here", at start and every peerBeat. A process that hears
//     a beat of one it did not know answers with its own, so a newcomer
//     learns the others at once. A process not heard from for peerAlive is
//     gone (a crash); bye says so at once on Close.
//   - sync (seq, notes): "flush": each other process hands the notes to
//     Config.OnPeerSync, then flushes everything it had appended when it
//     heard it, and answers ack (seq) to the sender.
//
// A sender's syncs go out one after another, so a peer hears them in the
// order of their seq, and an ack of seq answers every lower one too.
//
// PostgreSQL delivers notifications in the order their transactions
// committed, to every listener, the sender's own among them. Two rules
// follow that no process with unflushed records is left out of a sync:
//
//   - a process records nothing before its first beat is sent (Open waits
//     for it), so that a sync sent after one of its records is delivered
//     after its beat;
//   - a sync counts the processes its sender's listener knows once that
//     listener has heard the sync itself (its echo): by then it has heard
//     every beat delivered before it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// peerChannel is the NOTIFY channel of the ledger's processes.
const peerChannel = "costgate_ledger"

// The peers' timings: a process beats every peerBeat and is gone when not
// heard from for peerAlive; a listener that lost its connection tries
// again after peerRetry.
var (
	peerBeat  = 2 * time.Second
	peerAlive = 3 * peerBeat
	peerRetry = time.Second
)

// maxPeers bounds the processes one process keeps track of (the channel is
// open to any session of the database).
const maxPeers = 4096

// peerMsg is one notification's payload.
type peerMsg struct {
	Kind string   `json:"t"`            // beat, bye, sync, ack
	From string   `json:"n"`            // the sender's node
	Seq  uint64   `json:"s,omitempty"`  // sync, ack
	Note []string `json:"g,omitempty"`  // sync: its callers' notes (see SyncPeers)
	To   string   `json:"to,omitempty"` // ack: the node whose sync it answers
}

// peers is a process's side of the protocol.
type peers struct {
	pool  *pgxpool.Pool
	node  string
	flush func(context.Context) error
	heed  func([]string) // Config.OnPeerSync; nil for none
	wait  time.Duration  // the longest SyncPeers waits (Config.PeerWait)
	logf  func(string, ...any)
	wg    sync.WaitGroup // the listener's goroutines (answers, beats); listen waits for them

	mu        sync.Mutex
	heard     map[string]time.Time // node → when last heard
	acked     map[string]uint64    // node → the highest seq it acked of ours
	changed   chan struct{}        // closed and replaced when acked or echoed grows
	listening time.Time            // since when the listener is subscribed; zero when not
	ready     chan struct{}        // closed once the listener subscribed and sent its first beat
	readyOnce sync.Once            // closes ready
	seq       uint64               // our last sync's
	echoed    uint64               // our highest sync the listener heard back
	next      *syncRound           // the sync callers join, not yet sent
	sending   bool                 // a caller is sending syncs
	toAck     map[string]uint64    // syncs heard, not yet answered
	acking    bool                 // a goroutine is answering them
}

// syncRound is one sync sent: the callers that asked before it was sent
// share it.
type syncRound struct {
	seq   uint64
	notes []string      // its callers', distinct; [""] once they passed maxNotes
	sent  chan struct{} // closed once sent (or failed)
	err   error
}

// maxNotes bounds the bytes a sync's notes take in its payload: a NOTIFY
// payload is under 8,000 bytes. Past it, the sync carries the one note
// "", which stands for notes that did not fit.
const maxNotes = 6000

// add adds notes to the round's.
func (r *syncRound) add(notes []string) {
	if len(r.notes) == 1 && r.notes[0] == "" {
		return // the notes did not fit already
	}
	size := 0
	for _, n := range r.notes {
		size += noteSize(n)
	}
	for _, n := range notes {
		if slices.Contains(r.notes, n) {
			continue
		}
		if size += noteSize(n); size > maxNotes || n == "" {
			r.notes = []string{""}
			return
		}
		r.notes = append(r.notes, n)
	}
}

// noteSize is the bytes note n takes in a payload's JSON list.
func noteSize(n string) int {
	b, _ := json.Marshal(n)
	return len(b) + 1
}

func newPeers(pool *pgxpool.Pool, node string, flush func(context.Context) error, heed func([]string), wait time.Duration, logf func(string, ...any)) *peers {
	return &peers{pool: pool, node: node, flush: flush, heed: heed, wait: wait, logf: logf, ready: make(chan struct{}),
		heard: map[string]time.Time{}, acked: map[string]uint64{}, changed: make(chan struct{}), toAck: map[string]uint64{}}
}

// waitReady waits until the listener has subscribed and sent its first
// beat, at most p.wait or until ctx ends: a listener that cannot connect
// does not hold the process up longer (its records are then waited for
// by the others' fixed lag only, as before it beats).
func (p *peers) waitReady(ctx context.Context) {
	t := time.NewTimer(p.wait)
	defer t.Stop()
	select {
	case <-p.ready:
	case <-t.C:
		p.logf("ledger: not listening to the other replicas after %v; going on (a restore elsewhere may miss this replica's newest records until it does)", p.wait)
	case <-ctx.Done():
	}
}

// notify sends m on the channel, from a connection of the pool.
func (p *peers) notify(ctx context.Context, m peerMsg) error {
	m.From = p.node
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, "SELECT pg_notify($1, $2)", peerChannel, string(b)); err != nil {
		return fmt.Errorf("ledger: notify peers: %w", err)
	}
	return nil
}

// listen keeps a connection subscribed to the channel until ctx ends,
// answering what it hears, and beats. On its end it says bye.
func (p *peers) listen(ctx context.Context) {
	var failing bool // logged: one line per run of failures
	for ctx.Err() == nil {
		err := p.listenOnce(ctx)
		p.mu.Lock()
		heard := !p.listening.IsZero()
		p.listening = time.Time{}
		p.mu.Unlock()
		if ctx.Err() != nil {
			break
		}
		if heard {
			failing = false // it listened: a new run of failures
		}
		if !failing {
			failing = true
			p.logf("ledger: listening to the other replicas: %v (retrying every %v; meanwhile a sync waits a fixed lag)", err, peerRetry)
		}
		select {
		case <-time.After(peerRetry):
		case <-ctx.Done():
		}
	}
	p.wg.Wait()
	bctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p.notify(bctx, peerMsg{Kind: "bye"})
}

func (p *peers) listenOnce(ctx context.Context) error {
	pc, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection leaves the pool: one that listens must not serve
	// queries, and is closed when done.
	conn := pc.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+peerChannel); err != nil {
		return err
	}
	p.mu.Lock()
	p.listening = time.Now()
	p.mu.Unlock()
	beat := time.Now() // beat at once
	for {
		if time.Since(beat) >= 0 {
			if err := p.notify(ctx, peerMsg{Kind: "beat"}); err != nil && ctx.Err() == nil {
				p.logf("%v", err)
			}
			p.readyOnce.Do(func() { close(p.ready) })
			beat = time.Now().Add(peerBeat)
			p.prune()
		}
		wctx, cancel := context.WithDeadline(ctx, beat)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			continue
		case err != nil:
			return err
		}
		var m peerMsg
		if json.Unmarshal([]byte(n.Payload), &m) != nil || m.From == "" {
			continue
		}
		if m.From == p.node {
			p.echo(m)
			continue
		}
		p.hear(ctx, m)
	}
}

// hear handles one message of another process.
func (p *peers) hear(ctx context.Context, m peerMsg) {
	if m.Kind == "sync" && len(m.Note) > 0 && p.heed != nil {
		// Before the flush that answers it (see answer), which the
		// listener starts below: a record appended after this call is
		// not in that flush, and its writer knows of the notes.
		p.heed(m.Note)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.Kind == "bye" {
		delete(p.heard, m.From)
		delete(p.acked, m.From)
		return
	}
	// Only a beat makes a process known (a sync or an ack of one not
	// known is answered, or taken, and that is all).
	_, known := p.heard[m.From]
	if known || (m.Kind == "beat" && len(p.heard) < maxPeers) {
		p.heard[m.From] = time.Now()
	}
	switch m.Kind {
	case "beat":
		if !known {
			p.wg.Go(func() { p.notify(ctx, peerMsg{Kind: "beat"}) }) // the newcomer learns of us
		}
	case "sync":
		if m.Seq > p.toAck[m.From] && (len(p.toAck) < maxPeers || p.toAck[m.From] > 0) {
			p.toAck[m.From] = m.Seq
		}
		if !p.acking {
			p.acking = true
			p.wg.Go(func() { p.answer(ctx) })
		}
	case "ack":
		if m.To == p.node && m.Seq > p.acked[m.From] {
			p.acked[m.From] = m.Seq
			close(p.changed)
			p.changed = make(chan struct{})
		}
	}
}

// echo takes one of this process's own messages, heard back: a sync's
// tells that every beat delivered before it has been heard.
func (p *peers) echo(m peerMsg) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.Kind == "sync" && m.Seq > p.echoed && m.Seq <= p.seq {
		p.echoed = m.Seq
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

// answer flushes and acks the syncs heard, until none wait: the syncs of
// one flush are those heard before it started.
func (p *peers) answer(ctx context.Context) {
	for {
		p.mu.Lock()
		asked := p.toAck
		if len(asked) == 0 {
			p.acking = false
			p.mu.Unlock()
			return
		}
		p.toAck = map[string]uint64{}
		p.mu.Unlock()
		fctx, cancel := context.WithTimeout(ctx, p.wait)
		err := p.flush(fctx)
		cancel()
		if err != nil {
			// No ack: the asker waits its PeerWait out, as for a
			// process that is gone.
			if ctx.Err() != nil {
				continue
			}
			p.logf("ledger: a replica asked for this one's records, which could not be flushed: %v", err)
			continue
		}
		for node, seq := range asked {
			if err := p.notify(ctx, peerMsg{Kind: "ack", Seq: seq, To: node}); err != nil && ctx.Err() == nil {
				p.logf("%v", err)
			}
		}
	}
}

// prune forgets the processes not heard from for peerAlive.
func (p *peers) prune() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for node, at := range p.heard {
		if time.Since(at) > peerAlive {
			delete(p.heard, node)
			delete(p.acked, node)
		}
	}
}

// round returns a sync sent after the call began: the one being gathered,
// which this caller sends (with every one gathered while it sends) when no
// other caller is sending.
func (p *peers) round(ctx context.Context, notes []string) *syncRound {
	p.mu.Lock()
	r := p.next
	if r == nil {
		r = &syncRound{sent: make(chan struct{})}
		p.next = r
	}
	r.add(notes)
	if p.sending {
		p.mu.Unlock()
		<-r.sent
		return r
	}
	p.sending = true
	for {
		s := p.next
		p.next = nil
		p.seq++
		s.seq = p.seq
		p.mu.Unlock()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.wait)
		s.err = p.notify(sctx, peerMsg{Kind: "sync", Seq: s.seq, Note: s.notes})
		cancel()
		close(s.sent)
		p.mu.Lock()
		if p.next == nil {
			p.sending = false
			p.mu.Unlock()
			break
		}
	}
	<-r.sent
	return r
}

// PeersBehindError is SyncPeers's error when processes it heard from did
// not answer within Config.PeerWait.
type PeersBehindError struct {
	Nodes []string
	Wait  time.Duration
}

func (e *PeersBehindError) Error() string {
	return fmt.Sprintf("ledger: %d other replicas did not flush their records within %v: %v", len(e.Nodes), e.Wait, e.Nodes)
}

// sync is SyncPeers on PostgreSQL; ok is false when this process is not
// listening to the others, so it does not know them.
func (p *peers) sync(ctx context.Context, notes []string) (ok bool, err error) {
	p.mu.Lock()
	since := p.listening
	p.mu.Unlock()
	if since.IsZero() {
		return false, nil
	}
	// A listener that just started may not have heard the others' answers
	// to its first beat yet.
	if d := 100*time.Millisecond - time.Since(since); d > 0 {
		if err := sleep(ctx, d); err != nil {
			return true, err
		}
	}
	r := p.round(ctx, notes)
	if r.err != nil {
		return false, r.err
	}
	timer := time.NewTimer(p.wait)
	defer timer.Stop()
	for {
		p.mu.Lock()
		var behind []string
		for node, at := range p.heard {
			if p.acked[node] < r.seq && time.Since(at) <= peerAlive {
				behind = append(behind, node)
			}
		}
		// Until the sync is heard back, a process that beat before it may
		// not be known yet.
		echoed := p.echoed >= r.seq
		changed := p.changed
		p.mu.Unlock()
		if len(behind) == 0 && echoed {
			return true, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			if !echoed {
				return true, fmt.Errorf("ledger: this replica's request to flush was not heard back within %v: the replicas it does not know yet were not waited for (%d that it knows did not answer: %v)", p.wait, len(behind), behind)
			}
			return true, &PeersBehindError{Nodes: behind, Wait: p.wait}
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SyncPeers returns once every other process that writes this ledger's
// PostgreSQL store, and that this one heard from, has in the store what
// it had appended when it heard the request (a batch delay sooner than it
// would have written it): call it after some moment, and the store then
// holds the others' records of before it, as Flush does this process's.
// The processes are the replicas of one deployment: each listens on a
// connection of its own (PostgreSQL's LISTEN/NOTIFY) and answers as soon
// as its flush is done.
//
// It waits at most Config.PeerWait for the answers, then fails with a
// *PeersBehindError naming the processes that did not answer (one that
// crashed is dropped a few seconds after its last beat; one that closed,
// at once). Before this process hears the others (its listener not
// connected), it waits PeerLag instead. With the embedded store, which no
// other process shares, it returns at once.
//
// notes go with the request: each other process that hears it hands
// them to its Config.OnPeerSync before it flushes, so that a record it
// appends after that call knows of them. Concurrent calls may share one
// request, which then carries the notes of all; notes past 4,000 bytes
// in all, or an empty one, are sent as the one note "" (see
// Config.OnPeerSync).
func (l *Ledger) SyncPeers(ctx context.Context, notes ...string) error {
	if l.peers == nil {
		return sleep(ctx, l.PeerLag())
	}
	ok, err := l.peers.sync(ctx, notes)
	if !ok {
		if err != nil {
			l.cfg.Logf("ledger: asking the other replicas to flush: %v (waiting %v instead)", err, l.PeerLag())
		}
		return sleep(ctx, l.PeerLag())
	}
	return err
}
