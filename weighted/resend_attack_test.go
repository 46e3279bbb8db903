package weighted

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// replyCutter dials real connections and, while armed, lets the next
// script call through to Redis, waits for its reply, drops it and breaks
// the connection: the call ran, and the client reads EOF, as when Redis
// or a proxy before it dies between the two.
type replyCutter struct {
	armed atomic.Bool
	cuts  atomic.Int64
}

func (rc *replyCutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c, rc: rc}, nil
}

type cutConn struct {
	net.Conn
	rc  *replyCutter
	cut bool // a script call was written: drop its reply
}

func (c *cutConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("\r\nevalsha\r\n")) || bytes.Contains(p, []byte("\r\neval\r\n")) {
		if c.rc.armed.CompareAndSwap(true, false) {
			c.cut = true
		}
	}
	return c.Conn.Write(p)
}

func (c *cutConn) Read(p []byte) (int, error) {
	if !c.cut {
		return c.Conn.Read(p)
	}
	// Wait until the script has run (its reply arrives), then lose it.
	c.cut = false
	_ = c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Conn.Read(make([]byte, 4096))
	c.rc.cuts.Add(1)
	c.Conn.Close()
	return 0, io.EOF
}

// TestResendAtkLostReplyDebitsOnce: a debit whose reply is lost after the
// script ran must not be sent again by the Redis client. go-redis resends a
// command whose connection broke (EOF), up to MaxRetries on one node and up
// to MaxRedirects on a Cluster, whatever MaxRetries says there; a resent
// debit counted twice on the tenant's meters. The call now fails (a store
// failure) and the limit holds one debit; the next call gets a fresh
// connection and works.
func TestResendAtkLostReplyDebitsOnce(t *testing.T) {
	ctx := context.Background()
	clients := map[string]func(t *testing.T, rc *replyCutter) Scripter{
		"one node, default MaxRetries": func(t *testing.T, rc *replyCutter) Scripter {
			opt, err := redis.ParseURL(redistest.New(t).URL)
			if err != nil {
				t.Fatal(err)
			}
			opt.Dialer = rc.dial
			c := redis.NewClient(opt)
			t.Cleanup(func() { c.Close() })
			return c
		},
		"cluster, MaxRetries -1": func(t *testing.T, rc *replyCutter) Scripter {
			cl := redistest.NewCluster(t)
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, MaxRedirects: 16, MaxRetries: -1, Dialer: rc.dial})
			t.Cleanup(func() { c.Close() })
			return c
		},
		"cluster, default MaxRetries": func(t *testing.T, rc *replyCutter) Scripter {
			cl := redistest.NewCluster(t)
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, MaxRedirects: 16, Dialer: rc.dial})
			t.Cleanup(func() { c.Close() })
			return c
		},
	}
	for name, client := range clients {
		t.Run(name, func(t *testing.T) {
			rc := &replyCutter{}
			r := newRedisStore(client(t, rc), nil)
			items := []Item{
				{Limit: Limit{Name: "fw", Algorithm: FixedWindow, Rate: 1000, Period: time.Hour}, Key: "{acme}", Cost: 100},
				{Limit: Limit{Name: "tb", Rate: 1000, Period: 24 * time.Hour}, Key: "{acme}", Cost: 100},
			}
			// A first debit loads the script.
			if res, err := r.Debit(ctx, "first", items); err != nil || !res.Allowed {
				t.Fatalf("first debit: %+v %v", res, err)
			}
			rc.armed.Store(true)
			res, err := r.Debit(ctx, "lost", items)
			if rc.cuts.Load() != 1 {
				t.Fatalf("the reply was not cut (%d cuts): the test did not run its fault", rc.cuts.Load())
			}
			if err == nil {
				t.Fatalf("a debit whose reply was lost answered %+v: the client resent it", res)
			}
			if !IsStoreFailure(err) {
				t.Fatalf("a lost reply: %v, want a store failure", err)
			}
			// The script ran once: 200 used, not 300. (The token bucket
			// refills 1000 a day: under a second, nothing.)
			peek, err := r.Peek(ctx, items)
			if err != nil {
				t.Fatalf("peek after the cut: %v", err)
			}
			if got := peek.Items[0].Remaining; got != 800 {
				t.Fatalf("fixed window remaining %d after one debit and one lost reply, want 800 (the debit ran twice: %v)", got, got == 700)
			}
			if got := peek.Items[1].Remaining; got != 800 {
				t.Fatalf("token bucket remaining %d, want 800", got)
			}
		})
	}
}
