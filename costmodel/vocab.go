package costmodel

// The encodings' vocabularies, embedded in the binary.
//
// Each file holds, for every token id from 0, its token's length as a
// uvarint and then its bytes (a length of 0: the id is no token), as
// internal/genvocab writes them from github.com/tiktoken-go/tokenizer's
// vocabularies (TestVocabularyIsTheTokenizers checks that they still are).
//
// The ranks are kept where the garbage collector need not look: the token
// bytes are the embedded strings themselves (read-only data, not heap),
// and the tables hold offsets and numbers, no pointers, so that the
// ~300,000 tokens cost a collection cycle nothing to mark.

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
)

//go:generate go run ./internal/genvocab vocab

var (
	//go:embed vocab/o200k_base.vocab
	o200kVocab string
	//go:embed vocab/cl100k_base.vocab
	cl100kVocab string
)

// token is the bytes of one token id in its vocabulary, vocab[off:off+n];
// n is 0 for an id that is no token.
type token struct{ off, n uint32 }

// readVocab returns the tokens of a vocabulary, indexed by id.
func readVocab(vocab string) ([]token, error) {
	var toks []token
	for off := 0; off < len(vocab); {
		n, k := binary.Uvarint([]byte(vocab[off:min(off+binary.MaxVarintLen64, len(vocab))]))
		if k <= 0 || n > uint64(len(vocab)-off-k) {
			return nil, fmt.Errorf("token %d: bad length at byte %d", len(toks), off)
		}
		off += k
		toks = append(toks, token{off: uint32(off), n: uint32(n)})
		off += int(n)
	}
	if len(toks) == 0 || len(toks) > math.MaxUint32 {
		return nil, errors.New("no tokens")
	}
	return toks, nil
}

// tableBits is the log2 of an open-addressing table's size for n keys at a
// load factor of at most 1/2.
func tableBits(n int) uint {
	return max(1, uint(bits.Len(uint(2*n-1))))
}

// longRanks is an open-addressing hash table from tokens of more than 7
// bytes to ranks, without pointers but its vocabulary's.
type longRanks struct {
	vocab string
	slots []longSlot
	seed  maphash.Seed
	shift uint
}

// longSlot is one token of a longRanks: vocab[off:off+n] has rank rank;
// tag is the top bits of its hash, to compare few strings. n is 0 in an
// empty slot.
type longSlot struct {
	off, rank uint32
	n, tag    uint16
}

func newLongRanks(vocab string, toks []token) longRanks {
	n := 0
	for _, tk := range toks {
		if tk.n > 7 {
			n++
		}
	}
	b := tableBits(n)
	t := longRanks{vocab: vocab, slots: make([]longSlot, 1<<b), seed: maphash.MakeSeed(), shift: 64 - b}
	for rank, tk := range toks {
		if tk.n <= 7 {
			continue
		}
		if tk.n > math.MaxUint16 {
			panic(fmt.Sprintf("costmodel: token %d is %d bytes long", rank, tk.n))
		}
		s, tag := t.slot(vocab[tk.off : tk.off+tk.n])
		// A token spelled twice keeps its last id, as a map would.
		*s = longSlot{off: tk.off, rank: uint32(rank), n: uint16(tk.n), tag: tag}
	}
	return t
}

// slot returns the slot of b: its own, or the empty one where it belongs,
// and b's tag.
func (t *longRanks) slot(b string) (*longSlot, uint16) {
	h := maphash.String(t.seed, b)
	tag := uint16(h)
	mask := uint64(len(t.slots) - 1)
	for i := h >> t.shift; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.n == 0 || s.tag == tag && int(s.n) == len(b) && t.vocab[s.off:s.off+uint32(s.n)] == b {
			return s, tag
		}
	}
}

// get returns the rank of b, or noRank.
func (t *longRanks) get(b string) uint32 {
	if s, _ := t.slot(b); s.n != 0 {
		return s.rank
	}
	return noRank
}
