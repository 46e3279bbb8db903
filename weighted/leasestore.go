package weighted

// A store that keeps leases: a lease is debited as a reservation is, and
// the store also records it in the lease index of its key, with its TTL.
// The replica that holds it reports what it has spent of it, and ends it
// with a last report (done); a lease whose TTL passes first is given back
// by the store: its units less those its replica reported spent, as a
// Settle of the lease with that actual cost would. The store does this
// inside its atomic calls, for the leased keys each Debit, Peek and Lease
// touches, by its own clock. A report that comes after the store gave the
// lease back charges what was spent beyond what the store kept counted.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// LeaseStore is a Store that keeps leases and gives back, when their TTL
// passes, the units their replicas have not reported spent. Memory and
// Redis are LeaseStores; Leased uses one when its inner store is.
// Implementations are safe for concurrent use.
type LeaseStore interface {
	Store
	// Lease first applies c.Reports to the leases of it's key, then
	// gives back those past their TTL, then, when it.Cost > 0, debits
	// it.Cost as a lease, named c.Prefix followed by c.Seq in decimal,
	// which the store gives back c.TTL from now, less the units reported
	// spent, unless it is reported done before. it.Cost 0 only reports.
	// it.Limit must have a lease policy.
	Lease(ctx context.Context, it Item, c LeaseCall) (ItemState, error)
}

// LeaseCall is what a Lease call takes and reports.
type LeaseCall struct {
	// Prefix names the replica's leases; it must not end with a digit.
	Prefix string
	// Seq is the new lease's number, its id's suffix.
	Seq uint64
	// TTL is how long after it is taken the store gives the lease back.
	TTL time.Duration
	// Reports are the replica's earlier leases of the key.
	Reports []LeaseReport
}

// LeaseReport reports what a replica has spent of one of its leases: Used
// units, never less than reported before; Done ends the lease (its
// unspent units go back at once).
type LeaseReport struct {
	Seq  uint64
	Used int64
	Done bool
}

var (
	_ LeaseStore = (*Redis)(nil)
	_ LeaseStore = (*Memory)(nil)
)

var errBadLease = errors.New("weighted: invalid lease call")

// checkLease validates a Lease call and returns its item's spec and id.
func checkLease(it *Item, c *LeaseCall) (spec, string, error) {
	if !it.Limit.Lease.On() {
		return spec{}, "", fmt.Errorf("%w: limit %q has no lease policy", errBadLease, it.Limit.Name)
	}
	if c.Prefix == "" || c.Prefix[len(c.Prefix)-1] >= '0' && c.Prefix[len(c.Prefix)-1] <= '9' {
		return spec{}, "", fmt.Errorf("%w: prefix %q is empty or ends with a digit", errBadLease, c.Prefix)
	}
	if c.TTL <= 0 || c.TTL > time.Hour {
		return spec{}, "", fmt.Errorf("%w: ttl %s is not within (0, 1h]", errBadLease, c.TTL)
	}
	if len(c.Reports) > maxLeaseReports {
		return spec{}, "", fmt.Errorf("%w: %d reports, at most %d", errBadLease, len(c.Reports), maxLeaseReports)
	}
	var sbuf [1]spec
	ss, err := specs([]Item{*it}, sbuf[:0], true)
	if err != nil {
		return spec{}, "", err
	}
	for _, r := range c.Reports {
		if r.Used < 0 || r.Used > ss[0].cap || r.Seq >= 1<<53 {
			return spec{}, "", fmt.Errorf("%w: report of lease %d: used %d", errBadLease, r.Seq, r.Used)
		}
	}
	if c.Seq >= 1<<53 {
		return spec{}, "", fmt.Errorf("%w: sequence number %d", errBadLease, c.Seq)
	}
	return ss[0], c.Prefix + strconv.FormatUint(c.Seq, 10), nil
}

// maxLeaseReports is the most reports one Lease call carries.
const maxLeaseReports = 64

// Lease implements LeaseStore, in one script call.
func (r *Redis) Lease(ctx context.Context, it Item, c LeaseCall) (ItemState, error) {
	s, id, err := checkLease(&it, &c)
	if err != nil {
		return ItemState{}, err
	}
	items, ss := []Item{it}, []spec{s}
	g := r.groups(items)[0]
	out := make([]ItemState, 1)
	if _, err := r.evalLease(ctx, id, items, ss, &g, opLease, out, &c); err != nil {
		return ItemState{}, err
	}
	return out[0], nil
}

// leaseAlgo names, in Memory, the lease index of a leased key.
const leaseAlgo Algorithm = 253

// leaseRec is a lease in a key's lease index: as lib.lua's lease records.
type leaseRec struct {
	count    int64 // the units the key counts for the lease
	reported int64 // reported spent
	expires  int64 // µs; minus when the record goes once given back
	debited  int64 // µs
}

// Lease implements LeaseStore.
func (m *Memory) Lease(ctx context.Context, it Item, c LeaseCall) (ItemState, error) {
	s, id, err := checkLease(&it, &c)
	if err != nil {
		return ItemState{}, err
	}
	res, err := m.debit(id, []Item{it}, []spec{s}, &c)
	if err != nil {
		return ItemState{}, err
	}
	return res.Items[0], nil
}

// leases applies a Lease call's reports (c, or nil) and gives back the
// expired leases of the leased items, whose indexes h holds from key
// first on, as lib.lua's lease_reports and lease_expire do.
func (m *Memory) leases(h *held, items []Item, ss []spec, first int, c *LeaseCall, prefix string) {
	j := first
	for i := range items {
		if !items[i].Limit.Lease.On() {
			continue
		}
		e := m.shards[h.idx[j]].m[h.keys[j]]
		j++
		if e == nil {
			continue
		}
		if c != nil {
			for _, rp := range c.Reports {
				rid := prefix + strconv.FormatUint(rp.Seq, 10)
				lr, ok := e.leases[rid]
				if !ok {
					continue
				}
				used := rp.Used
				if used > lr.count && lr.expires > 0 {
					used = lr.count
				}
				used = max(used, lr.reported)
				if lr.expires < 0 && used > lr.count {
					m.adjust(h, i, &ss[i], lr.count, used, lr.debited, rid)
					lr.count = used
				}
				if rp.Done {
					if lr.expires > 0 {
						m.adjust(h, i, &ss[i], lr.count, used, lr.debited, rid)
					}
					delete(e.leases, rid)
					continue
				}
				lr.reported = used
				e.leases[rid] = lr
			}
		}
		for rid, lr := range e.leases {
			switch {
			case lr.expires > 0 && lr.expires <= h.now:
				m.adjust(h, i, &ss[i], lr.count, lr.reported, lr.debited, rid)
				e.leases[rid] = leaseRec{count: lr.reported, reported: lr.reported, expires: -(h.now + lr.expires - lr.debited), debited: lr.debited}
			case lr.expires < 0 && -lr.expires <= h.now:
				delete(e.leases, rid)
			}
		}
	}
}

// adjust settles reserved to actual on item i, as a Settle of reservation
// id debited at debited µs.
func (m *Memory) adjust(h *held, i int, s *spec, reserved, actual, debited int64, id string) {
	if actual == reserved {
		return
	}
	e := m.get(h, i)
	if e == nil {
		if actual < reserved {
			return
		}
		e = new(entry)
	}
	m.put(h, i, e, s.settle(&e.state, h.now, reserved, actual, debited, id))
}

// addLease records a lease of cost units taken now under id in the index
// h holds at key k, for ttl µs, on a limit of period µs.
func (m *Memory) addLease(h *held, k int, id string, cost, ttl, period int64) {
	sh := &m.shards[h.idx[k]]
	e := sh.m[h.keys[k]]
	if e == nil {
		e = &entry{leases: map[string]leaseRec{}}
	}
	e.leases[id] = leaseRec{count: cost, expires: h.now + ttl, debited: h.now}
	e.expires = max(e.expires, h.now+2*ttl+period)
	sh.m[h.keys[k]] = e
}

// leaseKeyOf is the Memory key of the lease index of it's key.
func leaseKeyOf(it *Item) memKey {
	return memKey{name: it.Limit.Name + "\x00" + strconv.Itoa(int(it.Limit.Algorithm)), algo: leaseAlgo, cal: it.Limit.Calendar, key: it.Key}
}
