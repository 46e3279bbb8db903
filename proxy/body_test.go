package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/costgate/costgate/config"
)

// TestSlowBodyTimesOut: a client that sends its headers and then stalls in
// its body gets a 408 once the body's time is up, instead of holding the
// request for good; on the proxy's routes and the reserve API's alike.
func TestSlowBodyTimesOut(t *testing.T) {
	defer func(d time.Duration) { bodyReadTimeout = d }(bodyReadTimeout)
	bodyReadTimeout = 300 * time.Millisecond
	cfg, err := config.Parse([]byte(`admin_token: x
data_dir: ` + t.TempDir() + `
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants: [{name: acme, plan: p, keys: [{key: cg-acme}]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store.Redis, cfg.Ledger.DSN = "", ""
	srv, err := Open(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	for _, path := range []string{"/v1/chat/completions", "/v1/costgate/reserve", "/v1/costgate/settle", "/v1/costgate/release"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprint(conn, "POST "+path+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer cg-acme\r\n"+
			"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: no answer to a stalled body: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("%s: status %d, want 408", path, resp.StatusCode)
		}
	}
}

// TestReadAll reads bodies as io.ReadAll does, whatever length they
// declare, and makes no more room than preallocMax before bytes arrive.
func TestReadAll(t *testing.T) {
	big := strings.Repeat("x", 3*preallocMax+7)
	for _, c := range []struct {
		name     string
		body     string
		declared int64
		limit    int64
		wantErr  bool
	}{
		{name: "exact", body: `{"model":"m"}`, declared: 13, limit: 100},
		{name: "unknown length", body: `{"model":"m"}`, declared: -1, limit: 100},
		{name: "empty", body: "", declared: 0, limit: 100},
		{name: "declared larger than sent", body: "abc", declared: 1 << 40, limit: 1 << 41},
		{name: "declared smaller than sent", body: big, declared: 5, limit: 1 << 30},
		{name: "larger than preallocMax", body: big, declared: int64(len(big)), limit: 1 << 30},
		{name: "over the limit", body: big, declared: int64(len(big)), limit: 100, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rd := http.MaxBytesReader(rec, io.NopCloser(strings.NewReader(c.body)), c.limit)
			got, err := readAll(rd, c.declared, c.limit)
			if c.wantErr {
				var tooBig *http.MaxBytesError
				if !errors.As(err, &tooBig) {
					t.Fatalf("err %v, want a MaxBytesError", err)
				}
				return
			}
			if err != nil || string(got) != c.body {
				t.Fatalf("read %d bytes, err %v; want the %d bytes sent", len(got), err, len(c.body))
			}
		})
	}
	// A client that declares 1 TiB and sends nothing gets preallocMax of
	// room at most.
	b, err := readAll(iotest.ErrReader(io.ErrUnexpectedEOF), 1<<40, 1<<41)
	if !errors.Is(err, io.ErrUnexpectedEOF) || cap(b) > preallocMax {
		t.Fatalf("cap %d, err %v: want at most %d and the reader's error", cap(b), err, preallocMax)
	}
}

// TestEventEnd: an event ends at a blank line whatever the SSE line ends
// it uses ("\n", "\r\n", a lone "\r"), and a "\r" at the end of what has
// arrived waits for the next byte, which may make it "\r\n".
func TestEventEnd(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"data: a\n\nrest", 9},
		{"data: a\r\n\r\nrest", 11},
		{"data: a\r\rrest", 9},
		{"data: a\r\n\nrest", 10},
		{"data: a\n\r\nrest", 10},
		{"data: a\n\rrest", 9},
		{"data: a\r\r\nrest", 10}, // the blank line ends with "\r\n"
		{"data: a\ndata: b\r\rx", 17},
		{"data: a\ndata: b\r\r", -1},
		{"data: a\r", -1},
		{"data: a\r\r", -1}, // the second "\r" may be "\r\n"
		{"data: a\n\r", -1},
		{"data: a\n", -1},
		{"data: a", -1},
		{"", -1},
	} {
		if got := eventEnd([]byte(c.in)); got != c.want {
			t.Errorf("eventEnd(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}
