package proxy

import (
	"io"
	"net/http"
	"strings"

	"github.com/costgate/costgate/costmodel"
)

// maxCapture bounds how much of a JSON response is kept to read its usage.
const maxCapture = 8 << 20

// meteredBody passes the upstream's body through unchanged while it reads
// the usage from it: from the server-sent events of a stream as they pass,
// or from the JSON document of a plain response.
type meteredBody struct {
	rc       io.ReadCloser
	kind     costmodel.Kind
	stream   *costmodel.StreamMeter // set for text/event-stream
	captured []byte                 // the JSON body so far, for a plain response
	overflow bool                   // captured exceeded maxCapture
}

func (x *exchange) meter(resp *http.Response) io.ReadCloser {
	m := &meteredBody{rc: resp.Body, kind: x.kind}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		m.stream = x.s.est.NewStreamMeter(x.kind, x.est.Model)
	}
	x.body = m
	return m
}

func (m *meteredBody) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	if n > 0 {
		if m.stream != nil {
			m.stream.Write(p[:n])
		} else if !m.overflow {
			if len(m.captured)+n > maxCapture {
				m.overflow, m.captured = true, nil
			} else {
				m.captured = append(m.captured, p[:n]...)
			}
		}
	}
	return n, err
}

func (m *meteredBody) Close() error { return m.rc.Close() }

// usage is what the upstream reported, or, for a stream that ended without
// a report, what was counted from the content seen. ok is false when
// nothing could be read.
func (m *meteredBody) usage() (u costmodel.Usage, ok bool) {
	if m.stream != nil {
		u, _ = m.stream.Usage()
		return u, true
	}
	if m.overflow || len(m.captured) == 0 {
		return costmodel.Usage{}, false
	}
	u, err := costmodel.ParseUsage(m.kind, m.captured)
	return u, err == nil
}
