package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
)

// guardBenchTokens is the length of the benchmark's streamed answer: one
// chunk per token, then the usage report.
const guardBenchTokens = 500

// BenchmarkStreamGuard measures what the stream guard costs a streamed
// request: the same stream of 500 one-word chunks of English (with the usage report
// the client asked for) through a bare httputil.ReverseProxy, and through
// costgate with output_reserve 1, a daily budget and the guard off, then
// on (increments of 256 tokens: the answer's 500 tokens take two
// increments, and two more settlements), on the in-memory store, 8 concurrent clients. cpu-ns/op is
// the whole process's CPU (client and stub upstream included) per
// request; guard-on over guard-off is the guard's share of a streamed
// request, and (on - off) / (off - bare) its share of costgate's own CPU.
//
//	go test -run XXX -bench StreamGuard -benchtime 2000x -count 5 ./proxy/
func BenchmarkStreamGuard(b *testing.B) {
	var stream bytes.Buffer
	words := strings.Fields("the cost of a token is what the model charges for it and a budget holds many of them until the day ends")
	for i := range guardBenchTokens {
		fmt.Fprintf(&stream, `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1764500000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" %s"},"finish_reason":null}]}`+"\n\n", words[i%len(words)])
	}
	fmt.Fprintf(&stream, `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1764500000,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":14,"completion_tokens":%d,"total_tokens":%d}}`+"\n\ndata: [DONE]\n\n", guardBenchTokens, guardBenchTokens+14)
	reply := stream.Bytes()
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		// In pieces of 4 KiB, as a stream arrives.
		for b := reply; len(b) > 0; {
			n := min(len(b), 4<<10)
			w.Write(b[:n])
			w.(http.Flusher).Flush()
			b = b[n:]
		}
	}))
	defer stub.Close()
	target, _ := url.Parse(stub.URL)
	bare := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:    func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:  &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second},
		BufferPool: &benchPool{},
	})
	defer bare.Close()
	b.Run("bare", func(b *testing.B) { benchStream(b, bare.URL) })
	b.Run("guard-off", func(b *testing.B) { benchStream(b, guardCostgate(b, stub.URL, false)) })
	b.Run("guard-on", func(b *testing.B) { benchStream(b, guardCostgate(b, stub.URL, true)) })
}

// guardCostgate starts costgate with the proxy benchmark's config, a
// roomy daily budget, output_reserve 1 and the stream guard on or off.
func guardCostgate(b *testing.B, upstream string, guard bool) string {
	b.Helper()
	tmpl, err := os.ReadFile("../bench/proxy/costgate.yaml")
	if err != nil {
		b.Fatal(err)
	}
	yaml := strings.NewReplacer("http://@UPSTREAM@", upstream, "@POLICIES@", "../bench/proxy/policies").Replace(string(tmpl))
	yaml += fmt.Sprintf("\ncosts:\n  output_reserve: 1\nstream_guard:\n  enabled: %v\nbudgets:\n  - name: bench-daily\n    amount: \"1000000\"\n", guard)
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	cfg.DataDir, cfg.Store.Redis, cfg.Ledger.DSN = b.TempDir(), "", ""
	return serveBench(b, cfg)
}

// benchStream streams the benchmark's answer b.N times from 8 clients and
// reports the process's CPU per request.
func benchStream(b *testing.B, base string) {
	const conns = 8
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	body := []byte(fmt.Sprintf(`{"model":"gpt-4o-mini","max_tokens":%d,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Stream to the benchmark."}]}`, 2*guardBenchTokens))
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
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || n < guardBenchTokens*100 {
			return fmt.Errorf("status %d, %d bytes", resp.StatusCode, n)
		}
		return nil
	}
	if err := send(); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(max(conns/runtime.GOMAXPROCS(0), 1))
	start := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := send(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() int64 {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0
	}
	return r.Utime.Nano() + r.Stime.Nano()
}
