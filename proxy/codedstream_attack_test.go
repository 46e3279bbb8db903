package proxy_test

import (
	"bytes"
	"compress/flate"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkCodedStream: a stream the upstream sends in a content coding
// costgate did not ask for (deflate; the transport asks for gzip and
// decodes it itself) passes to the client as it is, and the client, which
// reads deflate, has the whole answer. costgate's meter read no event of
// it: it charged the prompt's estimate and no output, where the upstream
// reports and bills 3,000 output tokens. Such a stream is charged as one
// whose usage report could not be read: at its output limit.
func TestBillAtkCodedStream(t *testing.T) {
	var b bytes.Buffer
	zw, _ := flate.NewWriter(&b, flate.BestCompression)
	chunk := `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("word ", 100) + `"}}]}` + "\n\n"
	for range 30 {
		zw.Write([]byte(chunk))
	}
	zw.Write([]byte(`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3000,"total_tokens":3012}}` + "\n\ndata: [DONE]\n\n"))
	zw.Close()
	z := b.Bytes()
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "deflate")
		w.Write(z)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	e, got := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":4000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"write"}]}`, nil)
	if !bytes.Equal(got, z) {
		t.Fatalf("the client did not get the deflated stream as it was sent (%d of %d bytes)", len(got), len(z))
	}
	floor := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 12, OutputTokens: 3000})
	if e.Actual.OutputTokens < 3000 || e.ActualCost < floor {
		t.Errorf("charged %d output tokens (%v); the upstream bills 3000 (%v), and the stream's report was never read", e.Actual.OutputTokens, e.ActualCost, floor)
	}
}
