package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
)

// guberCaller sends gubernator V1 GetRateLimits calls, one per decision,
// each with one RateLimitReq per descriptor of the pattern: its Name the
// descriptor's keys joined by ".", its UniqueKey the values joined by "|".
// Requests are built once per key index and reused. It is safe for
// concurrent use.
type guberCaller struct {
	clients []gubernator.V1Client
	reqs    []*gubernator.GetRateLimitsReq // by key index
}

var _ caller = (*guberCaller)(nil)

// newGuberCaller builds the requests: token buckets of limit hits per
// duration, so that with a limit far above the load nothing is refused.
func newGuberCaller(conns []*grpc.ClientConn, p pattern, keys int, hits, limit int64, duration time.Duration) *guberCaller {
	c := &guberCaller{reqs: make([]*gubernator.GetRateLimitsReq, keys)}
	for _, conn := range conns {
		c.clients = append(c.clients, gubernator.NewV1Client(conn))
	}
	for i := range keys {
		req := &gubernator.GetRateLimitsReq{}
		for d := range p {
			var names, values []string
			for _, e := range p.expand(d, i) {
				names = append(names, e.key)
				values = append(values, e.value)
			}
			req.Requests = append(req.Requests, &gubernator.RateLimitReq{
				Name:      strings.Join(names, "."),
				UniqueKey: strings.Join(values, "|"),
				Hits:      hits,
				Limit:     limit,
				Duration:  duration.Milliseconds(),
				Algorithm: gubernator.Algorithm_TOKEN_BUCKET,
			})
		}
		c.reqs[i] = req
	}
	return c
}

func (c *guberCaller) call(ctx context.Context, worker, key int) (bool, error) {
	resp, err := c.clients[worker%len(c.clients)].GetRateLimits(ctx, c.reqs[key])
	if err != nil {
		return false, err
	}
	over := false
	for _, r := range resp.GetResponses() {
		if r.GetError() != "" {
			return false, errors.New("gubernator: " + r.GetError())
		}
		over = over || r.GetStatus() == gubernator.Status_OVER_LIMIT
	}
	return over, nil
}

// startGubernator starts a single-node gubernator daemon whose gRPC
// listener is on addr (a port of 0 picks a free one) and its HTTP gateway on
// a free loopback port. It has no peer discovery: the node is set as the
// owner of every key, so every limit is decided locally, as in a cluster of
// one. The daemon logs errors to stderr.
func startGubernator(ctx context.Context, addr string) (*gubernator.Daemon, string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("gubernator: address %q: %w", addr, err)
	}
	if port == "0" {
		// The daemon resolves its listen address for its own HTTP gateway,
		// so it needs the real port, not 0.
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, "", fmt.Errorf("gubernator: free port: %w", err)
		}
		addr = l.Addr().String()
		l.Close()
		if host == "" {
			host = "127.0.0.1"
		}
	}
	logger := logrus.New()
	logger.SetOutput(os.Stderr)
	logger.SetLevel(logrus.ErrorLevel)
	d, err := gubernator.SpawnDaemon(ctx, gubernator.DaemonConfig{
		GRPCListenAddress: addr,
		HTTPListenAddress: net.JoinHostPort(host, "0"),
		AdvertiseAddress:  addr,
		PeerDiscoveryType: "none",
		InstanceID:        "rlsbench",
		Logger:            logrus.NewEntry(logger),
	})
	if err != nil {
		if d != nil {
			d.Close()
		}
		return nil, "", fmt.Errorf("gubernator: spawn daemon: %w", err)
	}
	grpcAddr := d.GRPCListeners[0].Addr().String()
	d.SetPeers([]gubernator.PeerInfo{{
		GRPCAddress: grpcAddr,
		HTTPAddress: d.HTTPListener.Addr().String(),
		IsOwner:     true,
	}})
	return d, grpcAddr, nil
}

// serveGubernator is the child process's role (-serve-gubernator): start
// the daemon, print "gubernator: listening on ADDR" on stdout, and serve
// until stdin reaches its end (the parent closed it or died) or a SIGINT or
// SIGTERM arrives.
func serveGubernator(addr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	d, grpcAddr, err := startGubernator(startCtx, addr)
	cancel()
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Printf("gubernator: listening on %s\n", grpcAddr)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	<-ctx.Done()
	return nil
}

// A child is the harness run again as a server (gubernator's, or the null
// RLS server), so that its CPU time is read apart from the load
// generator's, as an external server's.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
}

// spawnChild starts the harness again with flag (-serve-gubernator,
// -serve-null) on a free loopback port and waits up to 30 s for the line
// "NAME: listening on ADDR".
func spawnChild(name, flag string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%s child: %w", name, err)
	}
	cmd := exec.Command(exe, flag, "127.0.0.1:0")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("%s child: %w", name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%s child: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s child: %w", name, err)
	}
	c := &child{cmd: cmd, stdin: stdin}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), name+": listening on "); ok {
				lines <- a
				break
			}
		}
		close(lines)
		io.Copy(io.Discard, stdout)
	}()
	select {
	case a, ok := <-lines:
		if !ok {
			c.close()
			return nil, fmt.Errorf("%s child: exited before listening", name)
		}
		c.addr = a
		return c, nil
	case <-time.After(30 * time.Second):
		c.close()
		return nil, fmt.Errorf("%s child: not listening after 30 s", name)
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// close ends the child: its stdin is closed, and after 5 s it is killed.
func (c *child) close() {
	c.stdin.Close()
	done := make(chan struct{})
	go func() {
		c.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}
