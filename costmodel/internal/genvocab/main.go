// Command genvocab writes the vocabularies that costmodel embeds: for each
// encoding, every token id's bytes in id order, read from the vocabulary
// github.com/tiktoken-go/tokenizer embeds. Run it with go generate in
// costmodel; TestVocabularyIsTheTokenizers fails when a file differs from
// that module's vocabulary.
//
// The format (see costmodel's vocab.go): for each id from 0, its token's
// length as a uvarint, then its bytes; a length of 0 is an id that is no
// token. The file ends after the last token.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tiktoken-go/tokenizer"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: genvocab DIR")
		os.Exit(2)
	}
	for _, enc := range []tokenizer.Encoding{tokenizer.O200kBase, tokenizer.Cl100kBase} {
		if err := write(filepath.Join(os.Args[1], string(enc)+".vocab"), enc); err != nil {
			fmt.Fprintln(os.Stderr, "genvocab:", err)
			os.Exit(1)
		}
	}
}

func write(path string, enc tokenizer.Encoding) error {
	codec, err := tokenizer.Get(enc)
	if err != nil {
		return err
	}
	var out, pending []byte
	ids := make([]uint, 1)
	// An id that decodes to nothing is no token; 4,096 in a row end the
	// vocabulary (its special tokens, which clients' text never is, lie
	// beyond).
	for id, misses := uint(0), 0; misses < 4096; id++ {
		ids[0] = id
		s, err := codec.Decode(ids)
		if err != nil || s == "" {
			misses++
			pending = binary.AppendUvarint(pending, 0)
			continue
		}
		misses = 0
		out = append(out, pending...)
		pending = pending[:0]
		out = binary.AppendUvarint(out, uint64(len(s)))
		out = append(out, s...)
	}
	return os.WriteFile(path, out, 0o644)
}
