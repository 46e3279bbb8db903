package proxy

// The stream guard: a stream is admitted on its reservation, which holds
// output_reserve percent of the output it may produce. With the guard on
// (stream_guard), costgate counts the stream's output after every event, and
// before the event goes on to the client it debits the output beyond what
// is held, in increments of increment_tokens, on every limit and budget of
// the request that counts output (gate.Reservation.Extend). When an
// increment is refused, the event that needed it goes on (it is billed),
// then the stream ends in its API's own format: for OpenAI's chat and
// completions a last chunk with finish_reason "length" and an error object,
// then [DONE]; for the Responses API an error event; for Anthropic an error
// event. The official SDKs return these as errors. The upstream's
// connection is closed, and the request is billed the output counted, as a
// cut stream is. So a stream goes past what its limits hold by at most the
// output of one event.

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
)

// streamGuard debits one stream's output in increments. It is owned by the
// goroutine that reads the stream.
type streamGuard struct {
	x         *exchange
	inc       int64 // tokens per increment
	allowance int64 // output tokens the limits hold for the stream: reserved and extended
	web, file int64 // web and file searches the limits hold for the stream: reserved and extended
	refused   *gate.Decision
}

// guardFor returns the stream guard of x's stream, or nil when it has none:
// the guard is off for its upstream, or the route is not one of the four
// streamed LLM APIs.
func (x *exchange) guardFor() *streamGuard {
	if x.res == nil {
		return nil
	}
	switch x.kind {
	case costmodel.ChatCompletions, costmodel.Completions, costmodel.Responses, costmodel.AnthropicMessages:
	default:
		return nil
	}
	cfg := x.st.cfg.StreamGuard(x.upstream.name)
	if !cfg.Enabled {
		return nil
	}
	// What the gate reserved, which is less than the estimate's output
	// under output_reserve: pNN (the learned quantile of the key's output).
	u := x.res.Request().Estimate.Usage
	return &streamGuard{x: x, inc: cfg.IncrementTokens, allowance: u.OutputTokens, web: u.WebSearchRequests, file: u.FileSearchCalls}
}

// allow debits what the output counted so far needs beyond the allowance,
// rounded up to whole increments. It returns false, with the refusal kept,
// when the limits refuse it.
//
// Searches the stream shows beyond those held (billed apart, per search)
// are debited with it, one for one.
func (g *streamGuard) allow(m *costmodel.StreamMeter) bool {
	if g.refused != nil {
		return false
	}
	var extra costmodel.Usage
	if out, above := m.OutputAbove(g.allowance); above {
		extra.OutputTokens = (out - g.allowance + g.inc - 1) / g.inc * g.inc
	}
	web, file := m.Searches()
	extra.WebSearchRequests, extra.FileSearchCalls = max(web-g.web, 0), max(file-g.file, 0)
	if extra == (costmodel.Usage{}) {
		return true
	}
	d, ok := g.x.res.Extend(context.WithoutCancel(g.x.ctx), extra)
	if !ok {
		g.refused = &d
		return false
	}
	g.allowance += extra.OutputTokens
	g.web += extra.WebSearchRequests
	g.file += extra.FileSearchCalls
	return true
}

// streamError is the error object of the event that ends a stopped stream.
type streamError struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

// end is the end of a stream the guard stopped, in the stream's API's own
// format.
func (g *streamGuard) end(model string) []byte {
	e := streamError{Type: "api_error", Message: "the stream was stopped"}
	if d := g.refused; d != nil && d.Error != nil {
		e = streamError{Type: d.Error.Type, Code: d.Error.Code, Message: d.Error.Message}
	}
	x := g.x
	if model == "" {
		model = x.est.Model
	}
	var b []byte
	switch x.kind {
	case costmodel.AnthropicMessages:
		b, _ = json.Marshal(struct {
			Type  string      `json:"type"`
			Error streamError `json:"error"`
		}{"error", e})
		return append(append([]byte("event: error\ndata: "), b...), "\n\n"...)
	case costmodel.Responses:
		b, _ = json.Marshal(struct {
			Type    string      `json:"type"`
			Code    string      `json:"code"`
			Message string      `json:"message"`
			Param   *string     `json:"param"`
			Error   streamError `json:"error"`
		}{"error", e.Type, e.Message, nil, e})
		return append(append([]byte("event: error\ndata: "), b...), "\n\n"...)
	}
	type choice struct {
		Index        int       `json:"index"`
		Delta        *struct{} `json:"delta,omitempty"`
		Text         *string   `json:"text,omitempty"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason string    `json:"finish_reason"`
	}
	c := choice{FinishReason: "length"}
	object := "chat.completion.chunk"
	if x.kind == costmodel.Completions {
		object, c.Text = "text_completion", new(string)
	} else {
		c.Delta = &struct{}{}
	}
	b, _ = json.Marshal(struct {
		ID      string      `json:"id"`
		Object  string      `json:"object"`
		Created int64       `json:"created"`
		Model   string      `json:"model"`
		Choices []choice    `json:"choices"`
		Error   streamError `json:"error"`
	}{x.id, object, time.Now().Unix(), model, []choice{c}, e})
	out := append([]byte("data: "), b...)
	return append(out, "\n\ndata: [DONE]\n\n"...)
}

// guarded meters one whole event of a stream and tells whether the stream
// goes on after it: not after its terminal event, nor after one whose
// increment the guard (when on) refused. A stream that has carried its
// final usage report has ended: it is never stopped.
func (m *meteredBody) guarded(ev []byte) bool {
	m.observe(ev)
	if m.stream.Ended() {
		return false
	}
	return m.guard == nil || m.guard.allow(m.stream)
}

// pass moves bytes that are not a whole event to out, metering them
// first.
func (m *meteredBody) pass(b []byte) {
	if len(b) > 0 {
		m.observe(b)
	}
	m.out = append(m.out, b...)
}

// stop ends a stream after the event guarded refused to go on from. After
// its terminal event (see end), or else after the event whose increment
// the guard refused: the guard's end goes to the client after the events
// already out, nothing more is read, and the upstream's connection is
// closed, so that the upstream stops producing.
func (m *meteredBody) stop() {
	if m.stream.Ended() {
		m.end()
		return
	}
	m.stopped = true
	m.out = append(m.out, m.guard.end(m.stream.Model())...)
	m.buf = nil
	m.err = io.EOF
	m.rc.Close()
}

// end ends the client's stream after its terminal event ([DONE], Anthropic's
// message_stop, a Responses stream's completed, incomplete or failed
// event): what an upstream sends after it would reach a client that reads
// on (the Anthropic SDKs and the Responses stream of the OpenAI SDKs do)
// neither guarded nor billed, so it never goes on. With its final report
// read, the stream is complete and the upstream's connection is closed;
// without it, Close reads the rest (buf first) for a report the upstream
// sends after its end, and bills what it carries.
func (m *meteredBody) end() {
	m.ended = true
	if m.stream.Reported() {
		m.buf = nil
		m.err = io.EOF
		m.rc.Close()
	}
}

// readStream passes a stream on whole events at a time, in place: the
// upstream's bytes are read into p after the event the last read cut,
// each whole event is metered and checked, and p goes to the client up to
// the last whole event (or up to the stream's terminal event, or the event
// after which the guard stopped the stream, then the stream's end).
func (m *meteredBody) readStream(p []byte) (int, error) {
	if len(m.out) > 0 {
		n := copy(p, m.out)
		m.out = m.out[n:]
		return n, nil
	}
	if m.ended {
		return 0, io.EOF
	}
	if m.err != nil {
		return 0, m.err
	}
	if len(m.buf) >= len(p)/2 {
		// A cut event as long as half of p: not an event stream as the
		// APIs write one; pass it on as it is.
		m.pass(m.buf)
		m.buf = m.buf[:0]
		n := copy(p, m.out)
		m.out = m.out[n:]
		return n, nil
	}
	have := copy(p, m.buf)
	m.buf = m.buf[:0]
	for {
		n, err := m.rc.Read(p[have:])
		have += n
		sent := 0
		for !m.halted() {
			end := eventEnd(p[sent:have])
			if end < 0 {
				break
			}
			ev := p[sent : sent+end]
			sent += end
			if !m.guarded(ev) {
				m.stop()
			}
		}
		if m.ended && m.err == nil {
			// What follows the end is metered, never passed on: here
			// when the upstream's answer is over, else by Close.
			if err != nil {
				m.observe(p[sent:have])
				m.err = err
			} else {
				m.buf = append(m.buf, p[sent:have]...)
			}
		}
		if m.halted() {
			n := copy(p[sent:], m.out)
			m.out = m.out[n:]
			return sent + n, nil
		}
		if err != nil {
			// An event cut by the end of the stream goes on as it is.
			if have > sent {
				m.observe(p[sent:have])
			}
			m.err = err
			if have == 0 {
				return 0, err
			}
			return have, nil
		}
		if sent > 0 || have == len(p) {
			if sent == 0 { // p is full and holds no whole event
				m.observe(p[:have])
				return have, nil
			}
			m.buf = append(m.buf, p[sent:have]...)
			return sent, nil
		}
	}
}

// drainStream reads on a stream whose client stopped reading, or that
// ended without its final report, up to maxDrain bytes, event by event,
// so that the guard stops it where it would have stopped it for the
// client and a report after its end is read. buf is scratch space.
func (m *meteredBody) drainStream(buf []byte) {
	carry := append([]byte(nil), m.buf...) // the cut event the client never got
	m.buf = nil
	for m.drained < maxDrain {
		n, err := m.rc.Read(buf)
		m.drained += int64(n)
		carry = append(carry, buf[:n]...)
		done := 0
		for {
			end := eventEnd(carry[done:])
			if end < 0 {
				break
			}
			ev := carry[done : done+end]
			done += end
			if m.ended {
				// After the end: metered for its report, nothing guarded.
				m.observe(ev)
				if m.stream.Reported() {
					m.err = io.EOF
					return
				}
				continue
			}
			if !m.guarded(ev) {
				if m.stream.Ended() {
					m.ended = true
					continue
				}
				m.stopped = true // Close closes the upstream: nothing more is produced or charged
				return
			}
		}
		carry = carry[:copy(carry, carry[done:])]
		if len(carry) > maxEvent {
			m.observe(carry)
			carry = carry[:0]
		}
		if err != nil {
			if len(carry) > 0 {
				m.observe(carry)
			}
			m.err = err
			return
		}
	}
}
