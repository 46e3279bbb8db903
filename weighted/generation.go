package weighted

// Generations: with RedisConfig.Generations (MemoryConfig.Generations), each
// hash tag of the items' keys has a marker, a key in the tag's slot
// (<prefix>g:{<tag>}) that holds the tag's generation: a number that
// Restore sets to at least the store's time in µs and that every debit
// that writes advances by one. The debit script reads the markers of its
// request's tags with the limits' keys, in the same script call, and a
// marker that is missing (the store restarted empty, was flushed, or lost
// the key) or below the highest value this client has seen for the tag
// (a failover to a replica that lags, a restore of an older snapshot)
// makes the request stale: the script applies nothing and the call
// returns a *StaleError. Restore brings the tag's counters up to what the
// caller knows was spent (the ledger's spend) and writes a fresh marker,
// after which the tag's debits run again.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// ErrStale is the sentinel of a *StaleError: the store lost state that its
// counters held, and a debit or peek on it would decide on a counter that
// has not been brought up to what was spent. It is not a failure of the
// store (IsStoreFailure is false): restore the tags it names (Restore)
// and retry.
var ErrStale = errors.New("weighted: the store lost the state of a hash tag: restore it")

// StaleError reports a Debit or Peek that found the generation marker of
// one or more hash tags missing or behind (see RedisConfig.Generations).
// Nothing was applied. It matches ErrStale under errors.Is.
type StaleError struct {
	// Tags are the stale hash tags, sorted: the text between the braces
	// of the items' keys (for "{acme}:user=bob", "acme").
	Tags []string
	// Items are the indexes, in the request, of the items whose keys have
	// one of those tags, ascending.
	Items []int
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("weighted: stale hash tags %s (items %v): the store lost their state; restore them", strings.Join(e.Tags, ", "), e.Items)
}

// Unwrap returns ErrStale.
func (e *StaleError) Unwrap() error { return ErrStale }

// Restorer is a store that keeps generation markers (RedisConfig.Generations,
// MemoryConfig.Generations). Redis and Memory implement it.
type Restorer interface {
	// Restore raises each item's used amount to at least counted[i] (a
	// window's and a log's capacity at most, a meter's two capacities: one
	// owed beyond empty, as a settlement may leave it), and writes a
	// fresh generation marker for each hash tag of the items' keys, all of
	// one tag in one atomic step, so that the tags' debits run again.
	// Item.Cost is ignored.
	//
	// The used amount is the capacity minus the Remaining that Peek
	// reports (a meter's: its debt, owed beyond empty included, so that
	// a restore of a meter that owes charges nothing twice): a fixed window's count (calendar or not) becomes
	// max(count, counted) in the window counted in now; a token bucket's
	// or GCRA's debt grows so that at most capacity - counted remain
	// (below zero: what a charge beyond empty left owed); a
	// sliding window's current count grows until its weighted count is
	// counted; a sliding log gets one mark, at the store's time now, of
	// what its marks that count lack of counted. counted is what was
	// spent in the window (now - Period, now]; the restore does not know
	// when in it, and a mark at now stops counting a Period later, no
	// sooner than any of the spend it stands for: the log may refuse
	// early after a restore, never late. A counter already at or above
	// counted is left alone, so a Restore repeated, or made by two
	// replicas, charges nothing twice (and adds no mark). Concurrency
	// limits take counted 0 (a lease lost is held again by its holder's
	// next renewal, see Store.Renew); a counted above 0 for them, a
	// negative one, or a counted slice of another length than items is an
	// error matching ErrInvalidCost, and nothing is sent.
	//
	// A marker guards every counter of its tag, so give Restore every
	// counter of the tag that the caller can count (every budget of the
	// tenant, for each user and key), the others with counted 0: a counter
	// left out is trusted as the store holds it.
	Restore(ctx context.Context, items []Item, counted []int64) error

	// RestoreCounters raises the items' counters as Restore does and
	// writes no generation marker: their tags stay stale (a debit of
	// them answers ErrStale and changes nothing) until a Restore of the
	// tag. A restore too large for one call raises its counters in calls
	// of RestoreCounters first, then makes the last with Restore, so that
	// no debit is decided on a tag marked fresh while some of its
	// counters are still at what the store kept.
	RestoreCounters(ctx context.Context, items []Item, counted []int64) error
}

var (
	_ Restorer = (*Redis)(nil)
	_ Restorer = (*Memory)(nil)

	_ StagedRestorer = (*Redis)(nil)
	_ StagedRestorer = (*Leased)(nil)
)

// StagedRestorer is a Restorer whose restore of a tag made in several
// calls (too many counters for one) fails when the store loses its data
// between them. Made with RestoreCounters, then Restore, such a restore
// wrote the marker of a tag whose counters raised by its first calls a
// loss had taken since: those counters stayed at zero under a fresh
// marker, and each of their callers could spend its budget again. Redis
// implements it; a Memory loses its data only with its process, which
// ends the restore too.
type StagedRestorer interface {
	Restorer
	// RestoreStage raises the items' counters as RestoreCounters does,
	// as call s.Step of the restore s.ID, each call of which names items
	// of the same tags. Its first call (Step 0) notes, per tag, that the
	// restore made it (replacing another restore's note); each call
	// after checks that the note of the call before is there, and when
	// it is not (the store lost its data, or another restore of the tag
	// began since) writes nothing and fails with a *StaleError: the
	// restore is to be begun again. The last call (Last, after the
	// first) writes the tags' markers, as Restore does, and drops the
	// note.
	RestoreStage(ctx context.Context, items []Item, counted []int64, s Stage) error
}

// Stage is one call of a restore made in several (see StagedRestorer).
type Stage struct {
	ID   string // the restore's, drawn at random, the same in each of its calls; without '|'
	Step int    // 0 for its first call, one more for each after
	Last bool   // its last call, which writes the markers
}

// checkRestore validates the arguments of Restore and returns the items'
// specs.
func checkRestore(items []Item, counted []int64, buf []spec) ([]spec, error) {
	if len(counted) != len(items) {
		return nil, fmt.Errorf("%w: restore needs one counted amount per item", ErrInvalidCost)
	}
	ss, err := specs(items, buf, false)
	if err != nil {
		return nil, err
	}
	for i, c := range counted {
		switch {
		case c < 0:
			return nil, fmt.Errorf("%w: limit %q: negative counted amount %d", ErrInvalidCost, items[i].Limit.Name, c)
		case c > 0 && ss[i].algo == Concurrency:
			return nil, fmt.Errorf("%w: limit %q: a %s is not restored (counted must be 0)", ErrInvalidCost, items[i].Limit.Name, ss[i].algo)
		}
	}
	return ss, nil
}

// itemTags appends to buf the distinct hash tags, in order of first
// appearance, of the items idx (all items when idx is nil) whose keys have
// a hash tag of their own. Untagged keys have no marker.
func itemTags(items []Item, idx []int, buf []string) []string {
	add := func(i int) {
		k := items[i].Key
		if !hasHashTag(k) {
			return
		}
		t := HashTag(k)
		for _, s := range buf {
			if s == t {
				return
			}
		}
		buf = append(buf, t)
	}
	if idx == nil {
		for i := range items {
			add(i)
		}
	} else {
		for _, i := range idx {
			add(i)
		}
	}
	return buf
}

// staleError returns the *StaleError of the stale tags among items.
func staleError(items []Item, stale []string) *StaleError {
	e := &StaleError{Tags: slices.Clone(stale)}
	slices.Sort(e.Tags)
	for i := range items {
		if hasHashTag(items[i].Key) && slices.Contains(stale, HashTag(items[i].Key)) {
			e.Items = append(e.Items, i)
		}
	}
	return e
}

// maxSeenTags bounds the tags whose highest generation a Redis store
// remembers. Past it, an arbitrary tag is forgotten for each new one: a
// tag forgotten is checked only for a missing marker until its next reply.
const maxSeenTags = 1 << 16

// seenGens is the highest generation a client has seen per tag.
type seenGens struct {
	mu sync.Mutex
	m  map[string]int64
}

// get returns the highest generation seen for tag, 0 for none.
func (s *seenGens) get(tag string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[tag]
}

// saw records that tag's marker held g.
func (s *seenGens) saw(tag string, g int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[tag] >= g {
		return
	}
	if _, ok := s.m[tag]; !ok && len(s.m) >= maxSeenTags {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	if s.m == nil {
		s.m = make(map[string]int64)
	}
	s.m[tag] = g
}
