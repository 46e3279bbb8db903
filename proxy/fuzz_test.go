package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// usageNull is the member an upstream adds to every chunk of a stream that
// was asked for a usage report.
const usageNull = `,"usage":null`

// openAIStream is an OpenAI chat completions stream whose deltas are
// pieces, with its events separated by sep ("\n\n" or "\r\n\r\n"). With
// usage, every chunk carries "usage":null and a usage-only chunk with no
// choices comes before data: [DONE], as when stream_options.include_usage
// is set.
func openAIStream(pieces []string, usage bool, prompt, completion int64, sep string) []byte {
	var b bytes.Buffer
	eol := sep[:len(sep)/2]
	null := ""
	if usage {
		null = usageNull
	}
	const head = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1"`
	event := func(s string) {
		b.WriteString("data: ")
		b.WriteString(s)
		b.WriteString(eol)
		b.WriteString(eol)
	}
	event(head + `,"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]` + null + `}`)
	for _, p := range pieces {
		content, _ := json.Marshal(p)
		event(head + `,"choices":[{"index":0,"delta":{"content":` + string(content) + `},"logprobs":null,"finish_reason":null}]` + null + `}`)
	}
	event(head + `,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]` + null + `}`)
	if usage {
		event(head + fmt.Sprintf(`,"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`,
			prompt, completion, prompt+completion))
	}
	event("[DONE]")
	return b.Bytes()
}

// chunkReader returns data in reads whose sizes the fuzzer chooses: a size
// of 0 is a read of no bytes and no error, which io.Reader allows.
type chunkReader struct {
	t     *testing.T
	data  []byte
	sizes []byte
	i     int
	zero  bool // the last read returned nothing
	eofs  int  // reads after the end
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		r.eofs++
		if r.eofs > 3 {
			r.t.Fatalf("read %d times after io.EOF: the reader loops on the end of the stream", r.eofs)
		}
		return 0, io.EOF
	}
	n := len(r.data)
	if len(r.sizes) > 0 {
		n = int(r.sizes[r.i%len(r.sizes)])
		r.i++
		if n == 0 && !r.zero {
			r.zero = true
			return 0, nil
		}
		n = max(n, 1)
	}
	r.zero = false
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// hideUsage passes stream through a meteredBody that hides the usage
// report, read from upstream in the given read sizes (none: one read) and
// by the client bufSize bytes at a time. It returns what the client read
// and the body, to read its meter.
func hideUsage(t *testing.T, est *costmodel.Estimator, stream, sizes []byte, bufSize int) ([]byte, *meteredBody) {
	t.Helper()
	m := &meteredBody{
		rc:        io.NopCloser(&chunkReader{t: t, data: stream, sizes: sizes}),
		kind:      costmodel.ChatCompletions,
		stream:    est.NewStreamMeter(costmodel.ChatCompletions, "gpt-4o-mini"),
		hideUsage: true,
	}
	var out []byte
	p := make([]byte, bufSize)
	// Every read gives at least one byte or ends the stream, and the
	// client never gets more than the upstream sent.
	for calls := 0; ; calls++ {
		if calls > len(stream)+2 {
			t.Fatalf("%d reads for a stream of %d bytes: the body makes no progress", calls, len(stream))
		}
		n, err := m.Read(p)
		out = append(out, p[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if n == 0 {
			t.Fatal("a read returned no bytes and no error")
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return out, m
}

// FuzzHideUsage checks the filter that hides a usage report costgate asked
// for: the client gets the stream without its usage-only event and without
// "usage":null, whatever the chunking of the upstream's reads and the
// client's, and the meter still reads the usage. Arbitrary bytes must not
// panic or hang it, and its output must not depend on the chunking.
func FuzzHideUsage(f *testing.F) {
	f.Add("Hello, costgate! How much does a token cost?", []byte{7, 1, 0, 200, 3}, uint8(5), false, []byte(nil))
	f.Add("", []byte{}, uint8(0), true, []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n"))
	f.Add("a b", []byte{1}, uint8(1), false, []byte("data: {\"choices\":[{}],\"usage\":null}\r\n\r\ndata: [DONE]\r\n\r\n"))
	f.Add("quote \" and ,\"usage\":null and \n\n newlines", []byte{2, 0, 9}, uint8(255), true, []byte("event: x\ndata: \ndata: {\n\n\n\r\n\r\n"))
	f.Add("日本語 テキスト \u2028 \x00 \xff", []byte{13, 0, 0, 1}, uint8(2), false, []byte(`data: {"choices":[],"usage":null}`))
	f.Add("cut", []byte{64}, uint8(8), false, []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}"))
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string, sizes []byte, buf uint8, crlf bool, raw []byte) {
		bufSize := int(buf) + 1
		sep := "\n\n"
		if crlf {
			sep = "\r\n\r\n"
		}
		pieces := strings.SplitAfter(text, " ")
		if text == "" {
			pieces = nil
		}
		prompt, completion := int64(len(text)%997+1), int64(len(pieces)+1)
		stream := openAIStream(pieces, true, prompt, completion, sep)
		want := openAIStream(pieces, false, 0, 0, sep)
		got, m := hideUsage(t, est, stream, sizes, bufSize)
		if !bytes.Equal(got, want) {
			t.Fatalf("the client read\n%q\nwant\n%q\nfrom\n%q", got, want, stream)
		}
		u, reported := m.stream.Usage()
		if !reported || u.InputTokens != prompt || u.OutputTokens != completion {
			t.Errorf("the meter read usage %+v (reported %v), want input %d output %d", u, reported, prompt, completion)
		}

		// Arbitrary bytes: the output does not depend on the chunking,
		// never grows, and is the input itself when it has no usage, up
		// to its terminal event ([DONE]), after which nothing goes on.
		whole, _ := hideUsage(t, est, raw, nil, 64<<10)
		chunked, _ := hideUsage(t, est, raw, sizes, bufSize)
		if !bytes.Equal(whole, chunked) {
			t.Fatalf("the output depends on the chunking:\nwhole   %q\nchunked %q\nfrom    %q", whole, chunked, raw)
		}
		if len(whole) > len(raw) {
			t.Fatalf("the output %q is longer than the input %q", whole, raw)
		}
		if !bytes.Contains(raw, []byte(`"usage"`)) && !bytes.HasPrefix(raw, whole) ||
			!bytes.Contains(raw, []byte(`"usage"`)) && !bytes.Contains(raw, []byte("[DONE]")) && !bytes.Equal(whole, raw) {
			t.Fatalf("a stream with no usage was changed:\n%q\nto\n%q", raw, whole)
		}
	})
}

// BenchmarkHideUsage reads a 200-chunk OpenAI stream through the filter that
// hides a usage report costgate asked for, as the reverse proxy does (32 KiB
// reads).
func BenchmarkHideUsage(b *testing.B) {
	pieces := strings.SplitAfter(strings.Repeat("a token ", 200), " ")
	stream := openAIStream(pieces, true, 10, int64(len(pieces)), "\n\n")
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		b.Fatal(err)
	}
	p := make([]byte, 32<<10)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		m := &meteredBody{
			rc:        io.NopCloser(bytes.NewReader(stream)),
			kind:      costmodel.ChatCompletions,
			stream:    est.NewStreamMeter(costmodel.ChatCompletions, "gpt-4o-mini"),
			hideUsage: true,
		}
		for {
			if _, err := m.Read(p); err != nil {
				break
			}
		}
	}
}
