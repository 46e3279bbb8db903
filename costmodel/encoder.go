package costmodel

import (
	"sync"

	"github.com/tiktoken-go/tokenizer"
)

// encoder counts the tokens of a string with one BPE encoding. It is safe
// for concurrent use.
type encoder struct {
	name  string
	codec tokenizer.Codec
}

// Count returns the number of tokens of s.
func (e *encoder) Count(s string) int {
	n, _ := e.codec.Count(s)
	return n
}

var (
	encodersOnce sync.Once
	o200k        *encoder
	cl100k       *encoder
)

// loadEncoders builds the encoders once per process; every Estimator shares
// them.
func loadEncoders() {
	encodersOnce.Do(func() {
		c, _ := tokenizer.Get(tokenizer.O200kBase)
		o200k = &encoder{name: EncodingO200k, codec: c}
		c, _ = tokenizer.Get(tokenizer.Cl100kBase)
		cl100k = &encoder{name: EncodingCl100k, codec: c}
	})
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
