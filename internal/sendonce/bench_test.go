package sendonce_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/costgate/costgate/internal/sendonce"
)

// BenchmarkGet is one bodyless GET over a kept-alive loopback connection
// through net/http's Transport, as sent (plain) and after Prepare
// (prepared): Prepare gives it an empty body, which the Transport probes
// before it writes the request (a goroutine and a timer), the price of
// never sending it twice. The server's work is in both.
func BenchmarkGet(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"results":[]}`))
	}))
	b.Cleanup(srv.Close)
	for _, prepare := range []bool{false, true} {
		name := "plain"
		if prepare {
			name = "prepared"
		}
		b.Run(name, func(b *testing.B) {
			tr := &http.Transport{}
			b.Cleanup(tr.CloseIdleConnections)
			b.ReportAllocs()
			for b.Loop() {
				req, err := http.NewRequest(http.MethodGet, srv.URL+"/search?q=costgate", nil)
				if err != nil {
					b.Fatal(err)
				}
				if prepare {
					sendonce.Prepare(req)
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
