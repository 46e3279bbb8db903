package costmodel

import (
	"hash/maphash"
	"sync"
)

// countCache remembers token counts of message bodies, keyed by a 64-bit
// hash of their raw JSON bytes and the way they were counted (encoding and
// message format). A 20-turn conversation resends its first 19 messages
// unchanged on every turn; with the cache only the new message is counted.
//
// Memory is bounded: the cache has two generations of at most half its
// entries each; when the current one fills up, the previous one is dropped
// and the current one becomes the previous one. An entry used in the last
// generation is copied forward, so what is in use stays. The cache is split
// into shards, each with its own lock, so concurrent requests rarely wait
// for one another. It is safe for concurrent use.
//
// A 64-bit hash can collide: two different messages of the same format with
// the same hash (probability about n²/2⁶⁵ among n cached messages, below
// 10⁻¹⁰ for 65,536 entries) would share a count. The key also holds the
// byte length, which makes a collision rarer still.
type countCache struct {
	seed     maphash.Seed
	shards   [cacheShards]cacheShard
	perShard int
}

const cacheShards = 16

type cacheKey struct {
	hash   uint64
	length uint32
	format uint32 // encoding and message format, see countFormat
}

type cacheShard struct {
	mu   sync.Mutex
	cur  map[cacheKey]tokenCount
	prev map[cacheKey]tokenCount
}

func newCountCache(entries int) *countCache {
	c := &countCache{seed: maphash.MakeSeed(), perShard: max(entries/cacheShards/2, 1)}
	for i := range c.shards {
		c.shards[i].cur = make(map[cacheKey]tokenCount)
	}
	return c
}

func (c *countCache) key(format uint32, raw []byte) cacheKey {
	return cacheKey{hash: maphash.Bytes(c.seed, raw), length: uint32(len(raw)), format: format}
}

func (c *countCache) get(k cacheKey) (tokenCount, bool) {
	s := &c.shards[k.hash%cacheShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.cur[k]; ok {
		return v, true
	}
	if v, ok := s.prev[k]; ok {
		s.putLocked(c.perShard, k, v)
		return v, true
	}
	return tokenCount{}, false
}

func (c *countCache) put(k cacheKey, v tokenCount) {
	s := &c.shards[k.hash%cacheShards]
	s.mu.Lock()
	s.putLocked(c.perShard, k, v)
	s.mu.Unlock()
}

func (s *cacheShard) putLocked(limit int, k cacheKey, v tokenCount) {
	if len(s.cur) >= limit {
		s.prev = s.cur
		s.cur = make(map[cacheKey]tokenCount, limit)
	}
	s.cur[k] = v
}

// counted returns the count of raw, a message or tool list of the given
// format counted for model m, from the cache, or else from count, caching
// what count returns without error.
func (e *Estimator) counted(m model, format uint32, raw []byte, count func() (tokenCount, error)) (tokenCount, error) {
	if e.cache == nil {
		return count()
	}
	key := e.cache.key(formatKey(m, format), raw)
	if n, ok := e.cache.get(key); ok {
		return n, nil
	}
	n, err := count()
	if err != nil {
		return tokenCount{}, err
	}
	e.cache.put(key, n)
	return n, nil
}

// tokenCount is the count of a message or a tool list: its tokens, the
// part of them that is audio, the web searches they allow, and whether it holds parts that costgate
// cannot count exactly (see parts.go).
type tokenCount struct {
	n, audio int64
	searches int64 // web searches reserved (Anthropic's web search tool); a Responses tool list's web search tools
	fetches  int64 // web fetches without max_content_tokens (each reserves the server context)
	// A Responses tool list's file search tools, MCP servers and the
	// gigabytes of the containers its tools create.
	fileSearches, mcps, containerGB int64
	audioRefs                       int64 // previous answers' audio named by id (chat)
	uncounted                       bool
	stored                          bool         // names server-side state (an item_reference): reserves the server context once
	cacheTTL                        int8         // the longest cache_control lifetime asked: 0 none, 1 five minutes, 2 one hour
	others                          []otherModel // other models the request may run (an advisor tool's)
}

// otherModel is a model other than the one asked for that a request may
// run: calls times, each reading the prompt and writing output tokens.
type otherModel struct {
	model         string
	calls, output int64
}

// add adds o to c, saturating.
func (c *tokenCount) add(o tokenCount) {
	c.n = addSat(c.n, o.n)
	c.audio = addSat(c.audio, o.audio)
	c.searches = addSat(c.searches, o.searches)
	c.fetches = addSat(c.fetches, o.fetches)
	c.audioRefs = addSat(c.audioRefs, o.audioRefs)
	c.fileSearches = addSat(c.fileSearches, o.fileSearches)
	c.mcps = addSat(c.mcps, o.mcps)
	c.containerGB = addSat(c.containerGB, o.containerGB)
	c.uncounted = c.uncounted || o.uncounted
	c.stored = c.stored || o.stored
	c.cacheTTL = max(c.cacheTTL, o.cacheTTL)
	c.others = append(c.others[:len(c.others):len(c.others)], o.others...)
}

// len returns the number of entries held, both generations included.
func (c *countCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.cur) + len(s.prev)
		s.mu.Unlock()
	}
	return n
}
