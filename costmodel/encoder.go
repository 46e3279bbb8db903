package costmodel

// Byte-pair encoding, counting only.
//
// An encoder holds one encoding's merge ranks (token bytes to rank; in
// tiktoken's encodings a token's rank is its id). Counting a text splits it
// into pieces (pretokenize.go); a piece that is a token costs one map
// lookup; any other piece is merged the way tiktoken merges it: start from
// single bytes and repeatedly merge the adjacent pair whose concatenation
// has the lowest rank, leftmost first, until no pair is a token. The number
// of parts left is the piece's token count. Short pieces are merged in a
// stack array with linear scans; long ones (a run of letters without
// spaces, base64) with a heap, so that their cost is O(n log n): a piece of
// 200,000 spaces took about 0.2 s on the benchmark machine, where counting
// ordinary text takes 25 to 80 ns per token. The proxy's body size limit
// bounds what one request can cost.
//
// The ranks are read once per process from vocabularies embedded in the
// binary (vocab.go), so nothing is downloaded at run time.

import (
	"math"
	"sync"
)

// encoder counts the tokens of a string with one BPE encoding. It is
// read-only after construction and safe for concurrent use.
type encoder struct {
	name   string
	short  shortRanks                // tokens of at most 7 bytes
	long   longRanks                 // longer tokens
	maxLen int                       // the longest token, in bytes: no longer string is looked up
	next   func(s string, i int) int // the pre-tokenizer
}

// Count returns the number of tokens of s, special tokens counted as
// ordinary text (as the OpenAI API counts text a client sends).
func (e *encoder) Count(s string) int {
	s = validUTF8(s)
	n := 0
	for i := 0; i < len(s); {
		j := e.next(s, i)
		n += e.pieceTokens(s[i:j])
		i = j
	}
	return n
}

func (e *encoder) pieceTokens(p string) int {
	if e.rank(p) != noRank {
		return 1
	}
	if len(p) <= smallPiece {
		return e.mergeSmall(p)
	}
	return e.mergeHeap(p)
}

const (
	smallPiece = 128
	noRank     = math.MaxUint32
)

func (e *encoder) rank(b string) uint32 {
	if len(b) <= 7 {
		return e.short.get(packShort(b))
	}
	if len(b) > e.maxLen {
		return noRank // cheap: a long run (spaces, one repeated symbol) merges into parts this long
	}
	return e.long.get(b)
}

// packShort packs a string of 1 to 7 bytes and its length into a non-zero
// uint64.
func packShort(b string) uint64 {
	k := uint64(len(b)) << 56
	for i := 0; i < len(b); i++ {
		k |= uint64(b[i]) << (8 * i)
	}
	return k
}

// shortRanks is an open-addressing hash table from packed short tokens to
// ranks: most lookups during merges are of two to six bytes, and hashing a
// uint64 is much cheaper than hashing and comparing a string. It is
// read-only after construction.
type shortRanks struct {
	keys  []uint64 // 0 marks an empty slot; packed keys are never 0
	vals  []uint32
	shift uint
}

func newShortRanks(vocab string, toks []token) shortRanks {
	n := 0
	for _, tk := range toks {
		if tk.n <= 7 {
			n++
		}
	}
	t := shortRanks{shift: 64 - tableBits(n)}
	t.keys, t.vals = make([]uint64, 1<<(64-t.shift)), make([]uint32, 1<<(64-t.shift))
	mask := uint64(len(t.keys) - 1)
	for rank, tk := range toks {
		if tk.n == 0 || tk.n > 7 {
			continue
		}
		key := packShort(vocab[tk.off : tk.off+tk.n])
		for h := (key * 0x9E3779B97F4A7C15) >> t.shift; ; h = (h + 1) & mask {
			if t.keys[h] == 0 || t.keys[h] == key { // a token spelled twice: its last id, as tiktoken's map has it
				t.keys[h], t.vals[h] = key, uint32(rank)
				break
			}
		}
	}
	return t
}

func (t *shortRanks) get(key uint64) uint32 {
	mask := uint64(len(t.keys) - 1)
	for h := (key * 0x9E3779B97F4A7C15) >> t.shift; ; h = (h + 1) & mask {
		switch t.keys[h] {
		case key:
			return t.vals[h]
		case 0:
			return noRank
		}
	}
}

// mergeSmall merges a piece of at most smallPiece bytes. starts[k] is the
// offset of part k; ranks[k] the rank of parts k and k+1 merged.
func (e *encoder) mergeSmall(p string) int {
	var startsBuf [smallPiece + 1]int32
	var ranksBuf [smallPiece + 1]uint32
	n := len(p)
	starts, ranks := startsBuf[:n+1], ranksBuf[:n+1]
	for i := range starts {
		starts[i] = int32(i)
	}
	for i := 0; i < n-1; i++ {
		ranks[i] = e.rank(p[i : i+2])
	}
	ranks[n-1], ranks[n] = noRank, noRank
	parts := n // number of parts; starts[parts] == n
	for parts > 1 {
		best, bi := uint32(noRank), -1
		for k := 0; k < parts-1; k++ {
			if ranks[k] < best {
				best, bi = ranks[k], k
			}
		}
		if bi < 0 {
			break
		}
		// Merge parts bi and bi+1: drop start bi+1.
		copy(starts[bi+1:parts], starts[bi+2:parts+1])
		copy(ranks[bi+1:parts], ranks[bi+2:parts+1])
		parts--
		if bi+1 < parts {
			ranks[bi] = e.rank(p[starts[bi]:starts[bi+2]])
		} else {
			ranks[bi] = noRank
		}
		if bi > 0 {
			ranks[bi-1] = e.rank(p[starts[bi-1]:starts[bi+1]])
		}
	}
	return parts
}

// mergeHeap merges a long piece with a doubly linked list of parts and a
// min-heap of candidate pairs ordered by rank, then offset.
func (e *encoder) mergeHeap(p string) int {
	n := int32(len(p))
	next := make([]int32, n+1)
	prev := make([]int32, n+1)
	rank := make([]uint32, n+1)
	for i := int32(0); i <= n; i++ {
		next[i], prev[i], rank[i] = i+1, i-1, noRank
	}
	next[n] = -1
	pairRank := func(i int32) uint32 {
		j := next[i]
		if j < 0 || j >= n {
			return noRank
		}
		k := next[j]
		if k < 0 {
			return noRank
		}
		return e.rank(p[i:k])
	}
	h := make(pairHeap, 0, n)
	for i := int32(0); i < n-1; i++ {
		if r := pairRank(i); r != noRank {
			rank[i] = r
			h = append(h, pairCand{r, i})
		}
	}
	h.init()
	parts := int(n)
	for len(h) > 0 {
		c := h.pop()
		i := c.off
		if rank[i] != c.rank || next[i] < 0 {
			continue // stale
		}
		j := next[i]
		k := next[j]
		next[i] = k
		if k >= 0 {
			prev[k] = i
		}
		next[j], rank[j] = -1, noRank
		parts--
		for _, b := range [2]int32{i, prev[i]} {
			if b < 0 {
				continue
			}
			rank[b] = pairRank(b)
			if rank[b] != noRank {
				h.push(pairCand{rank[b], b})
			}
		}
	}
	return parts
}

type pairCand struct {
	rank uint32
	off  int32
}

type pairHeap []pairCand

func (h pairHeap) less(a, b int) bool {
	if h[a].rank != h[b].rank {
		return h[a].rank < h[b].rank
	}
	return h[a].off < h[b].off
}

func (h pairHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *pairHeap) push(c pairCand) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s.less(i, parent) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

func (h *pairHeap) pop() pairCand {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	*h = s[:last]
	h.down(0)
	return top
}

func (h pairHeap) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if r := c + 1; r < len(h) && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

var (
	encodersOnce sync.Once
	o200k        *encoder
	cl100k       *encoder
)

// loadEncoders builds the encoders once per process; every Estimator shares
// them. It takes a few tens of milliseconds of CPU.
func loadEncoders() {
	encodersOnce.Do(func() {
		loadClasses()
		o200k = newEncoder(EncodingO200k, o200kVocab, nextO200k)
		cl100k = newEncoder(EncodingCl100k, cl100kVocab, nextCl100k)
	})
}

// newEncoder builds an encoder from its embedded vocabulary (vocab.go).
func newEncoder(name, vocab string, next func(string, int) int) *encoder {
	toks, err := readVocab(vocab)
	if err != nil {
		panic("costmodel: vocabulary " + name + ": " + err.Error())
	}
	maxLen := 0
	for _, tk := range toks {
		maxLen = max(maxLen, int(tk.n))
	}
	return &encoder{name: name, short: newShortRanks(vocab, toks), long: newLongRanks(vocab, toks), maxLen: maxLen, next: next}
}

// encoderFor returns the encoder of an encoding name; anthropic-approx
// counts with cl100k_base (see anthropic.go).
func encoderFor(name string) *encoder {
	loadEncoders()
	if name == EncodingO200k {
		return o200k
	}
	return cl100k
}
