package proxy_test

// Attacks of a tenant who wants to pay less, or to spend past its budget,
// with streams and cut connections: each test drives costgate on loopback
// in front of a stub upstream and compares the ledger (and what the client
// got) with what the upstream streamed and billed.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// streamAtkEntries returns acme's ledger entries without waiting for the
// requests in flight (Server.WaitIdle would wait for a hung one).
func streamAtkEntries(t *testing.T, s *stack) []ledger.Entry {
	t.Helper()
	ctx := context.Background()
	l := s.srv.Ledger()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := l.Entries(ctx, ledger.Query{Tenant: "acme", From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return page.Entries
}

// streamAtkSettledWithin polls for one settled entry for at most d, and
// returns it, or false when the entry is still reserved (or missing).
func streamAtkSettledWithin(t *testing.T, s *stack, d time.Duration) (ledger.Entry, bool) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		es := streamAtkEntries(t, s)
		if len(es) == 1 && es[0].Status != ledger.StatusReserved {
			return es[0], true
		}
		if time.Now().After(deadline) {
			if len(es) == 1 {
				return es[0], false
			}
			return ledger.Entry{}, false
		}
	}
}

// streamAtkBudget is a tenant's daily budget of amount dollars, streams
// admitted on 1% of their output, and the stream guard on with increments
// of 16 tokens (guardConfig's).
func streamAtkBudget(amount string) string { return guardConfig(amount, 16) }

// streamAtkResponsesEvent is one Responses stream event of type typ whose
// delta is text.
func streamAtkResponsesEvent(typ, text string) string {
	return fmt.Sprintf("event: %s\ndata: {\"type\":%q,\"item_id\":\"it\",\"output_index\":0,\"delta\":%q}\n\n", typ, typ, text)
}

// TestStreamAttackGuardBlindToToolInput: the Responses API streams the
// output of a custom tool call, of the code interpreter and of an MCP call
// as their own delta events, which the stream guard counts as text. A
// tenant whose budget holds about 600 output tokens defines a custom tool
// (or enables code_interpreter) and asks for a long call: the stream stops
// at the budget, and one cut before response.completed is billed the
// output counted.
func TestStreamAttackGuardBlindToToolInput(t *testing.T) {
	const words = 5000
	for _, typ := range []string{
		"response.custom_tool_call_input.delta",
		"response.code_interpreter_call_code.delta",
		"response.mcp_call_arguments.delta",
	} {
		for _, complete := range []bool{true, false} {
			name := typ
			if !complete {
				name += "/cut"
			}
			t.Run(name, func(t *testing.T) {
				up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
					w.Header().Set("Content-Type", "text/event-stream")
					f := w.(http.Flusher)
					fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"model\":\"gpt-4.1-mini\",\"status\":\"in_progress\",\"usage\":null}}\n\n")
					for i := range words {
						io.WriteString(w, streamAtkResponsesEvent(typ, " word"))
						if i%50 == 0 {
							f.Flush()
						}
					}
					if complete {
						fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"model\":\"gpt-4.1-mini\",\"status\":\"completed\",\"usage\":{\"input_tokens\":20,\"output_tokens\":%d,\"total_tokens\":%d}}}\n\n", words, words+20)
					}
				}}
				s := newStackWith(t, stackOptions{policies: allowAll, extra: streamAtkBudget("0.001"), upstream: up})
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				resp := s.post(t, ctx, "/v1/responses", `{"model":"gpt-4.1-mini","stream":true,"max_output_tokens":30000,"input":"call write with a 5000-word essay","tools":[{"type":"custom","name":"write","description":"writes"}]}`)
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				shown := int64(bytes.Count(got, []byte(`"delta":" word"`)))
				e := s.settled(t, 1)[0]
				est := estimator(t)
				budget := costmodel.NanoUSD(1_000_000)
				bound := est.Cost("gpt-4.1-mini", costmodel.Usage{OutputTokens: 16})
				served := est.Cost("gpt-4.1-mini", costmodel.Usage{InputTokens: 20, OutputTokens: shown})
				t.Logf("client got %d tokens of tool input; ledger: %d output tokens, %v (budget %v)", shown, e.Actual.OutputTokens, e.ActualCost, budget)
				if served > budget+bound {
					t.Errorf("the client was served %d output tokens (%v) past a %v budget: the guard did not stop the stream", shown, served, budget)
				}
				if e.Actual.OutputTokens < shown {
					t.Errorf("billed %d output tokens; the stream carried %d", e.Actual.OutputTokens, shown)
				}
			})
		}
	}
}

// TestStreamAttackGuardBlindToAudio: a chat stream with audio output
// (modalities text and audio) carries its output in delta.audio (the
// transcript and the base64 audio), which the guard cannot count: such a
// request is reserved whole, and with a budget of $0.01 (about 500 audio
// tokens of gpt-4o-mini-audio-preview) a stream of 5,000 audio tokens
// ($0.10) is not served.
func TestStreamAttackGuardBlindToAudio(t *testing.T) {
	const chunks = 5000
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := range chunks {
			fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini-audio-preview","choices":[{"index":0,"delta":{"audio":{"id":"a","transcript":" word","data":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}}],"usage":null}`+"\n\n")
			if i%50 == 0 {
				f.Flush()
			}
		}
		fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini-audio-preview","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":%d,"completion_tokens_details":{"audio_tokens":%d}}}`+"\n\n", chunks, chunks)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: streamAtkBudget("0.01"), upstream: up})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := s.post(t, ctx, "/v1/chat/completions", `{"model":"gpt-4o-mini-audio-preview","stream":true,"modalities":["text","audio"],"audio":{"voice":"alloy","format":"pcm16"},"max_completion_tokens":16000,"messages":[{"role":"user","content":"read me a long story"}]}`)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Logf("refused at admission: %d %s", resp.StatusCode, got)
		return // the budget cannot hold the answer
	}
	shown := int64(bytes.Count(got, []byte(`"transcript":" word"`)))
	e := s.settled(t, 1)[0]
	est := estimator(t)
	budget := costmodel.NanoUSD(10_000_000)
	bound := est.Cost("gpt-4o-mini-audio-preview", costmodel.Usage{OutputTokens: 16, AudioOutputTokens: 16})
	served := est.Cost("gpt-4o-mini-audio-preview", costmodel.Usage{InputTokens: 20, OutputTokens: shown, AudioOutputTokens: shown})
	t.Logf("client got %d audio chunks; ledger: %+v, %v (budget %v)", shown, e.Actual, e.ActualCost, budget)
	if served > budget+bound {
		t.Errorf("the client was served %d audio tokens (%v) past a %v budget: the guard did not stop the stream", shown, served, budget)
	}
}

// streamAtkSmallWindow dials addr with a receive buffer of a few
// kilobytes: a client that stops reading then stalls costgate's writes
// after a few kilobytes more, instead of after the kernel's megabytes.
func streamAtkSmallWindow(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestStreamAttackStalledClient: a client that keeps its connection open
// but stops reading (a zero TCP window) is the hang-up attack without the
// hang-up. A write that waits past the stall bound takes the client as
// gone: costgate reads the rest of the stream alone, within the
// upstream's timeout, and the request is settled while the client still
// stalls, at the upstream's report (10,000 tokens), not at the few tokens
// read before it stalled.
func TestStreamAttackStalledClient(t *testing.T) {
	const words = 10000
	// logprobs with top_logprobs 20 make a chunk about 2 KB: the stream
	// (20 MB) is larger than what the kernel buffers between the three.
	var top strings.Builder
	for i := range 20 {
		if i > 0 {
			top.WriteByte(',')
		}
		fmt.Fprintf(&top, `{"token":" w%02d","logprob":-%d.5,"bytes":[32,119,48,%d]}`, i, i, 48+i%10)
	}
	chunk := `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" word"},"logprobs":{"content":[{"token":" word","logprob":-0.1,"bytes":[32,119,111,114,100],"top_logprobs":[` + top.String() + `]}]}}]}` + "\n\n"
	var sent atomic.Int64
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := range words {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			if i%100 == 0 {
				f.Flush()
			}
			sent.Add(1)
		}
		fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":%d}}`+"\n\n", words)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}}
	// A stall is taken as a hang-up after half the timeout; the rest (20
	// MB) is read within the other half, which a loaded machine needed
	// more than 3 s for (it was billed the output limit, 16,000, as a
	// stream read to its end would not be).
	const timeout = 16 * time.Second
	s := newStackWith(t, stackOptions{policies: allowAll, upstreamTimeout: timeout, upstream: up,
		extra: "\ncosts:\n  output_reserve: 1\n" + roomyLimits})
	conn := streamAtkSmallWindow(t, strings.TrimPrefix(s.url, "http://"))
	defer conn.Close()
	body := `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":20,"max_completion_tokens":16000,"messages":[{"role":"user","content":"a long story"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: costgate\r\nAuthorization: Bearer cg-test-acme\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReaderSize(conn, 16)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("status line %q, %v", line, err)
	}
	// The client now stops reading, for twice the upstream's timeout.
	e, settled := streamAtkSettledWithin(t, s, 2*timeout)
	t.Logf("after %s of stall: entry status %q, upstream wrote %d of %d chunks", 2*timeout, e.Status, sent.Load(), words)
	if !settled {
		t.Errorf("the request is still %q %s after its upstream's %s timeout: a stalled client holds it (and its estimate) open", e.Status, 2*timeout, timeout)
	}
	conn.Close()
	e = s.settled(t, 1)[0]
	t.Logf("billed %d output tokens (%v)", e.Actual.OutputTokens, e.ActualCost)
	if e.Actual.OutputTokens != words {
		t.Errorf("billed %d output tokens; the upstream streamed and billed %d", e.Actual.OutputTokens, words)
	}
}

// TestStreamAttackBackgroundStreamStopped: a Responses request with
// "background": true runs on at the upstream whatever happens to the
// connection that streams it (the client resumes it later, or never), and
// the upstream bills its whole run: stopping or cutting its stream stops
// nothing. Such a request is reserved and charged its whole output limit
// unless its report is read, not the 600 tokens counted before the
// guard's stop.
func TestStreamAttackBackgroundStreamStopped(t *testing.T) {
	const words = 5000
	var billed atomic.Int64
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		background := bytes.Contains(body, []byte(`"background":true`))
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_bg\",\"model\":\"gpt-4.1-mini\",\"status\":\"in_progress\",\"background\":true,\"usage\":null}}\n\n")
		gone := false
		for i := range words {
			if !gone {
				_, err := io.WriteString(w, streamAtkResponsesEvent("response.output_text.delta", " word"))
				if i%20 == 0 {
					f.Flush()
				}
				gone = err != nil || r.Context().Err() != nil
			}
			if gone && !background {
				billed.Store(int64(i))
				return
			}
		}
		// A background run completes whether or not anyone reads it.
		billed.Store(words)
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_bg\",\"model\":\"gpt-4.1-mini\",\"status\":\"completed\",\"usage\":{\"input_tokens\":20,\"output_tokens\":%d,\"total_tokens\":%d}}}\n\n", words, words+20)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: streamAtkBudget("0.001"), upstream: up})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := s.post(t, ctx, "/v1/responses", `{"model":"gpt-4.1-mini","background":true,"stream":true,"max_output_tokens":30000,"input":"a long essay"}`)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Logf("refused at admission: %d %s", resp.StatusCode, got)
		return // the budget cannot hold the run
	}
	e := s.settled(t, 1)[0]
	t.Logf("client got %d deltas; the upstream billed %d output tokens; the ledger %d (%v)",
		bytes.Count(got, []byte(`"delta":" word"`)), billed.Load(), e.Actual.OutputTokens, e.ActualCost)
	if e.Actual.OutputTokens < billed.Load() {
		t.Errorf("billed %d output tokens; the background run the stream belonged to billed %d", e.Actual.OutputTokens, billed.Load())
	}
}

// streamAtkChunk is an OpenAI chat chunk carrying text.
func streamAtkChunk(text string) string {
	return fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":%q}}]}`+"\n\n", text)
}

// TestStreamAttackUsageReportsFlushedApart: TestPayLessSeveralStreamUsageReports
// with the upstream's writes flushed one by one, as a real upstream's
// arrive: a usage-only chunk is not the end of the stream, and the request
// is billed the last report (3,000 tokens), not the first.
func TestStreamAttackUsageReportsFlushedApart(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for _, ev := range []string{
			streamAtkChunk("hi"),
			`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1}}` + "\n\n",
			strings.Repeat(streamAtkChunk(" more"), 100),
			`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3000}}` + "\n\n",
			"data: [DONE]\n\n",
		} {
			io.WriteString(w, ev)
			f.Flush()
			time.Sleep(10 * time.Millisecond) // the pieces reach costgate apart
		}
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	e, _ := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, nil)
	if e.Actual.OutputTokens != 3000 {
		t.Errorf("billed %d output tokens; the upstream's last report billed 3000", e.Actual.OutputTokens)
	}
}

// TestStreamAttackEarlyUsageChunkDisarmsGuard: an OpenAI-compatible
// upstream whose stream opens with a usage-only chunk (its prompt's usage,
// no choices) is still guarded: the stream stops at a budget of about 150
// tokens, not after 3,000.
func TestStreamAttackEarlyUsageChunkDisarmsGuard(t *testing.T) {
	const n = 3000
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":0}}`+"\n\n")
		f.Flush()
		for i := range n {
			io.WriteString(w, streamAtkChunk(" word"))
			if i%20 == 0 {
				f.Flush()
			}
		}
		fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":%d}}`+"\n\n", n)
		io.WriteString(w, "data: [DONE]\n\n")
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: streamAtkBudget("0.0001"), upstream: up})
	e, got := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`, nil)
	shown := int64(bytes.Count(got, []byte(`"content":" word"`)))
	est := estimator(t)
	budget := costmodel.NanoUSD(100_000)
	bound := est.Cost("gpt-4o-mini", costmodel.Usage{OutputTokens: 16})
	t.Logf("client got %d tokens; ledger: %d output tokens, %v", shown, e.Actual.OutputTokens, e.ActualCost)
	if served := est.Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 10, OutputTokens: shown}); served > budget+bound {
		t.Errorf("the client was served %d output tokens (%v) past a %v budget: the guard did not stop the stream", shown, served, budget)
	}
	if e.Actual.OutputTokens < shown {
		t.Errorf("billed %d output tokens; the client got %d", e.Actual.OutputTokens, shown)
	}
}

// TestStreamAttackCutAfterRunningReport: a stream that carried a running
// usage report (Anthropic's message_delta, which may come more than once;
// an OpenAI-compatible chunk with choices and usage) and is cut later is
// billed the larger of that report and the text streamed, after it too.
func TestStreamAttackCutAfterRunningReport(t *testing.T) {
	for _, c := range []struct{ name, path, body, head, more, grep string }{
		{"anthropic", "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":8000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-haiku-4-5\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":2}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" more\"}}\n\n", `"text":" more"`},
		{"openai-running", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":1}}` + "\n\n",
			streamAtkChunk(" more"), `"content":" more"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, c.head)
				io.WriteString(w, strings.Repeat(c.more, 1000))
				// The upstream's connection breaks here: no final report.
				panic(http.ErrAbortHandler)
			}}
			s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
			e, got := oneEntry(t, s, c.path, c.body, nil)
			shown := int64(bytes.Count(got, []byte(c.grep)))
			t.Logf("client got %d tokens; billed %d output tokens", shown, e.Actual.OutputTokens)
			if e.Actual.OutputTokens < shown {
				t.Errorf("billed %d output tokens; the stream carried %d", e.Actual.OutputTokens, shown)
			}
		})
	}
}

// TestStreamAttackContentTypeSaysStream: an answer labelled
// text/event-stream whose body is a plain JSON completion (an
// OpenAI-compatible server that ignores "stream") is read as the JSON
// document it is: billed the 4,000 output tokens its usage says.
func TestStreamAttackContentTypeSaysStream(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":4000}}`)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	e, _ := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"max_completion_tokens":4000,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if e.Actual.OutputTokens < 4000 {
		t.Errorf("billed %d output tokens; the answer's usage says 4000", e.Actual.OutputTokens)
	}
}
