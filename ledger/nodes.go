package ledger

// Operator actions on nodes. A node whose data directory is lost for good
// (a replica deleted with its volume) never restarts, so no recovery marker
// of its own ever finalizes the reservations it left open: they stay
// reserved, charged at their estimate. Nodes shows them and RecoverNode
// finalizes them, from any process that can reach the store.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// NodeState is one node known to the store: the data directory (Dir/node)
// of a process that has written entries.
type NodeState struct {
	Node string `json:"node"`
	// Open is the number of the node's entries still reserved.
	Open int64 `json:"open"`
	// Oldest is the creation time of the oldest of them, zero when Open is
	// zero.
	Oldest time.Time `json:"oldest,omitzero"`
}

// Nodes returns every node known to the store, ordered by id, with the
// reservations each holds open, as they are in the store. A live node's
// open reservations are its requests in flight, so its Oldest is recent; a
// node whose Oldest is long past, and that does not move, has likely died
// for good (see RecoverNode).
//
// Cost: per node, one read of the entries of every node created since the
// node's open-since mark, through the created_at index. For live nodes the
// mark is the start of their oldest request in flight; for a dead node it
// is the oldest reservation it left open, so listing reads every entry
// created since that node died until it is recovered.
func (l *Ledger) Nodes(ctx context.Context) ([]NodeState, error) {
	return l.store.nodes(ctx)
}

// ErrOwnNode is returned by RecoverNode asked to recover the caller's own
// node: its open reservations are its requests in flight.
var ErrOwnNode = errors.New("ledger: refusing to recover this process's own node")

// RecoverNode finalizes at their estimate (Actual = Estimated, status
// recovered, as the recovery at Open does) the entries of node still
// reserved that were created before before, and returns how many. Spend is
// unchanged: a reservation is charged at its estimate, and so is a
// recovered entry. It is one transaction of its own, beside the flusher's,
// and idempotent: a second run finds nothing left to recover.
//
// before is required. It is the operator's statement that node made no
// request before it that is still in flight: take it at or before the
// node's last activity. A node that is in fact alive and later settles an
// entry recovered here is not lost: a recorded settlement beats a recovery
// at the estimate, so the entry becomes settled at its actual cost and
// spend follows; until that settlement arrives, Spend and Export show the
// estimate, as they did while the entry was reserved, raised by the
// node's extensions of it (Extend) recorded since. RecoverNode fails with ErrOwnNode for the node of
// this ledger's Dir, and with ErrReadOnly on a ledger opened with
// Config.ReadOnly.
func (l *Ledger) RecoverNode(ctx context.Context, node string, before time.Time) (int64, error) {
	if l.cfg.ReadOnly {
		return 0, ErrReadOnly
	}
	if node == "" {
		return 0, fmt.Errorf("%w recover: node is required", ErrInvalid)
	}
	if before.IsZero() {
		return 0, fmt.Errorf("%w recover: a time before which to recover is required", ErrInvalid)
	}
	if node == l.node {
		return 0, fmt.Errorf("%w (%s)", ErrOwnNode, node)
	}
	tx, err := l.store.begin(ctx)
	if err != nil {
		return 0, err
	}
	n, err := tx.recoverNode(ctx, node, micro(before), micro(l.cfg.Now()))
	if err != nil {
		tx.rollback(ctx)
		return 0, err
	}
	if err := tx.commit(ctx); err != nil {
		return 0, err
	}
	if n > 0 {
		l.cfg.Logf("ledger: recovered %d reservations of node %s created before %s at their estimate", n, node, before.UTC().Format(time.RFC3339))
	}
	return n, nil
}
