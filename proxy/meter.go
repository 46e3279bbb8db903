package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/costgate/costgate/costmodel"
)

// maxCapture bounds how much of a JSON response is kept to read its usage.
const maxCapture = 8 << 20

// armWhole is the size of a plain answer read whole past which its writes
// to the client are bound by the stall bound (see stallBound). A smaller
// one fits in the connection's buffers, and its writes go without a timer.
const armWhole = 64 << 10

// maxEvent bounds how much of one server-sent event is held back while
// usage reports are hidden from the client.
const maxEvent = 1 << 20

// maxDrain bounds how much of an answer costgate reads on its own after
// the client stopped reading it (see meteredBody.Close).
const maxDrain = 64 << 20

// meteredBody passes the upstream's body on while it reads the usage from
// it: from the server-sent events of a stream as they pass, or from the
// JSON document of a plain response.
//
// When costgate asked the upstream for a usage report the client did not ask
// for (stream_options.include_usage), the body also hides that report from
// the client: it forwards whole events, drops the usage-only chunk, and
// removes the "usage":null member the upstream then adds to every chunk.
// Events are forwarded as soon as they are complete; nothing else waits.
type meteredBody struct {
	x        *exchange
	rc       io.ReadCloser
	kind     costmodel.Kind
	stream   *costmodel.StreamMeter // set for text/event-stream
	captured []byte                 // the body so far, for a plain response
	overflow bool                   // the body is larger than maxCapture: captured holds its start
	tail     costmodel.UsageTap     // an overflowing plain answer, from its start: its usage report
	filled   bool                   // a plain response has been read up to its end or maxCapture
	sent     int                    // bytes of captured passed to the client

	hideUsage bool
	buf       []byte // read from upstream, not yet split into events
	out       []byte // events ready for the client
	outBase   []byte // out's space, from its start
	err       error  // the upstream's read error (io.EOF at the end), returned once out is drained
	drained   int64  // bytes read by Close after the client stopped reading

	resp    *http.Response // the upstream's answer, whose trailers Close scrubs; nil in tests of the body alone
	guard   *streamGuard   // debits the stream's output as it passes; nil when off
	stopped bool           // the guard stopped the stream
	ended   bool           // the stream's terminal event went to the client: nothing after it does (see end)

	// jsonStream tells that a text/event-stream answer starts with '{':
	// a JSON document, not events (a server that ignored "stream"). Its
	// start is kept in captured, to read its usage from.
	jsonStream bool
	started    bool // a stream's first byte that is not white space was seen
	owned      bool // a Responses stream's id was recorded as the tenant's (see exchange.own)
}

func (x *exchange) meter(resp *http.Response) io.ReadCloser {
	m := &meteredBody{x: x, rc: resp.Body, resp: resp, kind: x.kind}
	if costmodel.IsEventStream(resp.Header.Get("Content-Type")) {
		// Text/Event-Stream too: ReverseProxy flushes it as a stream.
		x.client.armed = true // the client gets the stream as it is read
		m.stream = x.caller.Estimator().NewStreamMeter(x.kind, x.est.Model)
		// A stream cut before its usage report never states its input;
		// the estimate's count of it is exact for the OpenAI encodings.
		m.stream.SetInputTokens(promptTokens(x.servedEstimate().Usage))
		m.hideUsage = x.injectedUsage
		m.guard = x.guardFor()
	}
	x.body = m
	return m
}

func (m *meteredBody) Read(p []byte) (int, error) {
	if m.hideUsage {
		return m.readEvents(p)
	}
	if m.stream == nil {
		return m.readWhole(p)
	}
	return m.readStream(p)
}

// observe feeds bytes from the upstream to the meter or the capture. Once
// a stream has carried its usage report, the request is settled in the
// ledger, before these bytes go on to the client.
func (m *meteredBody) observe(b []byte) {
	if m.stream != nil {
		if !m.started {
			if t := bytes.TrimLeft(bytes.TrimPrefix(b, []byte("\ufeff")), " \t\r\n"); len(t) > 0 {
				m.started, m.jsonStream = true, t[0] == '{'
			}
		}
		if m.jsonStream && m.stream.Events() == 0 && len(m.captured) <= maxCapture {
			m.captured = append(m.captured, b...)
		}
		m.stream.Write(b)
		if m.x != nil && !m.owned {
			if id := m.stream.ResponseID(); id != "" {
				m.owned = true
				m.x.own(id) // before these bytes, which name it, reach the client
			}
		}
		if m.x != nil && m.stream.Reported() {
			m.x.settleEarly()
		}
		return
	}
	if m.overflow {
		m.tail.Write(b)
		return
	}
	m.captured = append(m.captured, b...)
	m.overflow = len(m.captured) > maxCapture
	if m.overflow {
		// The usage report comes after the output: read it as the rest
		// passes.
		m.tail.Write(m.captured)
		if m.x != nil {
			m.x.client.armed = true // the rest passes through as it is read
		}
	}
}

// readWhole passes on a plain (not streamed) answer. It reads the answer
// whole first, up to maxCapture, and settles the request from it before
// the client has any of it: an upstream writes such an answer at once, so
// the client waits no longer, and a crash after the client has its answer
// bills the usage in it. A larger answer passes through once its first
// maxCapture bytes have, charged at the request's output limit (see
// exchange.actualUsage).
func (m *meteredBody) readWhole(p []byte) (int, error) {
	m.fill()
	if m.sent < len(m.captured) {
		n := copy(p, m.captured[m.sent:])
		m.sent += n
		return n, nil
	}
	if m.err != nil {
		return 0, m.err
	}
	n, err := m.rc.Read(p)
	if n > 0 {
		m.observe(p[:n])
	}
	m.err = err
	return n, err
}

// fill reads a plain answer whole, up to maxCapture, once, and settles
// the request when it came to its end. It returns the upstream's read
// error when the answer ended before its end (nil at io.EOF or past
// maxCapture). modifyResponse calls it before the answer's header is
// written, so that such an answer is an error to the client.
func (m *meteredBody) fill() error {
	if m.filled {
		return nil
	}
	m.filled = true
	bp := buffers.Get().(*[]byte)
	for !m.overflow && m.err == nil {
		n, err := m.rc.Read(*bp)
		m.observe((*bp)[:n])
		m.err = err
	}
	buffers.Put(bp)
	if m.x != nil && len(m.captured) > armWhole {
		// More than the connection's buffers may take while the client
		// reads nothing: its writes are bound as a stream's are, or a
		// client that never reads would hold the request, and the
		// answer's bytes, for ever.
		m.x.client.armed = true
	}
	if m.x != nil && m.kind == costmodel.Responses {
		// Its id comes first: read from the start kept of a larger answer.
		m.x.own(costmodel.ResponseID(m.captured))
	}
	if errors.Is(m.err, io.EOF) {
		if m.x != nil {
			m.x.settleEarly()
		}
		return nil
	}
	return m.err
}

// cutShort tells whether costgate ended the upstream's answer before its
// end: the guard stopped it, or it was not read to io.EOF (the upstream's
// timeout, a broken connection, the drain's bound).
func (m *meteredBody) cutShort() bool {
	return m.stopped || !errors.Is(m.err, io.EOF)
}

// halted tells whether nothing more of the stream goes to the client:
// the guard stopped it, or its terminal event went.
func (m *meteredBody) halted() bool { return m.stopped || m.ended }

// skipped tells whether a stream carried an event the meter could not
// read (too long, or not JSON it reads), in which a usage report would be
// lost (see costmodel.StreamMeter.Skipped and Malformed).
func (m *meteredBody) skipped() bool {
	return m.stream != nil && m.stream.Skipped()+m.stream.Malformed() > 0
}

// coded tells whether a stream came in a content coding costgate did not
// decode (the transport decodes the gzip it asks for and drops the
// header; an upstream may compress unasked): the meter read its bytes,
// not its events, and a usage report in it is lost.
func (m *meteredBody) coded() bool {
	return m.stream != nil && m.resp != nil && len(costmodel.ContentCodings(m.resp.Header)) > 0
}

// outputUnstated tells whether a stream's final report states no output
// (see costmodel.StreamMeter.OutputStated); false for an answer read as a
// document, whose usage states it or cannot be read.
func (m *meteredBody) outputUnstated() bool {
	return m.stream != nil && !(m.jsonStream && m.stream.Events() == 0) && !m.stream.OutputStated()
}

// overflowUsage is the usage report of a plain answer too large to keep
// whole, read as it passed (see costmodel.UsageTap); ok is false when it
// was not read whole, or not read.
func (m *meteredBody) overflowUsage() (costmodel.Usage, bool) {
	if m.stream != nil || !m.overflow || !errors.Is(m.err, io.EOF) {
		return costmodel.Usage{}, false
	}
	return m.tail.Usage(m.kind)
}

// whole is the plain answer's body, or nil when it was larger than
// maxCapture.
func (m *meteredBody) whole() []byte {
	if m.overflow {
		return nil
	}
	return m.captured
}

// readEvents forwards whole events, filtered.
func (m *meteredBody) readEvents(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(m.out) == 0 {
		m.out = m.outBase[:0] // out's space is reused once it is sent
	}
	for len(m.out) == 0 {
		if m.ended {
			return 0, io.EOF
		}
		if m.err != nil {
			return 0, m.err
		}
		// p is scratch space until the events are copied into it.
		n, err := m.rc.Read(p)
		if n > 0 {
			m.buf = append(m.buf, p[:n]...)
			m.split()
			if len(m.buf) > maxEvent {
				// Not an event stream as OpenAI writes one: pass it on as
				// it is rather than hold it.
				m.pass(m.buf)
				m.buf = m.buf[:0]
			}
		}
		if err != nil && !m.halted() {
			// An event cut by the end of the stream goes on as it is.
			m.pass(m.buf)
			m.buf = nil
			m.err = err
		}
		m.outBase = m.out[:0]
	}
	n := copy(p, m.out)
	m.out = m.out[n:]
	return n, nil
}

// split moves the complete events of buf to out, dropping usage reports
// when they are hidden. The events are metered one by one here, and the
// stream ends after its terminal event, or after the one the guard
// refused (see guard.go).
func (m *meteredBody) split() {
	rest := m.buf
	defer func() {
		// Keep the cut event at the front: buf's space is reused.
		m.buf = m.buf[:copy(m.buf, rest)]
	}()
	for !m.halted() {
		end := eventEnd(rest)
		if end < 0 {
			return
		}
		ev := rest[:end]
		rest = rest[end:]
		goOn := m.guarded(ev)
		if !m.hideUsage {
			m.out = append(m.out, ev...)
		} else {
			m.hide(ev)
		}
		if !goOn {
			m.stop()
		}
	}
}

// eventEnd is the length of the first event of b with the blank line
// that ends it, or -1 when b holds no whole event. A line ends at "\r\n",
// "\n" or a lone "\r" (the SSE format's three), so the blank line is two
// ends in a row ("\n\n", "\r\n\r\n", "\r\r", or a mix). A "\r" at the end
// of b may be the first half of "\r\n": the event waits for the next byte.
func eventEnd(b []byte) int {
	for i := 0; ; {
		j := costmodel.LineEnd(b[i:])
		if j < 0 {
			return -1
		}
		k := i + j + 1 // after the line's end
		if b[k-1] == '\r' {
			if k == len(b) {
				return -1
			}
			if b[k] == '\n' {
				k++
			}
		}
		switch {
		case k < len(b) && b[k] == '\n':
			return k + 1
		case k < len(b) && b[k] == '\r':
			if k+1 == len(b) {
				return -1
			}
			if b[k+1] == '\n' {
				return k + 2
			}
			return k + 1
		}
		i = k
	}
}

// hide moves one event to out without the usage report costgate asked for.
func (m *meteredBody) hide(ev []byte) {
	// Strip the "usage":null members into out first: an ordinary chunk
	// then has no "usage" left, and needs no JSON parse to tell it from
	// the report.
	start := len(m.out)
	for {
		before, after, found := bytes.Cut(ev, nullUsage)
		m.out = append(m.out, before...)
		if !found {
			break
		}
		ev = after
	}
	if isUsageReport(m.out[start:]) {
		m.out = m.out[:start]
	}
}

// nullUsage is the member an upstream asked for a usage report adds to
// every chunk before the report.
var nullUsage = []byte(`,"usage":null`)

// isUsageReport tells whether an OpenAI stream event is the usage-only
// chunk: a usage object and no choices.
func isUsageReport(ev []byte) bool {
	i := bytes.Index(ev, []byte("data:"))
	if i < 0 || !bytes.Contains(ev, []byte(`"usage"`)) {
		return false
	}
	var chunk struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   json.RawMessage   `json:"usage"`
	}
	if json.Unmarshal(bytes.TrimSpace(ev[i+5:]), &chunk) != nil {
		return false
	}
	return len(chunk.Choices) == 0 && len(chunk.Usage) > 0 && string(chunk.Usage) != "null"
}

// Close ends the upstream's answer. When the client stopped reading
// before the end (it went away, or the copy to it failed), Close first reads
// the rest itself, up to maxDrain bytes and within the upstream's timeout
// (the upstream exchange does not end with the client's connection), so
// that the usage report the upstream bills by is still metered: a client
// that cuts a stream after its first chunk pays what the upstream charged,
// hidden reasoning tokens included.
func (m *meteredBody) Close() error {
	if m.err == nil && !m.stopped {
		m.drain() // also after the terminal event of a stream with no final report yet (see end)
	}
	err := m.rc.Close()
	if m.resp != nil {
		// The upstream's trailers are in once its body is closed, and
		// ReverseProxy copies them after.
		dropOwnTrailers(m.resp)
	}
	return err
}

func (m *meteredBody) drain() {
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	buf := *bp
	if m.stream != nil {
		m.drainStream(buf)
		return
	}
	for m.drained < maxDrain {
		n, err := m.rc.Read(buf)
		if n > 0 {
			m.observe(buf[:n])
			m.drained += int64(n)
		}
		if err != nil {
			m.err = err
			return
		}
	}
}

// usage is what the upstream reported, or, for a stream that ended without
// its final report, what was counted from the content seen, never less
// than a running report it carried (reported false); model
// is the model the answer says served it. ok is false when nothing could be
// read.
func (m *meteredBody) usage() (u costmodel.Usage, model string, reported, ok bool) {
	if m.stream != nil {
		u, reported = m.stream.Usage()
		// A running report (a stream cut before its final one) is not
		// the bill: the stream is charged as one cut before any report,
		// no less than it.
		reported = reported && m.stream.Reported()
		if m.jsonStream && m.stream.Events() == 0 {
			// Not a stream: read it as the document it is, or charge it
			// as an answer whose usage cannot be read.
			return m.document()
		}
		return u, m.stream.Model(), reported, true
	}
	if m.overflow || len(m.captured) == 0 {
		return costmodel.Usage{}, "", false, false
	}
	return m.document()
}

// document reads the usage of the answer kept whole. A Responses answer
// whose run is not over (a background request's, queued or in progress)
// has no usage that can be read, whatever it states (zeros).
func (m *meteredBody) document() (u costmodel.Usage, model string, reported, ok bool) {
	u, model, err := costmodel.ParseResponse(m.kind, m.captured)
	if err == nil && m.kind == costmodel.Responses && costmodel.ResponseRunning(m.captured) {
		return costmodel.Usage{}, model, false, false
	}
	return u, model, err == nil, err == nil
}
