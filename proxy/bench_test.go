package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/proxy"
)

// benchReply is the stub upstream's answer to every request: a short chat
// completion with usage, as bench/proxyload's.
const benchReply = `{"id":"chatcmpl-bench","object":"chat.completion","created":1764500000,"model":"gpt-4o-mini",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":14,"completion_tokens":9,"total_tokens":23}}`

const benchRequest = `{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`

type benchPool struct{ p sync.Pool }

func (b *benchPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *benchPool) Put(v []byte) { b.p.Put(&v) }

// BenchmarkPipeline runs the load of bench/proxy.sh in process, side by
// side: a bare tuned httputil.ReverseProxy, and costgate with
// bench/proxy/costgate.yaml (three limits, the quickstart policy, the
// embedded ledger) on the in-memory store and on a private Redis, all in
// front of the same stub upstream, 32 concurrent clients. ns/op, cpu-ns/op and
// allocs/op include the client and the stub; the difference between bare
// and costgate is costgate's. The figures for the targets come
// from bench/proxy.sh, which runs each process apart.
//
//	go test -run XXX -bench Pipeline -benchmem -count 5 ./proxy/
func BenchmarkPipeline(b *testing.B) {
	reply := []byte(benchReply)
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(reply)
	}))
	defer stub.Close()
	target, _ := url.Parse(stub.URL)
	tuned := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 512, IdleConnTimeout: 90 * time.Second}
	bare := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:    func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:  tuned,
		BufferPool: &benchPool{},
	})
	defer bare.Close()

	b.Run("bare", func(b *testing.B) { benchLoad(b, bare.URL) })
	b.Run("costgate-memory", func(b *testing.B) { benchLoad(b, benchCostgate(b, stub.URL, "", false)) })
	b.Run("costgate-memory-capture", func(b *testing.B) { benchLoad(b, benchCostgate(b, stub.URL, "", true)) })
	b.Run("costgate-redis", func(b *testing.B) { benchLoad(b, benchCostgate(b, stub.URL, redistest.New(b).URL, false)) })
	b.Run("costgate-leased", func(b *testing.B) { benchLoad(b, benchLeased(b, stub.URL)) })
}

// benchLeased starts costgate with the benchmark's config, every limit
// leased as bench/proxy.sh's second costgate (lease: {max_share: 0.01,
// ttl: 2s}), on a private Redis, and returns its URL.
func benchLeased(b *testing.B, upstream string) string {
	b.Helper()
	return benchCostgateWith(b, upstream, redistest.New(b).URL, false, func(yaml string) string {
		return strings.ReplaceAll(yaml, "    period: 1s\n", "    period: 1s\n    lease: {max_share: 0.01, ttl: 2s}\n")
	})
}

// benchCostgate starts costgate with the benchmark's config in front of
// upstream, capturing every request's policy input when capture is set,
// and returns its URL.
func benchCostgate(b *testing.B, upstream, redisURL string, capture bool) string {
	b.Helper()
	return benchCostgateWith(b, upstream, redisURL, capture, func(yaml string) string { return yaml })
}

// benchCostgateWith is benchCostgate with edit applied to the config's
// text.
func benchCostgateWith(b *testing.B, upstream, redisURL string, capture bool, edit func(string) string) string {
	b.Helper()
	tmpl, err := os.ReadFile("../bench/proxy/costgate.yaml")
	if err != nil {
		b.Fatal(err)
	}
	yaml := strings.NewReplacer("http://@UPSTREAM@", upstream, "@POLICIES@", "../bench/proxy/policies").Replace(string(tmpl))
	cfg, err := config.Parse([]byte(edit(yaml)))
	if err != nil {
		b.Fatal(err)
	}
	cfg.DataDir, cfg.Store.Redis, cfg.Ledger.DSN = b.TempDir(), redisURL, ""
	cfg.Capture.Enabled = capture
	return serveBench(b, cfg)
}

// serveBench serves a proxy on cfg on loopback for the benchmark and
// returns its URL.
func serveBench(b *testing.B, cfg *config.Config) string {
	b.Helper()
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	ts := httptest.NewServer(srv.Handler())
	b.Cleanup(ts.Close)
	return ts.URL
}

// benchLoad sends the benchmark's request b.N times from 32 clients.
func benchLoad(b *testing.B, base string) {
	const conns = 32
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	body := []byte(benchRequest)
	send := func() error {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer cg-bench")
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return &statusError{resp.StatusCode}
		}
		return nil
	}
	if err := send(); err != nil { // warm the connection and the caches
		b.Fatal(err)
	}
	b.SetParallelism((conns + 1) / 2) // RunParallel starts GOMAXPROCS × this
	b.ResetTimer()
	start := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := send(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	// The process's CPU (client, stub and proxy together): on a shared
	// machine ns/op includes waiting for a CPU, cpu-ns/op does not.
	b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
}

type statusError struct{ code int }

func (e *statusError) Error() string { return "status " + http.StatusText(e.code) }
