package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/simulator"
)

// TestStreamKeepsItsLease streams for about 2.8 s under a concurrency
// limit of 1 whose lease is 1 s, on each store: the stream's renewed lease
// holds the slot for its whole length (a request during it gets a 429),
// and once it has ended a new request is admitted. "degraded" has a Redis
// that is down: the reservation is in the local fallback, renewed there.
func TestStreamKeepsItsLease(t *testing.T) {
	const limits = `
limits:
  - name: acme-streams
    dimensions: [tenant]
    algorithm: concurrency
    unit: requests
    rate: 1
    period: 1s
`
	const tokens, interval = 28, 100 * time.Millisecond
	for _, store := range []string{"memory", "redis", "degraded"} {
		t.Run(store, func(t *testing.T) {
			o := stackOptions{extra: limits, sim: simulator.Config{TokenInterval: interval}}
			switch store {
			case "redis":
				o.redisURL = redistest.New(t).URL
			case "degraded":
				o.redisURL = "redis://127.0.0.1:1" // nothing listens on port 1
			}
			s := newStackWith(t, o)
			client := s.client("cg-test-acme")
			ctx := context.Background()
			other := func() error {
				_, err := client.Chat.Completions.New(ctx, chatParams("Hi.", 1))
				return err
			}

			// The other requests run beside the reader, so that a slow one
			// (the degraded store's failed debit) does not hold it back.
			begin := time.Now()
			stream := client.Chat.Completions.NewStreaming(ctx, chatParams("Tell me a story.", tokens))
			type probe struct {
				at  time.Duration
				err error
			}
			probes := make(chan probe, 3)
			chunks := 0
			for stream.Next() {
				// Past the first lease's end, at about 1.2 s, 1.6 s and 2 s.
				if chunks++; chunks == 12 || chunks == 16 || chunks == 20 {
					go func() {
						at := time.Since(begin)
						probes <- probe{at, other()}
					}()
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(begin); chunks < 20 || d < 2*time.Second {
				t.Fatalf("the stream lasted %s over %d chunks: too short to outlive its lease", d, chunks)
			}
			for range 3 {
				p := <-probes
				var denied *openai.Error
				if !errors.As(p.err, &denied) || denied.StatusCode != http.StatusTooManyRequests {
					t.Errorf("a request %s into the stream: %v, want a 429", p.at.Round(time.Millisecond), p.err)
				}
			}
			if err := s.srv.WaitIdle(ctx); err != nil {
				t.Fatal(err)
			}
			if err := other(); err != nil {
				t.Fatalf("a request after the stream: %v", err)
			}
		})
	}
}
