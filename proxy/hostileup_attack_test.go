package proxy_test

// Attacks of a hostile or broken upstream: the upstream's answer is
// outside input too. Each test puts costgate on loopback in front of an
// upstream that misbehaves (on purpose, at the HTTP level where it must,
// through a hijacked connection) and checks what the client got, how long
// it took, how much memory costgate held, and the one ledger entry: the
// client gets a clear error or a faithful pass-through, the answer ends
// within the upstream's timeout, and the tenant is billed at least what
// the README's rules say.

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/costgate/costgate/ledger"
)

// hostileUpChatReq is a plain chat request with an output limit of 1,000
// tokens: its estimate is what an unreadable answer is charged.
const hostileUpChatReq = `{"model":"gpt-4o-mini","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`

// hostileUpStreamReq is the same request streamed; usage names its
// stream_options ("" for none, which has costgate ask for the report and
// hide it).
func hostileUpStreamReq(usage string) string {
	if usage != "" {
		usage = `,"stream_options":{"include_usage":` + usage + `}`
	}
	return `{"model":"gpt-4o-mini","max_tokens":1000,"stream":true` + usage + `,"messages":[{"role":"user","content":"hi"}]}`
}

// hostileUpChat is a chat completion whose usage member is usage, raw.
func hostileUpChat(model, usage string) string {
	return `{"id":"c","object":"chat.completion","created":1,"model":` + model +
		`,"choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":` + usage + `}`
}

// hostileUpStack is costgate in front of h, with the upstream's timeout
// (0: the default of 10m) and more config.
func hostileUpStack(t *testing.T, h http.Handler, timeout time.Duration, extra string) *stack {
	t.Helper()
	if extra == "" {
		extra = roomyLimits
	}
	return newStackWith(t, stackOptions{policies: allowAll, extra: extra, upstream: h, upstreamTimeout: timeout})
}

// hostileUpRaw is an upstream that reads the request, then writes raw
// bytes on the hijacked connection with fn, and closes it.
func hostileUpRaw(fn func(w *bufio.ReadWriter)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer c.Close()
		fn(rw)
		rw.Flush()
	})
}

// hostileUpGot is what a client got from costgate.
type hostileUpGot struct {
	status int
	header http.Header
	n      int64  // body bytes read
	head   []byte // the body's first 4 KiB
	err    error  // the request's or the body's read error
	dur    time.Duration
}

func (g hostileUpGot) String() string {
	return fmt.Sprintf("status %d, %d body bytes, err %v, in %v, body %.200q", g.status, g.n, g.err, g.dur.Round(time.Millisecond), g.head)
}

// hostileUpSend posts body to path with acme's key, reads the answer to
// its end within limit, and says what came.
func hostileUpSend(t *testing.T, s *stack, path, body string, limit time.Duration) hostileUpGot {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	req.Header.Set("Content-Type", "application/json")
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: limit}
	start := time.Now()
	var g hostileUpGot
	resp, err := c.Do(req)
	if err != nil {
		g.err, g.dur = err, time.Since(start)
		return g
	}
	g.status, g.header = resp.StatusCode, resp.Header
	var head bytes.Buffer
	g.n, g.err = io.Copy(io.Discard, io.TeeReader(resp.Body, &hostileUpLimited{&head, 4 << 10}))
	resp.Body.Close()
	g.head, g.dur = head.Bytes(), time.Since(start)
	return g
}

// hostileUpLimited keeps the first n bytes written to it.
type hostileUpLimited struct {
	b *bytes.Buffer
	n int
}

func (l *hostileUpLimited) Write(p []byte) (int, error) {
	if k := min(len(p), l.n-l.b.Len()); k > 0 {
		l.b.Write(p[:k])
	}
	return len(p), nil
}

// hostileUpMem samples the heap in use while a test runs; peak returns
// its highest point above where it started, in MiB.
type hostileUpMem struct {
	base, top uint64
	stop      chan struct{}
	done      chan struct{}
}

func hostileUpWatchMem() *hostileUpMem {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := &hostileUpMem{base: ms.HeapInuse, top: ms.HeapInuse, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-tick.C:
				runtime.ReadMemStats(&ms)
				m.top = max(m.top, ms.HeapInuse)
			}
		}
	}()
	return m
}

func (m *hostileUpMem) peak() float64 {
	close(m.stop)
	<-m.done
	return float64(m.top-m.base) / (1 << 20)
}

// hostileUpEntry returns acme's one ledger entry once it is settled, and
// fails the test when there is not exactly one or it stays reserved.
func hostileUpEntry(t *testing.T, s *stack) ledger.Entry {
	t.Helper()
	e, ok := streamAtkSettledWithin(t, s, 10*time.Second)
	if es := streamAtkEntries(t, s); len(es) != 1 {
		t.Fatalf("want one ledger entry, got %d: %+v", len(es), es)
	}
	if !ok {
		t.Fatalf("the ledger entry is not settled 10 s after the answer: %+v", e)
	}
	t.Logf("ledger: %s, http %d, model %q, actual in %d out %d, cost %v (estimated %v)",
		e.Status, e.HTTPStatus, e.Model, e.Actual.InputTokens, e.Actual.OutputTokens, e.ActualCost, e.EstimatedCost)
	return e
}

// hostileUpAtOutputLimit fails unless e is charged at least its estimate
// (which reserves the whole output limit): what an answer whose usage
// cannot be read is charged.
func hostileUpAtOutputLimit(t *testing.T, e ledger.Entry) {
	t.Helper()
	if e.ActualCost < e.EstimatedCost || e.Actual.OutputTokens < 1000 {
		t.Errorf("charged %v for %d output tokens; an answer whose usage cannot be read is charged its output limit (1000 tokens, %v)",
			e.ActualCost, e.Actual.OutputTokens, e.EstimatedCost)
	}
}

// hostileUpChunk is an OpenAI chat stream chunk of text.
func hostileUpChunk(text string) string {
	return `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":` + strconv.Quote(text) + `}}]}` + "\n\n"
}

// hostileUpUsageChunk is the usage-only chunk and [DONE].
func hostileUpUsageChunk(in, out int) string {
	return fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\ndata: [DONE]\n\n", in, out, in+out)
}

// TestHostileUpEndlessSSELine: a stream whose one data line is 100 MiB
// with no line end. On each of the stream's read paths (the usage report
// hidden, passed as it is, the stream guard), costgate passes it on with
// bounded memory, and bills the usage report that follows it.
func TestHostileUpEndlessSSELine(t *testing.T) {
	const size = 100 << 20
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, hostileUpChunk("hello"))
		io.WriteString(w, "data: ")
		block := bytes.Repeat([]byte("a"), 64<<10)
		for sent := 0; sent < size; sent += len(block) {
			if _, err := w.Write(block); err != nil {
				return
			}
		}
		io.WriteString(w, "\n\n"+hostileUpUsageChunk(9, 5))
	})
	for _, c := range []struct{ name, usage, extra string }{
		{"hidden-usage", "", ""},
		{"client-usage", "true", ""},
		{"guarded", "true", guardConfig("100", 16)},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := hostileUpStack(t, up, 0, c.extra)
			mem := hostileUpWatchMem()
			g := hostileUpSend(t, s, "/v1/chat/completions", hostileUpStreamReq(c.usage), 20*time.Second)
			peak := mem.peak()
			t.Logf("client: %v; heap peak +%.1f MiB", g, peak)
			if g.err != nil || g.status != 200 || g.n < size {
				t.Errorf("the client did not get the stream whole: %v", g)
			}
			if peak > 48 {
				t.Errorf("costgate's heap grew by %.1f MiB for one line of 100 MiB", peak)
			}
			if e := hostileUpEntry(t, s); e.Actual.OutputTokens < 5 {
				t.Errorf("billed %d output tokens; the upstream reported 5", e.Actual.OutputTokens)
			}
		})
	}
}

// TestHostileUpTrickle: an upstream that sends one byte every 200 ms
// forever, or its headers and then nothing, is ended at the upstream's
// timeout (2 s): the client's answer ends by then, the ledger entry is
// settled, and the request is charged at least its prompt; a plain answer
// whose usage never came, its output limit. A plain answer cut before
// costgate sent any of it is a clear error to the client (a status), not a
// dropped connection.
func TestHostileUpTrickle(t *testing.T) {
	const timeout = 2 * time.Second
	trickle := func(contentType, first string, each func(i int) string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if contentType == "" {
				select { // never answers
				case <-r.Context().Done():
				case <-time.After(20 * time.Second):
				}
				return
			}
			w.Header().Set("Content-Type", contentType)
			io.WriteString(w, first)
			w.(http.Flusher).Flush()
			for i := 0; i < 100; i++ {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := io.WriteString(w, each(i)); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		})
	}
	byte1 := func(int) string { return " " }
	for _, c := range []struct {
		name  string
		up    http.Handler
		req   string
		plain bool // a plain answer: charged the output limit, answered with a status
	}{
		{"no-headers", trickle("", "", nil), hostileUpChatReq, true},
		{"json-bytes", trickle("application/json", `{"id":"c"`, byte1), hostileUpChatReq, true},
		{"json-silent", trickle("application/json", "", func(int) string { return "" }), hostileUpChatReq, true},
		{"sse-bytes", trickle("text/event-stream", hostileUpChunk("hi"), byte1), hostileUpStreamReq(""), false},
		{"sse-events", trickle("text/event-stream", hostileUpChunk("hi"), func(int) string { return hostileUpChunk(" word") }), hostileUpStreamReq("true"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := hostileUpStack(t, c.up, timeout, "")
			g := hostileUpSend(t, s, "/v1/chat/completions", c.req, 15*time.Second)
			t.Logf("client: %v", g)
			if g.dur > timeout+2*time.Second {
				t.Errorf("the answer took %v; the upstream's timeout is %v", g.dur, timeout)
			}
			e := hostileUpEntry(t, s)
			if c.plain {
				hostileUpAtOutputLimit(t, e)
				if g.status == 0 || g.status < 500 {
					t.Errorf("the client got no clear error for an answer that never came whole: %v", g)
				}
			} else if e.Actual.InputTokens < e.Estimated.InputTokens {
				t.Errorf("billed %d input tokens; the prompt has %d", e.Actual.InputTokens, e.Estimated.InputTokens)
			}
		})
	}
}

// TestHostileUpCompressionBomb: a JSON answer of 128 MiB sent gzipped
// (about 130 KiB) or deflated. costgate's transport decodes the gzip
// itself: the decoded answer passes through with bounded memory and is
// charged its output limit (too large to read); the deflated one, which
// costgate did not ask for, passes through as it is, and its usage cannot
// be read either.
func TestHostileUpCompressionBomb(t *testing.T) {
	const size = 128 << 20
	encode := func(enc string) []byte {
		var b bytes.Buffer
		var zw io.WriteCloser
		if enc == "gzip" {
			zw, _ = gzip.NewWriterLevel(&b, gzip.BestCompression)
		} else {
			zw, _ = flate.NewWriter(&b, flate.BestCompression)
		}
		io.WriteString(zw, `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14},"pad":"`)
		block := bytes.Repeat([]byte("a"), 1<<20)
		for range size >> 20 {
			zw.Write(block)
		}
		io.WriteString(zw, `"}`)
		zw.Close()
		return b.Bytes()
	}
	for _, enc := range []string{"gzip", "deflate"} {
		t.Run(enc, func(t *testing.T) {
			z := encode(enc)
			up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Encoding", enc)
				w.Header().Set("Content-Length", strconv.Itoa(len(z)))
				w.Write(z)
			})
			s := hostileUpStack(t, up, 0, "")
			mem := hostileUpWatchMem()
			// The client's limit guards against a hang only: the 128 MiB
			// answer takes 6 s under -race on a quiet machine, more than
			// 20 s on a loaded one.
			g := hostileUpSend(t, s, "/v1/chat/completions", hostileUpChatReq, 2*time.Minute)
			peak := mem.peak()
			t.Logf("%d compressed bytes; client: %v, Content-Encoding %q; heap peak +%.1f MiB", len(z), g, g.header.Get("Content-Encoding"), peak)
			switch {
			case g.err != nil || g.status != 200:
				t.Errorf("the client did not get the answer: %v", g)
			case enc == "gzip" && (g.n != size+int64(len(`{"id":"c","object":"chat.completion","model":"gpt-4o-mini","usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14},"pad":""}`)) || g.header.Get("Content-Encoding") != ""):
				t.Errorf("the decoded answer did not pass whole: %v", g)
			case enc == "deflate" && (g.n != int64(len(z)) || g.header.Get("Content-Encoding") != "deflate"):
				t.Errorf("the deflated answer did not pass as it is: %v", g)
			}
			if peak > 64 {
				t.Errorf("costgate's heap grew by %.1f MiB for a %d-byte answer", peak, len(z))
			}
			hostileUpAtOutputLimit(t, hostileUpEntry(t, s))
		})
	}
}

// TestHostileUpBrokenFraming: answers whose HTTP framing breaks: a
// Content-Length above the body, then the connection closed (after the
// usage, or before it); a chunked body with a malformed chunk size; a
// stream closed right after its headers. The client sees an error (never
// an answer that looks whole), quickly, and the ledger has one entry:
// charged the usage the upstream reported where the whole report came,
// the output limit where no report came to a plain answer, the prompt for
// a cut stream.
func TestHostileUpBrokenFraming(t *testing.T) {
	doc := hostileUpChat(`"gpt-4o-mini"`, `{"prompt_tokens":9,"completion_tokens":300,"total_tokens":309}`)
	head := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
	for _, c := range []struct {
		name   string
		fn     func(w *bufio.ReadWriter)
		req    string
		billed func(t *testing.T, e ledger.Entry)
	}{
		{"length-over-after-usage", func(w *bufio.ReadWriter) {
			fmt.Fprintf(w, "%sContent-Length: %d\r\n\r\n%s", head, len(doc)+1000, doc)
		}, hostileUpChatReq, func(t *testing.T, e ledger.Entry) {
			if e.Actual.OutputTokens < 300 {
				t.Errorf("billed %d output tokens; the upstream reported 300", e.Actual.OutputTokens)
			}
		}},
		{"length-over-before-usage", func(w *bufio.ReadWriter) {
			fmt.Fprintf(w, "%sContent-Length: %d\r\n\r\n%s", head, len(doc), doc[:60])
		}, hostileUpChatReq, hostileUpAtOutputLimit},
		{"malformed-chunk", func(w *bufio.ReadWriter) {
			fmt.Fprintf(w, "%sTransfer-Encoding: chunked\r\n\r\n10\r\n%s\r\nzz\r\n%s\r\n", head, doc[:16], doc[16:])
		}, hostileUpChatReq, hostileUpAtOutputLimit},
		{"chunk-size-overflow", func(w *bufio.ReadWriter) {
			fmt.Fprintf(w, "%sTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n%s", head, doc)
		}, hostileUpChatReq, hostileUpAtOutputLimit},
		{"stream-closed-after-headers", func(w *bufio.ReadWriter) {
			io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		}, hostileUpStreamReq(""), func(t *testing.T, e ledger.Entry) {
			if e.Actual.InputTokens < e.Estimated.InputTokens {
				t.Errorf("billed %d input tokens; the prompt has %d", e.Actual.InputTokens, e.Estimated.InputTokens)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := hostileUpStack(t, hostileUpRaw(c.fn), 5*time.Second, "")
			g := hostileUpSend(t, s, "/v1/chat/completions", c.req, 10*time.Second)
			t.Logf("client: %v", g)
			if g.err == nil && g.status == 200 {
				t.Errorf("the client got a broken answer as a whole one: %v", g)
			}
			if g.dur > 3*time.Second {
				t.Errorf("the answer took %v", g.dur)
			}
			c.billed(t, hostileUpEntry(t, s))
		})
	}
}

// TestHostileUpUsageNumbers: usage counts the upstream writes as numbers
// no int64 holds (1e400, 2^63), as strings ("NaN"), as fractions, or
// negative. Each is charged the output limit (a report costgate cannot
// read) or the counts read, never less than nothing, never a wrapped
// (negative) cost, and the client gets the answer as it is.
func TestHostileUpUsageNumbers(t *testing.T) {
	for _, c := range []struct{ name, out string }{
		{"1e400", "1e400"},
		{"2^63", "9223372036854775808"},
		{"2^63-1", "9223372036854775807"},
		{"NaN-string", `"NaN"`},
		{"fraction", "12.5"},
		{"negative", "-1"},
		{"null", "null"},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := hostileUpChat(`"gpt-4o-mini"`, `{"prompt_tokens":9,"completion_tokens":`+c.out+`,"total_tokens":9}`)
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, doc)
			}}
			s := hostileUpStack(t, up, 0, "")
			g := hostileUpSend(t, s, "/v1/chat/completions", hostileUpChatReq, 10*time.Second)
			if g.err != nil || g.status != 200 || g.n != int64(len(doc)) {
				t.Errorf("the answer did not pass as it is: %v", g)
			}
			e := hostileUpEntry(t, s)
			if e.ActualCost < 0 || e.Actual.OutputTokens < 0 {
				t.Errorf("charged %v for %d output tokens", e.ActualCost, e.Actual.OutputTokens)
			}
			if e.Actual.InputTokens < e.Estimated.InputTokens {
				t.Errorf("billed %d input tokens; the prompt has %d", e.Actual.InputTokens, e.Estimated.InputTokens)
			}
		})
	}
}

// TestHostileUpDuplicateUsage: an answer with two "usage" members (and a
// second spelling, "Usage") that disagree. The tenant is billed no less
// than the usage the client's SDK (openai-go) reads from the same answer.
func TestHostileUpDuplicateUsage(t *testing.T) {
	small := `{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}`
	big := `{"prompt_tokens":9,"completion_tokens":900,"total_tokens":909}`
	for _, c := range []struct{ name, usage string }{
		{"small-then-big", `"usage":` + small + `,"usage":` + big},
		{"big-then-small", `"usage":` + big + `,"usage":` + small},
		{"usage-then-Usage", `"usage":` + small + `,"Usage":` + big},
		{"Usage-then-usage", `"Usage":` + big + `,"usage":` + small},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := `{"id":"c","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],` + c.usage + `}`
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, doc)
			}}
			s := hostileUpStack(t, up, 0, "")
			comp, err := s.client("cg-test-acme").Chat.Completions.New(context.Background(), chatParams("hi", 1000))
			if err != nil {
				t.Fatal(err)
			}
			e := hostileUpEntry(t, s)
			t.Logf("the SDK reads %d completion tokens; billed %d", comp.Usage.CompletionTokens, e.Actual.OutputTokens)
			if e.Actual.OutputTokens < comp.Usage.CompletionTokens {
				t.Errorf("billed %d output tokens; the client's SDK reads %d from the same answer", e.Actual.OutputTokens, comp.Usage.CompletionTokens)
			}
		})
	}
}

// TestHostileUpDeepNesting: a usage member nested 100,000 deep, in a plain
// answer and in a stream's usage chunk, and a 100,000-deep member beside a
// valid usage. Nothing crashes, the answer passes as it is within 5 s, and
// the request is charged its output limit (the report cannot be read) or
// the valid report.
func TestHostileUpDeepNesting(t *testing.T) {
	const depth = 100_000
	deep := strings.Repeat("[", depth) + strings.Repeat("]", depth)
	deepObj := strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
	valid := `{"prompt_tokens":9,"completion_tokens":1500,"total_tokens":1509}`
	for _, c := range []struct {
		name, body, ctype, req string
		minOut                 int64
	}{
		{"usage-array", hostileUpChat(`"gpt-4o-mini"`, deep), "application/json", hostileUpChatReq, 1000},
		{"usage-object", hostileUpChat(`"gpt-4o-mini"`, deepObj), "application/json", hostileUpChatReq, 1000},
		{"beside-usage", strings.Replace(hostileUpChat(`"gpt-4o-mini"`, valid), `"id":"c"`, `"x":`+deep+`,"id":"c"`, 1), "application/json", hostileUpChatReq, 1000},
		{"stream-usage", hostileUpChunk("hello") + `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":` + deepObj + "}\n\ndata: [DONE]\n\n", "text/event-stream", hostileUpStreamReq("true"), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", c.ctype)
				io.WriteString(w, c.body)
			}}
			s := hostileUpStack(t, up, 0, "")
			g := hostileUpSend(t, s, "/v1/chat/completions", c.req, 10*time.Second)
			t.Logf("client: status %d, %d bytes, err %v, in %v", g.status, g.n, g.err, g.dur)
			if g.err != nil || g.status != 200 || g.n != int64(len(c.body)) {
				t.Errorf("the answer did not pass as it is: %v", g)
			}
			if g.dur > 5*time.Second {
				t.Errorf("the answer took %v", g.dur)
			}
			if e := hostileUpEntry(t, s); e.Actual.OutputTokens < c.minOut {
				t.Errorf("billed %d output tokens; want at least %d", e.Actual.OutputTokens, c.minOut)
			}
		})
	}
}

// TestHostileUpModelNames: the model an answer says served it is NUL,
// invalid UTF-8, a line break or 100 KiB: no model's name, so the ledger
// records and prices the model asked for (servedModel's contract); a real
// model's name (a cheaper one) is priced as served. The answer passes.
func TestHostileUpModelNames(t *testing.T) {
	for _, c := range []struct{ name, model string }{
		{"nul", `"gpt-4o-mini\u0000x"`},
		{"invalid-utf8", "\"gpt-4o-mini\xff\xfe\""},
		{"newline", `"gpt-4o-mini\n# HELP x"`},
		{"long", `"` + strings.Repeat("m", 100<<10) + `"`},
		{"cheaper", `"gpt-4.1-nano"`},
	} {
		for _, stream := range []bool{false, true} {
			name := c.name
			if stream {
				name += "/stream"
			}
			t.Run(name, func(t *testing.T) {
				up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
					if stream {
						w.Header().Set("Content-Type", "text/event-stream")
						fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":%s,"choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\n", c.model)
						fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":%s,"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}`+"\n\ndata: [DONE]\n\n", c.model)
						return
					}
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, hostileUpChat(c.model, `{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}`))
				}}
				s := hostileUpStack(t, up, 0, "")
				req := hostileUpChatReq
				if stream {
					req = hostileUpStreamReq("true")
				}
				g := hostileUpSend(t, s, "/v1/chat/completions", req, 10*time.Second)
				if g.err != nil || g.status != 200 {
					t.Errorf("the answer did not pass: %v", g)
				}
				e := hostileUpEntry(t, s)
				want := "gpt-4o-mini" // a name that is no model's: the one asked for
				if c.name == "cheaper" {
					want = "gpt-4.1-nano"
				}
				if e.Model != want || !utf8.ValidString(e.Model) {
					t.Errorf("the ledger records the model %.80q, priced %v; want %q", e.Model, e.ActualCost, want)
				}
				if e.Actual.OutputTokens != 5 {
					t.Errorf("billed %d output tokens; the upstream reported 5", e.Actual.OutputTokens)
				}
			})
		}
	}
}

// TestHostileUpInformational: an upstream that answers 101 Switching
// Protocols to a request that asked for no upgrade, or sends 1xx answers
// before its final one. The client gets a clear error or the final answer,
// quickly, and the ledger has one entry. costgate does not keep a
// connection the 101 left it: five such answers leave no connection to
// the upstream open 3 s later (each would hold a file descriptor and the
// upstream's slot until the upstream hangs up).
func TestHostileUpInformational(t *testing.T) {
	doc := hostileUpChat(`"gpt-4o-mini"`, `{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}`)
	final := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(doc), doc)
	for _, c := range []struct {
		name string
		fn   func(w *bufio.ReadWriter)
		n    int // requests sent
	}{
		{"101", func(w *bufio.ReadWriter) {
			io.WriteString(w, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		}, 5},
		{"103x3", func(w *bufio.ReadWriter) {
			for range 3 {
				io.WriteString(w, "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n")
			}
			io.WriteString(w, final)
		}, 1},
		{"103x1000", func(w *bufio.ReadWriter) {
			for range 1000 {
				io.WriteString(w, "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n")
			}
			io.WriteString(w, final)
		}, 1},
		{"100-unasked", func(w *bufio.ReadWriter) {
			io.WriteString(w, "HTTP/1.1 100 Continue\r\n\r\n"+final)
		}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			open := make(chan bool, c.n) // per connection: still open 3 s after the answer
			up := hostileUpRaw(func(w *bufio.ReadWriter) {
				c.fn(w)
				w.Flush()
				if c.name != "101" {
					return // the connection is costgate's keep-alive: closed here
				}
				done := make(chan struct{})
				go func() { w.Reader.ReadByte(); close(done) }() // returns when costgate closes it
				select {
				case <-done:
					open <- false
				case <-time.After(3 * time.Second):
					open <- true
				}
			})
			s := hostileUpStack(t, up, 10*time.Second, "")
			for range c.n {
				g := hostileUpSend(t, s, "/v1/chat/completions", hostileUpChatReq, 10*time.Second)
				t.Logf("client: %v", g)
				if g.err != nil || g.status == 0 {
					t.Errorf("the client got no answer: %v", g)
				}
				if g.dur > 3*time.Second {
					t.Errorf("the answer took %v", g.dur)
				}
			}
			es := streamAtkEntries(t, s)
			if len(es) != c.n {
				t.Errorf("want %d ledger entries, got %d", c.n, len(es))
			}
			if c.n == 1 {
				if e := hostileUpEntry(t, s); e.Actual.OutputTokens != 5 {
					t.Errorf("the answer passed, billed %d output tokens; the upstream reported 5", e.Actual.OutputTokens)
				}
				return
			}
			leaked := 0
			for range c.n {
				if <-open {
					leaked++
				}
			}
			if leaked > 0 {
				t.Errorf("%d of %d connections the upstream answered 101 on are still open 3 s after costgate's 502", leaked, c.n)
			}
		})
	}
}

// TestHostileUpHugeHeaders: an answer with 10,000 header fields, with one
// field of 1 MiB, or with 9 MiB of fields. costgate answers quickly, with
// bounded memory (a clear error, or the answer with the upstream's
// headers), and bills the usage the body reports when it passed.
func TestHostileUpHugeHeaders(t *testing.T) {
	doc := hostileUpChat(`"gpt-4o-mini"`, `{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}`)
	for _, c := range []struct {
		name string
		set  func(h http.Header)
	}{
		{"10000-fields", func(h http.Header) {
			for i := range 10_000 {
				h.Set(fmt.Sprintf("X-F%d", i), "v")
			}
		}},
		{"1MiB-field", func(h http.Header) { h.Set("X-Big", strings.Repeat("v", 1<<20)) }},
		{"9MiB-fields", func(h http.Header) {
			for i := range 9 {
				h.Set(fmt.Sprintf("X-Big%d", i), strings.Repeat("v", 1<<20))
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				c.set(w.Header())
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, doc)
			}}
			s := hostileUpStack(t, up, 0, "")
			mem := hostileUpWatchMem()
			g := hostileUpSend(t, s, "/v1/chat/completions", hostileUpChatReq, 15*time.Second)
			peak := mem.peak()
			t.Logf("client: status %d, %d header fields, err %v, in %v; heap peak +%.1f MiB", g.status, len(g.header), g.err, g.dur, peak)
			// 9 MiB of fields take 0.1 to 0.2 s on a quiet machine, 1.9 s
			// under the race detector, which CI runs beside other
			// packages' tests.
			bound := time.Second
			if raceEnabled {
				bound *= 8
			}
			if g.dur > bound {
				t.Errorf("the answer took %v, bound %v", g.dur, bound)
			}
			if g.err != nil && g.status == 0 {
				t.Errorf("the client got no answer: %v", g.err)
			}
			e := hostileUpEntry(t, s)
			if g.status == 200 && e.Actual.OutputTokens != 5 {
				t.Errorf("the answer passed, billed %d output tokens; the upstream reported 5", e.Actual.OutputTokens)
			}
		})
	}
}

// TestHostileUpSpoofedHeaders: the upstream's answer carries the fields
// costgate itself writes to tell the client what it did (X-Request-Id,
// Costgate-Friction, Costgate-Degraded, Costgate-Warning, RateLimit), as
// headers and as trailers. The client must read costgate's word, not the
// upstream's: the upstream's own request id goes under
// Costgate-Upstream-Request-Id, and no Costgate- field reaches the client
// that costgate did not write.
func TestHostileUpSpoofedHeaders(t *testing.T) {
	doc := hostileUpChat(`"gpt-4o-mini"`, `{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}`)
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("X-Request-Id", "req_upstream")
		h.Set("Costgate-Friction", "cap_max_tokens (policy evil)")
		h.Set("Costgate-Degraded", "fail-open")
		h.Set("Costgate-Warning", "your key is revoked: mail it to evil@example.com")
		h.Set("Trailer", "X-Request-Id, Costgate-Warning")
		io.WriteString(w, doc)
		h.Set("X-Request-Id", "req_trailer")
		h.Set("Costgate-Warning", "trailer warning")
	}}
	s := hostileUpStack(t, up, 0, "")
	req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(hostileUpChatReq))
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	t.Logf("header: %v; trailer: %v", resp.Header, resp.Trailer)
	if ids := resp.Header.Values("X-Request-Id"); len(ids) != 1 || !strings.HasPrefix(ids[0], "req_") || ids[0] == "req_upstream" {
		t.Errorf("X-Request-Id: %q; want costgate's one id", ids)
	}
	if got := resp.Header.Get("Costgate-Upstream-Request-Id"); got != "req_upstream" {
		t.Errorf("Costgate-Upstream-Request-Id: %q", got)
	}
	for _, f := range []string{"Costgate-Friction", "Costgate-Degraded", "Costgate-Warning"} {
		if v := resp.Header.Values(f); len(v) > 0 {
			t.Errorf("%s: %q reaches the client from the upstream; costgate applied none", f, v)
		}
		if v := resp.Trailer.Values(f); len(v) > 0 {
			t.Errorf("trailer %s: %q reaches the client from the upstream", f, v)
		}
	}
	if v := resp.Trailer.Values("X-Request-Id"); len(v) > 0 {
		t.Errorf("trailer X-Request-Id: %q contradicts costgate's request id", v)
	}
	hostileUpEntry(t, s)
}
