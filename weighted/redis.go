package weighted

import (
	"cmp"
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Scripter is what Redis needs of a Redis client: *redis.Client,
// *redis.ClusterClient and *redis.Ring all satisfy it. The store sends its
// script calls through Process as commands that the client must not resend
// (see Redis).
type Scripter interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// RedisConfig configures a Redis store. The zero value is ready to use.
type RedisConfig struct {
	// Prefix starts every key the store writes. "" means "cg:". A prefix
	// with a hash tag ("{cg}:") puts every key in one Cluster slot.
	Prefix string
	// SettleTTL is how long a settled or cancelled reservation id is
	// remembered, so that a retried Settle changes nothing. 0 means
	// DefaultSettleTTL. It is rounded up to a millisecond.
	SettleTTL time.Duration
	// Sharded makes the store follow the Cluster protocol (see Redis) for a
	// client that is neither a *redis.ClusterClient nor a *redis.Ring, which
	// are recognised without it.
	Sharded bool
	// MaxBatch is the most requests one script call carries when concurrent
	// requests are batched (see Redis). 0 means DefaultMaxBatch; 1 turns
	// batching off: one script call per request.
	MaxBatch int
	// Generations makes the store detect that Redis lost state (a restart
	// empty, a FLUSHALL, a failover to a replica that lags, an older
	// snapshot): every hash tag of the items' keys gets a marker, read and
	// advanced by the debit script itself (no round trip more), and a
	// Debit or Peek that finds its tag's marker missing or behind what
	// this store has seen applies nothing and returns a *StaleError
	// (ErrStale) until Restore writes a fresh one. Keys without a hash tag
	// of their own have no marker (see Redis). Off by default: a store
	// that turns it on finds every tag stale until restored.
	Generations bool
	// QueueTimeout bounds how long a request waits in its queue for a
	// script call of its own (see Batching): one not sent by then returns
	// ErrOverloaded, and nothing was applied. 0 means DefaultQueueTimeout
	// (50 ms).
	QueueTimeout time.Duration
	// CallTimeout bounds how long a caller waits for the reply of a
	// request sent: without one by then it returns ErrUnknownOutcome, and
	// the store keeps waiting for the reply (see ReplyTimeout). 0 means
	// DefaultCallTimeout (100 ms).
	CallTimeout time.Duration
	// ReplyTimeout bounds a script call: the context of the call ends then
	// (go-redis honours it with ContextTimeoutEnabled; otherwise its
	// ReadTimeout, 3 s by default, bounds the call). A debit whose caller
	// left (ErrUnknownOutcome) and whose reply says it was admitted is
	// cancelled by the store when the reply comes; one with no reply by
	// then is left to expire with its limits (see RedisStats.LateLost).
	// 0 means DefaultReplyTimeout (5 s); it must be at least CallTimeout.
	ReplyTimeout time.Duration
	// ContextDeadlines tells that the client ends a call at its context's
	// deadline (go-redis's ContextTimeoutEnabled). A Settle or Cancel
	// (claimed or not) that finds its queue idle then runs on its
	// caller's goroutine, within CallTimeout, rather than on one of the
	// store's: no goroutine is started and none woken for it, which on a
	// busy machine is most of a call's CPU (the store's goroutine is kept
	// for debits: a debit's late reply must be read to cancel it). A
	// settlement without a reply within CallTimeout is an
	// ErrUnknownOutcome, as on the store's goroutine; nothing is done with
	// its late reply either way.
	ContextDeadlines bool
}

// Validate reports whether the config is usable.
func (c RedisConfig) Validate() error {
	if c.SettleTTL < 0 {
		return fmt.Errorf("weighted: negative SettleTTL %s", c.SettleTTL)
	}
	if c.MaxBatch < 0 {
		return fmt.Errorf("weighted: negative MaxBatch %d", c.MaxBatch)
	}
	if c.QueueTimeout < 0 || c.CallTimeout < 0 || c.ReplyTimeout < 0 {
		return fmt.Errorf("weighted: negative QueueTimeout, CallTimeout or ReplyTimeout")
	}
	if cmp.Or(c.ReplyTimeout, DefaultReplyTimeout) < cmp.Or(c.CallTimeout, DefaultCallTimeout) {
		return fmt.Errorf("weighted: ReplyTimeout %s is shorter than CallTimeout %s", cmp.Or(c.ReplyTimeout, DefaultReplyTimeout), cmp.Or(c.CallTimeout, DefaultCallTimeout))
	}
	if strings.Count(c.Prefix, "{") != strings.Count(c.Prefix, "}") {
		return fmt.Errorf("weighted: prefix %q has an unbalanced hash tag", c.Prefix)
	}
	return nil
}

// Redis is a Store that keeps state in Redis: one EVALSHA per debit, whatever
// the number of items, when their keys share a slot, and one for many
// concurrent requests (see Batching).
//
// # Keys
//
// A limit's key for an item is
//
//	<prefix><limit name>:<algorithm code>:<item key>
//
// with the item key wrapped in braces when it has no hash tag of its own
// ("{_" and '}' when it is empty or starts with '}' or '_'), so that its
// hash tag is always the item key's tag or the whole item key (see
// Item.Key); an item key with a hash tag that a wrapping could give (the
// whole key is "{...}" around text without a hash tag) follows '~' in
// place of the last ':'. So two item keys are two Redis keys, as they are
// two counters in Memory. Algorithm codes are tb, gcra, sw, fw, log and conc, and fwm
// for a fixed window on calendar months (Limit.Calendar); a limit whose
// algorithm or calendar changes starts from fresh keys, and one whose rate, period
// or burst changes carries its state over (see the package documentation).
//
// Meters and fixed windows are one string of four doubles (32 bytes): three
// numbers of state and the key's own expiry, so that a write that leaves
// the expiry where it is overwrites the value in place (SETRANGE) instead
// of setting a TTL, which costs Redis twice as much. A window's numbers
// are its index, in periods since the Unix epoch, its counts and the period
// it was counted with: a fixed window keeps the period in place of the
// previous count it never has, a sliding window as a fifth double (40
// bytes). A month window's numbers are its month, year × 12 + month - 1
// (UTC), -1 in place of the period, and its count; its key expires 60 s
// after the month ends.
//
// Windows written by a version that did not keep their period (a fixed
// window's is 0; a sliding window's value has 32 bytes) are read as counted
// with the current period, as that version read them, and get the period
// at their next write. If the period changed with the upgrade, such a
// window reads as that version would read it, but for one case: a period
// that grew makes its index look ahead, its window ending after the expiry
// it holds, which no write with the current period leaves, and its count
// is carried into the current window (denying at most until that window
// ends) instead of counting far ahead; a period that shrank makes it look
// past, and its count is forgotten (the limit may admit up to its capacity
// early, once). A replica of that version reads the windows written by
// this one correctly while both run the same limits; change no window's
// period until every replica runs this version.
//
// Sliding logs and concurrency limits are sorted sets whose members are
// "cost:id". Every key expires once its limit is full again: exactly for
// sorted sets, and at most min(Period, 60s) later for meters and windows,
// whose expiry moves only when it must. A reservation with window items has a key
// <prefix>r:{<tag>}:<id> holding the time of its debit until its windows
// have passed; a settled or cancelled reservation's key holds a marker for
// SettleTTL.
//
// # Scripts
//
// Each call is one EVALSHA (EVAL when the server answers NOSCRIPT) of a Lua
// script embedded from lib.lua, batch.lua, debit.lua, settle.lua,
// renew.lua and restore.lua. Time is the server's (TIME), in microseconds; all arithmetic
// is on integers, exact below 2^53 (see Limit.Validate). A denial writes
// nothing. A debit of one token bucket costs Redis about as much CPU as
// go-redis/redis_rate's AllowN, and one of three limits that share a hash
// tag about 1.4 times as much (bench/README.md).
//
// A Debit whose reply is lost may have run, and a resent debit would count
// twice on meters and windows (sliding logs and concurrency limits, whose
// marks are named by the reservation id, count it once), a whole batch's
// worth when concurrent requests share the call. So every script call is
// sent once: it is a command whose NoRetry says so, which go-redis's
// clients (*redis.Client, the nodes of a *redis.Ring, *redis.ClusterClient)
// honour whatever their MaxRetries or MaxRedirects, resending it only when
// it provably was not written (a dial error, a connection that failed
// before the write). A call whose connection breaks after the write fails,
// as a store failure. A Cluster's replies that Redis gives before it runs
// a script (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) are still followed or sent
// again (see Redis Cluster). Settle and Cancel are idempotent per id. Renew of a
// concurrency item is a GET of each reservation record a settlement may
// have written (one, or one per hash tag of the reservation's items on a
// store that is not sharded), a ZSCORE of its mark, and when the lease
// moves a ZADD, a PTTL and perhaps a PEXPIRE (two ZADDs more, and the
// reads of the sum, when it is held again).
//
// # Batching
//
// Concurrent Debit, Peek, Settle, Cancel and Renew calls share script
// calls: while one script call of the store runs, the requests that arrive
// wait, and when it returns, up to RedisConfig.MaxBatch of them go in the
// next one, which runs them in their order of arrival, each all or nothing
// and each seeing the writes of those before it, at one server time. The script
// reads each meter and window key of a batch once and writes each it
// changes once, at its end, with the value and TTL that the requests one
// by one would have left; sliding logs, concurrency limits and reservation
// records are read and written request by request. A request that
// arrives while no script call runs is sent at once: batching adds no
// latency to an idle store. Each request gets its own decision; a denial
// does not affect the others. A request whose keys the script cannot read
// (a key of the wrong type, a value too short) fails alone with
// ErrUnreadable, which is not the store's failure; a script error of the
// store's (Redis unreachable, out of memory) fails every request of the
// batch with that error, and the requests of the batch may have run (as a
// request whose reply is lost may have). See BenchmarkRedisBatch in bench/README.md for what
// batching saves.
//
// Each script call runs in a goroutine of the store's, which ends with the
// call: no caller's context cancels it, and it is bounded by
// RedisConfig.ReplyTimeout. A caller waits for its request with bounds of
// its own: QueueTimeout while it is queued (then ErrOverloaded: it was not
// sent, nothing was applied) and CallTimeout once it is sent (then
// ErrUnknownOutcome: it may have run), and never past its context (then
// the context's error, with ErrOverloaded if its deadline passed while it
// was queued, or with ErrUnknownOutcome if it was sent). A Debit left with
// an unknown outcome is the store's to settle: when its reply comes and
// says it was admitted, the store cancels it (a Cancel in the same queue),
// and when no reply comes before ReplyTimeout, its reservation stays until
// its limits refill and its concurrency leases expire (a Period). Stats
// counts each case. On a sharded store each hash tag has a queue of its
// own, since one script call must stay on one slot. MaxBatch 1 turns
// batching off: every request is sent at once, in a script call of its
// own, with the same bounds.
//
// # Redis Cluster
//
// With a *redis.ClusterClient or *redis.Ring (or RedisConfig.Sharded), the
// items of a request are grouped by hash tag; the items of one group are
// debited all or nothing in one script on one slot. Groups are debited one
// after another in the order of their tags. When a group denies, or fails,
// the groups already debited are cancelled (refunded, their concurrency
// released) and the denial or error is returned; with a denial the other
// groups are then peeked, so that every item reports its state before the
// debit, as on one node (a stale group, see Generations, ends the
// debit as a failing one does: the groups before it are cancelled and its
// *StaleError is returned). After a denial or a stale group, the groups
// cancelled forget the id, as on one node a debit not admitted leaves no
// record: a Debit under the same id later (after a Restore, see
// Generations) starts a reservation that settles on every group. After
// an error they keep the id ended: a Settle or Cancel of it changes
// nothing there. Consistency across groups is therefore weaker than
// within one: a request never gets more than every limit allows, but for
// the moment between a debit and its compensation other requests can see
// the reservation and be denied. A group whose script fails is not
// compensated, since it cannot be known whether it ran; its reservation
// expires as its limits refill (one whose reply comes late is cancelled
// by the store, see Batching). Settle, Cancel, Peek and Reset act group by
// group. MOVED and ASK replies are followed by the go-redis cluster
// client; TRYAGAIN, CLUSTERDOWN and the redirections it did not follow are
// sent again by the store until the call's ReplyTimeout (while a slot
// migrates, a debit that writes a new reservation key there is answered
// TRYAGAIN until the slot's keys have moved).
//
// # Generations
//
// With RedisConfig.Generations, each hash tag T of the items' keys (the
// tag of an item key that has one; see Item.Key) has a marker key
// <prefix>g:{T}, in T's slot, kept without expiry: a decimal integer, the
// tag's generation. The debit script reads the markers of its request's
// tags (GET) and, when one is missing or below the highest value this
// store has seen for its tag (it remembers up to 65,536 tags, forgetting
// an arbitrary one for each new one past that), applies nothing and
// replies stale; Debit and Peek then return a *StaleError naming the
// tags and items. A debit admitted that writes advances each of its
// markers by one (INCR) and the store remembers the values replied, so
// that a Redis that comes back with an older marker (a replica that
// missed the latest writes, an older snapshot) is caught on the first
// call that sees it, by every client that saw a later value. Restore
// raises the counters of a tag to what the caller counted and sets the
// marker to the largest of the server's time in µs, one more than the
// marker and one more than the store has seen, in one script call per
// tag; a restored marker is thus above any value seen before it, and two
// replicas that both restore a tag settle on the later marker.
//
// What it does not cover: keys without a hash tag (the gate gives one to
// every limit it restores: a tenant's, or one of its own for the limits
// of the whole deployment): a loss there admits at most one more window
// (or one more capacity) of that limit before the counter fills again. Settle,
// Cancel and Renew neither check nor advance markers: they apply to what
// the store holds (a refund of a lost counter is clamped at empty), so a
// rollback that loses only settlements made after this store's last debit
// on the tag goes unseen (a charge above the estimate lost; the ledger
// reconciliation covers it). A marker evicted alone reads as a loss (a
// Restore more); counters evicted under a marker kept are not seen, so
// run Redis with maxmemory-policy noeviction. The markers cost the debit
// script a GET per tag, and an INCR per tag when it writes (see
// bench/README.md).
//
// Redis is safe for concurrent use. Use NewRedis to make one.
type Redis struct {
	c         Scripter
	prefix    string
	settleTTL int64 // ms
	sharded   bool
	maxBatch  int
	// maxInFlight is how many script calls of a queue run at once (see
	// batch.go).
	maxInFlight int
	// now overrides the server's clock when set, in tests that must give
	// Redis and Memory the same time.
	now func() time.Time
	// scriptCalls counts the script calls of requests, for tests.
	scriptCalls atomic.Int64
	// gens is RedisConfig.Generations; seen the highest marker values
	// replied, by tag.
	gens bool
	seen seenGens
	// inline is RedisConfig.ContextDeadlines: settlements run on their
	// callers' goroutines when their queue is idle.
	inline bool
	// The timeouts of RedisConfig; afterFunc replaces the timers in tests.
	queueTimeout, callTimeout, replyTimeout time.Duration
	afterFunc                               func(time.Duration) <-chan time.Time
	stats                                   redisStats

	mu         sync.Mutex
	queue      queue             // the queue, when not sharded
	queues     map[string]*queue // by hash tag, when sharded; only busy ones
	freeQueues []*queue
}

var _ Store = (*Redis)(nil)

var (
	//go:embed lib.lua
	libLua string
	//go:embed debit.lua
	debitLua string
	//go:embed settle.lua
	settleLua string
	//go:embed renew.lua
	renewLua string
	//go:embed restore.lua
	restoreLua string
	//go:embed batch.lua
	batchLua string
	//go:embed request.lua
	requestLua string

	batchScript = newScript(libLua + strings.NewReplacer("-- settle.lua\n", settleLua, "-- debit.lua\n", debitLua,
		"-- renew.lua\n", renewLua, "-- restore.lua\n", restoreLua).Replace(
		strings.ReplaceAll(batchLua, "-- request.lua\n", requestLua)))
	resetScript = newScript("return redis.call('DEL', unpack(KEYS))")
)

type script struct{ src, sha string }

func newScript(src string) *script {
	h := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(h[:])}
}

// NewRedis returns a store on client. It panics if cfg is invalid; check a
// config from outside with cfg.Validate first.
func NewRedis(client Scripter, cfg RedisConfig) *Redis {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	r := &Redis{
		c: client, prefix: cfg.Prefix, settleTTL: DefaultSettleTTL.Milliseconds(), sharded: cfg.Sharded,
		maxBatch: cmp.Or(cfg.MaxBatch, DefaultMaxBatch), maxInFlight: defaultMaxInFlight, gens: cfg.Generations,
		queueTimeout: cmp.Or(cfg.QueueTimeout, DefaultQueueTimeout), callTimeout: cmp.Or(cfg.CallTimeout, DefaultCallTimeout),
		replyTimeout: cmp.Or(cfg.ReplyTimeout, DefaultReplyTimeout), inline: cfg.ContextDeadlines,
	}
	if r.maxBatch == 1 {
		r.maxInFlight = math.MaxInt
	}
	if r.prefix == "" {
		r.prefix = "cg:"
	}
	if cfg.SettleTTL > 0 {
		r.settleTTL = (cfg.SettleTTL + time.Millisecond - 1).Milliseconds()
	}
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		r.sharded = true
	}
	return r
}

// run runs s by its SHA, and by its source when Redis does not know it yet
// (a NOSCRIPT reply, which Redis gives before it runs anything).
func (r *Redis) run(ctx context.Context, s *script, keys []string, args ...any) (any, error) {
	if s == batchScript {
		r.scriptCalls.Add(1)
	}
	v, err := r.eval(ctx, "evalsha", s.sha, keys, args)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = r.eval(ctx, "eval", s.src, keys, args)
	}
	if err != nil {
		return nil, fmt.Errorf("weighted: run script: %w", err)
	}
	return v, nil
}

// onceCmd is a script call that the Redis client sends at most once (see
// Redis): go-redis reads NoRetry before it resends a command whose
// connection failed.
type onceCmd struct{ *redis.Cmd }

func (onceCmd) NoRetry() bool { return true }

// eval sends EVAL or EVALSHA (name) of script with keys and args, once,
// and again only after a reply that Redis gives before it runs a script
// (see notRun), after a pause that doubles from 8 ms to 512 ms, until ctx
// ends or maxEvalAttempts calls were made: a Cluster's slot that migrates answers TRYAGAIN until its keys
// have moved, a failover CLUSTERDOWN until a replica is promoted.
func (r *Redis) eval(ctx context.Context, name, script string, keys []string, args []any) (any, error) {
	a := make([]any, 3, 3+len(keys)+len(args))
	a[0], a[1], a[2] = name, script, len(keys)
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	pause := 8 * time.Millisecond
	for attempt := 1; ; attempt, pause = attempt+1, min(2*pause, 512*time.Millisecond) {
		cmd := redis.NewCmd(ctx, a...)
		if len(keys) > 0 {
			cmd.SetFirstKeyPos(3) // the slot a Cluster client routes it to
		}
		_ = r.c.Process(ctx, onceCmd{cmd})
		v, err := cmd.Result()
		if err == nil || !notRun(err) || attempt == maxEvalAttempts {
			return v, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// maxEvalAttempts bounds how often eval sends a call answered notRun,
// whatever ctx's deadline (a caller's context may have none, and a
// cluster may stay down): about 5.6 s of pauses, as go-redis's cluster
// client's MaxRedirects of 16 bounded it.
const maxEvalAttempts = 16

// notRun reports whether err is a Cluster's reply that Redis gives before
// it runs a command and that passes when the cluster settles, so that
// sending it again cannot apply it twice: TRYAGAIN (a multi-key call on a
// slot that migrates), CLUSTERDOWN (a failover under way), and MOVED and
// ASK when a Cluster client did not follow them itself (its MaxRedirects
// spent while a slot moves). A broken connection is not one: the call may
// have run. Nor is LOADING, from a Redis that restarted and reads its
// data: it may last minutes, and the call fails at once, to the limits'
// posture, rather than waiting.
func notRun(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	s := rerr.Error()
	for _, p := range [...]string{"TRYAGAIN ", "CLUSTERDOWN ", "MOVED ", "ASK "} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// key returns the Redis key of an item: its limit's name and code, then
// its key. A key with a hash tag is written as it is, after ':'; a key
// without one is wrapped in one, "{KEY}", after ':', so that it has a
// slot of its own; a key with a hash tag that such a wrapping could give
// (it is "{...}" around a key without a hash tag, as "{x}" or "{x}}")
// goes after '~' instead. So no two keys of a limit share a Redis key, as
// no two share a counter in Memory: "x" and "{x}" are two counters.
func (r *Redis) key(it *Item) string {
	l := &it.Limit
	k := it.Key
	if hasHashTag(k) {
		if n := len(k); k[n-1] == '}' && k[0] == '{' && !hasHashTag(k[1:n-1]) {
			return r.prefix + l.Name + ":" + l.code() + "~" + k
		}
		return r.prefix + l.Name + ":" + l.code() + ":" + k
	}
	if k == "" || k[0] == '}' || k[0] == '_' {
		// "{}" or "{}..." is no hash tag to Redis: the whole key would be
		// hashed, away from the reservation record's slot (CROSSSLOT).
		// '_' marks it; a key that starts with '_' is marked too, so that
		// "" and "_" are two keys.
		return r.prefix + l.Name + ":" + l.code() + ":{_" + k + "}"
	}
	return r.prefix + l.Name + ":" + l.code() + ":{" + k + "}"
}

// leaseKey returns the key of the lease index of an item's key, in its
// slot.
func (r *Redis) leaseKey(it *Item) string {
	return r.key(it) + ":leases"
}

// MarkerMatch is the SCAN pattern of the store's generation markers (see
// RedisConfig.Generations): deleting them makes every tag stale, as a
// flush of the store would, and leaves the counters as they are.
func (r *Redis) MarkerMatch() string {
	return r.prefix + "g:{*"
}

// markerKey returns the key of the generation marker of hash tag tag.
func (r *Redis) markerKey(tag string) string {
	return r.prefix + "g:{" + tag + "}"
}

// recordKey returns the key of reservation id among keys with hash tag tag.
func (r *Redis) recordKey(tag, id string) string {
	return r.prefix + "r:{" + tag + "}:" + id
}

// hasHashTag reports whether key has a hash tag by Redis's rule: a '{'
// followed, not immediately, by a '}'.
func hasHashTag(key string) bool {
	s := strings.IndexByte(key, '{')
	return s >= 0 && strings.IndexByte(key[s+1:], '}') > 0
}

// hashTag returns the part of key that Redis Cluster hashes.
func HashTag(key string) string {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e]
		}
	}
	return key
}

// group is the items of one script call: their indexes in the request, their
// keys, and the hash tag they share.
type group struct {
	idx  []int
	keys []string
	tag  string
}

// oneGroup is the group of a store that is not sharded, with room for
// its indexes, in one allocation.
type oneGroup struct {
	gs  [1]group
	idx [4]int
}

// groups splits items into the groups of the Cluster protocol, in tag order,
// or returns them as one group when the store is not sharded. Within a
// group, meters and windows come first, as the scripts want them.
func (r *Redis) groups(items []Item) []group {
	if !r.sharded {
		one := new(oneGroup)
		g := &one.gs[0]
		g.idx = one.idx[:0]
		if len(items) > len(one.idx) {
			g.idx = make([]int, 0, len(items))
		}
		g.keys = make([]string, 0, len(items)+1)
		for pass := range 2 {
			for i := range items {
				if stringState(items[i].Limit.Algorithm) == (pass == 0) {
					g.idx, g.keys = append(g.idx, i), append(g.keys, r.key(&items[i]))
				}
			}
		}
		g.tag = HashTag(g.keys[0])
		return one.gs[:]
	}
	var gs []group
	for pass := range 2 {
		for i := range items {
			if stringState(items[i].Limit.Algorithm) != (pass == 0) {
				continue
			}
			k := r.key(&items[i])
			t := HashTag(k)
			j := slices.IndexFunc(gs, func(g group) bool { return g.tag == t })
			if j < 0 {
				gs = append(gs, group{tag: t})
				j = len(gs) - 1
			}
			gs[j].idx = append(gs[j].idx, i)
			gs[j].keys = append(gs[j].keys, k)
		}
	}
	slices.SortFunc(gs, func(a, b group) int { return cmp.Compare(a.tag, b.tag) })
	return gs
}

// strings returns how many of the group's items, its first ones, are
// meters or windows.
func (g *group) strings(items []Item) int {
	n := 0
	for _, i := range g.idx {
		if stringState(items[i].Limit.Algorithm) {
			n++
		}
	}
	return n
}

// The ops of batch.lua.
const (
	opPeek    = 0
	opDebit   = 1
	opSettle  = 2
	opRenew   = 3
	opRestore = 4
	opLease   = 5
	opClaimed = 6
	opFinal   = 7 // a debit of Final items (see Item.Final)
)

// header appends the header of a request of batch.lua: the number of items,
// of keys, the time override, the op, how many of the items (the first
// ones) are meters or windows, how long to remember a settled id (ms), the
// number of generation markers (the request's last keys, those of tags)
// and the highest value seen of each.
func (r *Redis) header(buf []byte, n, keys int, op int64, ns int, tags []string) []byte {
	return r.leaseHeader(buf, n, keys, op, ns, tags, nil, nil, nil)
}

// leaseHeader is header with the lease indexes of a request: li holds the
// positions in the request, from 1, of its leased items, whose indexes are
// its last keys, and lc the lease a Lease takes (opLease). seen, when not
// nil, holds the values seen of tags to send (see stale), else the
// store's now.
func (r *Redis) leaseHeader(buf []byte, n, keys int, op int64, ns int, tags []string, seen []int64, li []int, lc *LeaseCall) []byte {
	var now int64
	if r.now != nil {
		now = r.now().UnixMicro()
	}
	buf = appendNumber(buf, int64(n))
	buf = appendNumber(buf, int64(keys))
	buf = appendNumber(buf, now)
	buf = appendNumber(buf, op)
	buf = appendNumber(buf, int64(ns))
	buf = appendNumber(buf, r.settleTTL)
	buf = appendNumber(buf, int64(len(tags)))
	buf = appendNumber(buf, int64(len(li)))
	for j, t := range tags {
		if seen != nil {
			buf = appendNumber(buf, seen[j])
		} else {
			buf = appendNumber(buf, r.seen.get(t))
		}
	}
	for _, i := range li {
		buf = appendNumber(buf, int64(i))
	}
	if lc != nil {
		buf = appendNumber(buf, lc.TTL.Microseconds())
		buf = appendNumber(buf, int64(len(lc.Reports)))
		for _, rp := range lc.Reports {
			done := int64(0)
			if rp.Done {
				done = 1
			}
			buf = appendNumber(buf, int64(rp.Seq))
			buf = appendNumber(buf, rp.Used)
			buf = appendNumber(buf, done)
		}
	}
	return buf
}

// appendNumber appends v as the scripts read numbers: a little-endian
// IEEE 754 double, exact for the integers below 2^53 that Validate allows.
func appendNumber(buf []byte, v int64) []byte {
	return binary.LittleEndian.AppendUint64(buf, math.Float64bits(float64(v)))
}

// stringState reports whether the algorithm keeps a string value (a meter
// or a window) rather than a sorted set.
func stringState(a Algorithm) bool { return a <= FixedWindow }

// wireMonth is the algorithm code by which the scripts know a fixed window
// on calendar months (lib.lua's MONTH_WINDOW).
const wireMonth = 6

func appendItem(buf []byte, s *spec, cost int64) []byte {
	algo := int64(s.algo)
	if s.cal == Month {
		algo = wireMonth
	}
	for _, v := range [...]int64{algo, s.cap, s.rate, s.period, s.tick, cost} {
		buf = appendNumber(buf, v)
	}
	return buf
}

// evalGroup debits (opDebit, opFinal) or peeks (opPeek) one group, filling
// out.
func (r *Redis) evalGroup(ctx context.Context, id string, items []Item, ss []spec, g *group, op int64, out []ItemState) (bool, error) {
	return r.evalLease(ctx, id, items, ss, g, op, out, nil)
}

// evalLease is evalGroup, and with op opLease the Lease lc of the group's
// one item.
func (r *Redis) evalLease(ctx context.Context, id string, items []Item, ss []spec, g *group, op int64, out []ItemState, lc *LeaseCall) (bool, error) {
	// The keys: the group's, then the reservation record's, the markers'
	// and the lease indexes', in a slice of their own (g.keys is the
	// group's, for its other calls), made once.
	record := false
	for _, i := range g.idx {
		if op != opPeek && ss[i].hasRecord() && items[i].Cost > 0 {
			record = true
			break
		}
	}
	var tags []string
	if r.gens {
		var tbuf [2]string
		tags = itemTags(items, g.idx, tbuf[:0])
	}
	var lbuf [4]int
	li := lbuf[:0]
	for j, i := range g.idx {
		if items[i].Limit.Lease.On() {
			li = append(li, j+1)
		}
	}
	keys := g.keys
	if more := len(tags) + len(li); record || more > 0 {
		if record {
			more++
		}
		keys = make([]string, len(g.keys), len(g.keys)+more)
		copy(keys, g.keys)
		if record {
			keys = append(keys, r.recordKey(g.tag, id))
		}
		for _, t := range tags {
			keys = append(keys, r.markerKey(t))
		}
		for _, j := range li {
			keys = append(keys, r.leaseKey(&items[g.idx[j-1]]))
		}
	}
	// The values seen that the script compares the markers with: a
	// stale reply is judged by them (see stale).
	var sbuf [2]int64
	seen := sbuf[:0]
	for _, t := range tags {
		seen = append(seen, r.seen.get(t))
	}
	c := getCall(ctx)
	c.buf = r.leaseHeader(c.buf, len(g.idx), len(keys), op, g.strings(items), tags, seen, li, lc)
	for _, i := range g.idx {
		c.buf = appendItem(c.buf, &ss[i], items[i].Cost)
	}
	c.keys, c.id = keys, id
	if r.gens {
		c.tags = append(c.tags, tags...)
	} else {
		c.tags = itemTags(items, g.idx, c.tags)
	}
	if len(c.tags) == 0 {
		c.tags = append(c.tags, g.tag)
	}
	c.shed = true
	v, err := r.exec(c, g.tag)
	if err != nil {
		return false, err
	}
	reply, ok := v.(string)
	if ok && len(tags) > 0 && len(reply) == 8*(1+len(tags)) && replyNumber(reply, 0) == -1 {
		return false, staleReply(items, tags, seen, reply[8:])
	}
	if !ok || len(reply) != 8*(1+4*len(g.idx)+len(tags)) {
		return false, fmt.Errorf("%w: debit returned %T of %d bytes, want %d", errBadReply, v, len(reply), 8*(1+4*len(g.idx)+len(tags)))
	}
	for j, t := range tags {
		r.seen.saw(t, replyNumber(reply, 1+4*len(g.idx)+j))
	}
	for j, i := range g.idx {
		o := reply[8+32*j:]
		out[i] = ItemState{
			Allowed:    replyNumber(o, 0) == 1,
			Remaining:  replyNumber(o, 1),
			Capacity:   ss[i].cap,
			RetryAfter: micros(replyNumber(o, 2)),
			ResetAfter: micros(replyNumber(o, 3)),
		}
	}
	return replyNumber(reply, 0) == 1, nil
}

// staleReply returns the *StaleError of a stale reply: gens holds the
// values of the markers of tags, 0 for a missing one, and seen the values
// seen that the call sent, which the script compared them with. A tag is
// stale when the script found it so, never because another call's reply
// has raised the value seen since: a marker at or above what this call
// sent was whole when the script read it, and judged by the value seen
// now, a tag that other calls were debiting read as stale whenever this
// call was stale for another tag (a tenant's first call after a loss),
// and a shared tag (a rate limit domain's) was restored again for each.
func staleReply(items []Item, tags []string, seen []int64, gens string) error {
	var stale []string
	for j, t := range tags {
		if g := replyNumber(gens, j); g == 0 || g < seen[j] {
			stale = append(stale, t)
		}
	}
	return staleError(items, stale)
}

// replyNumber returns the k-th double of a script's reply, as an integer.
func replyNumber(reply string, k int) int64 {
	return int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[8*k : 8*k+8]))))
}

// Debit implements Store.
func (r *Redis) Debit(ctx context.Context, id string, items []Item) (Result, error) {
	return r.DebitInto(ctx, id, items, nil)
}

// DebitInto is Debit with the result's item states kept in states when it
// has room for one per item (see StatesDebiter). The result's Items alias
// states.
func (r *Redis) DebitInto(ctx context.Context, id string, items []Item, states []ItemState) (Result, error) {
	if id == "" {
		return Result{}, errNoID
	}
	if len(items) == 0 {
		return Result{Allowed: true, Decider: -1}, nil
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return Result{}, err
	}
	res := Result{Items: statesFor(states, len(items))}
	op := int64(opDebit)
	if final(items) {
		op = opFinal
	}
	gs := r.groups(items)
	for k := range gs {
		ok, err := r.evalGroup(ctx, id, items, ss, &gs[k], op, res.Items)
		if err == nil && ok {
			continue
		}
		// Compensate the groups already debited. A denial or a stale tag
		// tells the caller that nothing was debited, and it may debit
		// again under the same id (Leased does when its leases held the
		// units refused; the caller of a stale debit does once the tag is
		// restored): the compensation then forgets the id, as a group
		// never debited knows nothing of it, so that the reservation
		// admitted then settles there (and a second compensation refunds
		// it). After an error the id stays ended there: a Cancel of what
		// the failed group may have debited refunds the others no second
		// time.
		forget := err == nil || errors.Is(err, ErrStale)
		var errs []error
		for c := range k {
			if cerr := r.settleGroup(ctx, id, items, ss, &gs[c], nil, forget); cerr != nil {
				errs = append(errs, cerr)
			}
		}
		if err != nil {
			return Result{}, errors.Join(append([]error{err}, errs...)...)
		}
		// Fill the result as a denied debit reports it, every item's
		// state before its cost: peek the groups compensated, whose
		// replies described them after it, and those not reached.
		for p := range gs {
			if p == k || len(errs) > 0 {
				continue
			}
			if _, perr := r.evalGroup(ctx, id, items, ss, &gs[p], opPeek, res.Items); perr != nil {
				errs = append(errs, perr)
			}
		}
		if len(errs) > 0 {
			return Result{}, errors.Join(errs...)
		}
		break
	}
	res.decide()
	return res, nil
}

// Peek implements Store.
func (r *Redis) Peek(ctx context.Context, items []Item) (Result, error) {
	if len(items) == 0 {
		return Result{Allowed: true, Decider: -1}, nil
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return Result{}, err
	}
	res := Result{Items: make([]ItemState, len(items))}
	for _, g := range r.groups(items) {
		if _, err := r.evalGroup(ctx, "", items, ss, &g, opPeek, res.Items); err != nil {
			return Result{}, err
		}
	}
	res.decide()
	return res, nil
}

// Settle implements Store.
func (r *Redis) Settle(ctx context.Context, id string, items []Item, actual []int64) error {
	if err := checkSettle(id, items, actual); err != nil {
		return err
	}
	return r.settle(ctx, id, items, actual)
}

// Cancel implements Store.
func (r *Redis) Cancel(ctx context.Context, id string, items []Item) error {
	if id == "" {
		return errNoID
	}
	return r.settle(ctx, id, items, nil)
}

func (r *Redis) settle(ctx context.Context, id string, items []Item, actual []int64) error {
	if len(items) == 0 {
		return nil
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return err
	}
	var errs []error
	for _, g := range r.groups(items) {
		if err := r.settleGroup(ctx, id, items, ss, &g, actual, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// settleGroup settles one group; nil actual cancels. With forget, the
// group's record of id is deleted rather than marked settled: a later
// debit of id there starts a reservation that settles.
func (r *Redis) settleGroup(ctx context.Context, id string, items []Item, ss []spec, g *group, actual []int64, forget bool) error {
	keys := append(g.keys[:len(g.keys):len(g.keys)], r.recordKey(g.tag, id))
	c := getCall(ctx)
	c.buf = r.header(c.buf, len(g.idx), len(keys), opSettle, g.strings(items), nil)
	if forget {
		// The header's time to remember a settled id: 0 deletes the record.
		binary.LittleEndian.PutUint64(c.buf[8*5:], math.Float64bits(0))
	}
	for _, i := range g.idx {
		c.buf = appendItem(c.buf, &ss[i], items[i].Cost)
		c.buf = appendNumber(c.buf, actualCost(items, ss, actual, i))
	}
	c.keys, c.id = keys, id
	c.tags = callTags(c.tags, items, g)
	_, err := r.execSettle(c, g.tag)
	return err
}

// callTags appends to tags those of a call of group g of items (see
// call.tags): the items' own hash tags, else the group's.
func callTags(tags []string, items []Item, g *group) []string {
	tags = itemTags(items, g.idx, tags)
	if len(tags) == 0 {
		tags = append(tags, g.tag)
	}
	return tags
}

// A Claim records how a reservation ended, for the replicas that may end
// it (settle, cancel, expire) to agree on the first: see Claimer.
type Claim struct {
	// Key is the Redis key that records it; on a sharded store it must
	// share the items' hash tag.
	Key string
	// Value is what it records: not empty, at most MaxClaim bytes.
	Value string
	// TTL is how long it is kept: at least a millisecond.
	TTL time.Duration
}

// MaxClaim bounds a Claim's Value.
const MaxClaim = 1024

// ErrUnclaimable is a Claimer's answer when it cannot claim in the call
// that settles: the items span more than one script call (hash tags of a
// sharded store), the claim's key is in another slot, or some items are
// spent from leases. Nothing was changed; the caller claims on its own.
var ErrUnclaimable = errors.New("weighted: this reservation cannot be claimed in the call that settles it")

// A Claimer settles or cancels a reservation and claims its end in one
// atomic call.
type Claimer interface {
	// SettleClaimed settles reservation id (actual as Settle reads it)
	// or, with actual nil, cancels it, and records c, in one atomic call,
	// unless c.Key records an end already: then it changes nothing and
	// returns won false and that record. Settling an id settled without a
	// claim records c and changes nothing else. A store with generation
	// markers that finds no record at c.Key and the marker of one of the
	// items' tags missing or behind (see RedisConfig.Generations) changes
	// nothing and fails with a *StaleError: the claim may have been lost
	// with the tag's state. Restore the tags, and ask whoever knows how
	// the reservation ended (a ledger) before claiming again.
	SettleClaimed(ctx context.Context, id string, items []Item, actual []int64, c Claim) (won bool, prior string, err error)
}

var _ Claimer = (*Redis)(nil)

// SettleClaimed is s's SettleClaimed when s is a Claimer, else
// ErrUnclaimable: for the stores that wrap another.
func SettleClaimed(ctx context.Context, s Store, id string, items []Item, actual []int64, c Claim) (bool, string, error) {
	cs, ok := s.(Claimer)
	if !ok {
		return false, "", ErrUnclaimable
	}
	return cs.SettleClaimed(ctx, id, items, actual, c)
}

// SettleClaimed implements Claimer: one script call, which the claim's
// key joins, for items of one hash tag.
func (r *Redis) SettleClaimed(ctx context.Context, id string, items []Item, actual []int64, c Claim) (bool, string, error) {
	if actual != nil {
		if err := checkSettle(id, items, actual); err != nil {
			return false, "", err
		}
	} else if id == "" {
		return false, "", errNoID
	}
	if c.Value == "" || len(c.Value) > MaxClaim || c.Key == "" || c.TTL < time.Millisecond {
		return false, "", fmt.Errorf("weighted: invalid claim (key %q, %d bytes, TTL %s)", c.Key, len(c.Value), c.TTL)
	}
	if len(items) == 0 {
		return false, "", ErrUnclaimable
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return false, "", err
	}
	gs := r.groups(items)
	if len(gs) != 1 || r.sharded && HashTag(c.Key) != gs[0].tag {
		return false, "", ErrUnclaimable
	}
	g := &gs[0]
	keys := append(g.keys[:len(g.keys):len(g.keys)], r.recordKey(g.tag, id), c.Key)
	var tags []string
	if r.gens {
		// The markers of the items' tags, read when no claim is found: a
		// claim lost with the tags' state is no claim (a *StaleError).
		tags = itemTags(items, g.idx, nil)
		for _, t := range tags {
			keys = append(keys, r.markerKey(t))
		}
	}
	call := getCall(ctx)
	call.buf = r.header(call.buf, len(g.idx), len(keys), opClaimed, g.strings(items), tags)
	call.buf = appendNumber(call.buf, (c.TTL + time.Millisecond - 1).Milliseconds())
	call.buf = appendNumber(call.buf, int64(len(c.Value)))
	call.buf = append(call.buf, c.Value...)
	for _, i := range g.idx {
		call.buf = appendItem(call.buf, &ss[i], items[i].Cost)
		call.buf = appendNumber(call.buf, actualCost(items, ss, actual, i))
	}
	call.keys, call.id = keys, id
	call.tags = callTags(call.tags, items, g)
	v, err := r.execSettle(call, g.tag)
	if err != nil {
		return false, "", err
	}
	if prior, ok := v.(string); ok {
		return false, prior, nil
	}
	if n, ok := v.(int64); ok && n < 0 && len(tags) > 0 {
		// Minus the mask of the stale tags' markers.
		var stale []string
		for j, t := range tags {
			if j < 62 && -n&(1<<j) != 0 {
				stale = append(stale, t)
			}
		}
		return false, "", staleError(items, stale)
	}
	return true, "", nil
}

// Renew implements Store. It sends only the concurrency items, group by
// group, and nothing when there are none. Each group's call reads the
// records that a Settle or Cancel of id may have written (see
// renewKeys), to hold again a lease gone only when id has not ended.
func (r *Redis) Renew(ctx context.Context, id string, items []Item) error {
	if id == "" {
		return errNoID
	}
	var ibuf [4]Item
	all := items
	items = leases(items, ibuf[:0])
	if len(items) == 0 {
		return nil
	}
	var sbuf [4]spec
	ss, err := specs(items, sbuf[:0], true)
	if err != nil {
		return err
	}
	var errs []error
	for _, g := range r.groups(items) {
		keys := r.renewKeys(&g, all, id)
		c := getCall(ctx)
		c.buf = r.header(c.buf, len(g.idx), len(keys), opRenew, 0, nil)
		for _, i := range g.idx {
			c.buf = appendItem(c.buf, &ss[i], items[i].Cost)
		}
		c.keys, c.id = keys, id
		c.tags = callTags(c.tags, items, &g)
		if _, err := r.exec(c, g.tag); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// renewKeys returns the keys of a renewal of group g of reservation id:
// its items' keys, its record key, then the other record keys of id that
// a Settle or Cancel of a part of all (the reservation's items) may have
// written. On a store that is not sharded, the one group's record is
// under the tag of the first key of the items settled, which may be any
// of all's. On a sharded store, a group's record is under its own tag,
// which every settlement of its concurrency items writes.
func (r *Redis) renewKeys(g *group, all []Item, id string) []string {
	keys := make([]string, len(g.keys), len(g.keys)+2)
	copy(keys, g.keys)
	keys = append(keys, r.recordKey(g.tag, id))
	if r.sharded {
		return keys
	}
	var tbuf [4]string
	tags := append(tbuf[:0], g.tag)
	for i := range all {
		t := r.keyTag(&all[i])
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
			keys = append(keys, r.recordKey(t, id))
		}
	}
	return keys
}

// keyTag returns HashTag(r.key(it)), without making the key when the
// item's key has a hash tag that is the Redis key's.
func (r *Redis) keyTag(it *Item) string {
	if hasHashTag(it.Key) && strings.IndexByte(r.prefix, '{') < 0 && strings.IndexByte(it.Limit.Name, '{') < 0 {
		return HashTag(it.Key)
	}
	return HashTag(r.key(it))
}

// Restore implements Restorer: one script call per group of items (see
// Redis Cluster), each atomic, that raises the counters and sets the
// markers of its tags. It needs no Generations to raise counters, and
// writes markers only with it.
func (r *Redis) Restore(ctx context.Context, items []Item, counted []int64) error {
	return r.restore(ctx, items, counted, r.gens, nil)
}

// RestoreCounters implements Restorer: Restore without the markers.
func (r *Redis) RestoreCounters(ctx context.Context, items []Item, counted []int64) error {
	return r.restore(ctx, items, counted, false, nil)
}

// RestoreStage implements StagedRestorer: each call notes the stage it
// made under each tag of its items (a key of the tag's slot, beside its
// marker), and each call after the first checks the note of the one
// before it, in the same script call as its writes.
func (r *Redis) RestoreStage(ctx context.Context, items []Item, counted []int64, s Stage) error {
	if s.ID == "" || strings.Contains(s.ID, "|") || s.Step < 0 {
		return fmt.Errorf("%w: a restore stage needs an id without '|' and a step of 0 or more", ErrInvalidCost)
	}
	return r.restore(ctx, items, counted, s.Last && r.gens, &s)
}

// The modes of a restore (batch.lua's remember, for op 4): plain, a
// stage's first call, a later one, its last.
const (
	restorePlain = 0
	restoreFirst = 1
	restoreNext  = 2
	restoreLast  = 3
)

// restore is Restore, the markers written when mark is set, as stage s
// when s is not nil (see StagedRestorer).
func (r *Redis) restore(ctx context.Context, items []Item, counted []int64, mark bool, s *Stage) error {
	var sbuf [4]spec
	ss, err := checkRestore(items, counted, sbuf[:0])
	if err != nil || len(items) == 0 {
		return err
	}
	mode, id := int64(restorePlain), ""
	if s != nil {
		// The note a call leaves is "ID:step"; a later call checks for
		// the one before it and leaves its own (the request's id is
		// "expected|new").
		mode, id = restoreNext, s.ID+":"+strconv.Itoa(s.Step-1)+"|"+s.ID+":"+strconv.Itoa(s.Step)
		switch {
		case s.Step == 0:
			mode = restoreFirst
		case s.Last:
			mode = restoreLast
		}
	}
	for _, g := range r.groups(items) {
		keys := g.keys
		var tags, noted []string
		if s != nil {
			noted = itemTags(items, g.idx, nil)
			keys = keys[:len(keys):len(keys)]
			for _, t := range noted {
				keys = append(keys, r.noteKey(t))
			}
		}
		if mark {
			tags = itemTags(items, g.idx, nil)
			keys = keys[:len(keys):len(keys)]
			for _, t := range tags {
				keys = append(keys, r.markerKey(t))
			}
		}
		c := getCall(ctx)
		at := len(c.buf)
		c.buf = r.header(c.buf, len(g.idx), len(keys), opRestore, g.strings(items), tags)
		binary.LittleEndian.PutUint64(c.buf[at+40:], math.Float64bits(float64(mode))) // remember: the mode
		for _, i := range g.idx {
			c.buf = appendItem(c.buf, &ss[i], 0)
			c.buf = appendNumber(c.buf, counted[i])
		}
		c.keys, c.id = keys, id
		c.tags = callTags(c.tags, items, &g)
		v, err := r.exec(c, g.tag)
		if err != nil {
			return err
		}
		reply, ok := v.(string)
		if ok && s != nil && len(reply) == 8 && replyNumber(reply, 0) == -1 {
			// The note of the call before is gone: the store lost its
			// data since. Nothing was written.
			return staleError(items, noted)
		}
		if !ok || len(reply) != 8*(1+len(tags)) {
			return fmt.Errorf("%w: restore returned %T of %d bytes, want %d", errBadReply, v, len(reply), 8*(1+len(tags)))
		}
		for j, t := range tags {
			r.seen.saw(t, replyNumber(reply, 1+j))
		}
	}
	return nil
}

// noteKey returns the key of the note of a staged restore of hash tag
// tag (see RestoreStage).
func (r *Redis) noteKey(tag string) string {
	return r.prefix + "gr:{" + tag + "}"
}

// Reset implements Store.
func (r *Redis) Reset(ctx context.Context, items []Item) error {
	if len(items) == 0 {
		return nil
	}
	var sbuf [4]spec
	if _, err := specs(items, sbuf[:0], false); err != nil {
		return err
	}
	for _, g := range r.groups(items) {
		keys := g.keys
		for _, i := range g.idx {
			if items[i].Limit.Lease.On() {
				keys = append(keys, r.leaseKey(&items[i]))
			}
		}
		if _, err := r.run(ctx, resetScript, keys); err != nil {
			return err
		}
	}
	return nil
}
