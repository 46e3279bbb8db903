package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
)

// TestSlowBodyTimesOut: a client that sends its headers and then stalls in
// its body gets a 408 once the body's time is up, instead of holding the
// request for good.
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

	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer cg-acme\r\n"+
		"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", resp.StatusCode)
	}
}
