package main

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/logtest"
)

// TestDemoServesUntilStopped: when its traffic ends, the demo's proxy and
// dashboard keep serving until it is stopped (Ctrl-C); its table says what
// its columns count, and shows settled spend and reservations apart (none
// left in flight at the end).
func TestDemoServesUntilStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr logtest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--duration", "2500ms", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, strings.NewReader(""), &stdout, &stderr)
	}()
	waitFor(t, "the demo's traffic ends", 30*time.Second, func() bool {
		select {
		case err := <-done:
			t.Fatalf("the demo returned %v by itself; output:\n%s\n%s", err, stdout.String(), stderr.String())
		default:
		}
		return strings.Contains(stdout.String(), "keep serving until you press Ctrl-C")
	})
	out := stdout.String()
	m := regexp.MustCompile(`dashboard: (http://\S+)/admin/#token=(\S+) \(serves until you press Ctrl-C\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no dashboard URL that says how long it serves:\n%s", out)
	}
	for _, want := range []string{"friction: served with friction applied (not counted in admitted)", "settled today", "reserved"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output does not say %q:\n%s", want, out)
		}
	}
	// The last table: every tenant has settled spend, and nothing is left
	// reserved once the traffic is over.
	tables := strings.Split(out, "tenant ")
	last := tables[len(tables)-1]
	for _, tenant := range []string{"acme", "globex", "initech"} {
		row := regexp.MustCompile(`(?m)^\s*` + tenant + `\s.*\s(\$\S+)\s+(\$\S+)\s*$`).FindStringSubmatch(last)
		if row == nil {
			t.Fatalf("no row for %s in the last table:\n%s", tenant, last)
		}
		if row[1] == "$0.000000000" || row[2] != "$0.000000000" {
			t.Errorf("%s: settled %s, reserved %s; want some settled and nothing reserved", tenant, row[1], row[2])
		}
	}

	// After the traffic, the dashboard still answers.
	for _, path := range []string{"/admin/", "/admin/data.json"} {
		req, _ := http.NewRequest("GET", m[1]+path, nil)
		req.Header.Set("Authorization", "Bearer "+m[2])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s after the traffic: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s after the traffic: %s", path, resp.Status)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the demo stopped with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the demo did not stop within 15 s of Ctrl-C")
	}
	if !strings.Contains(stdout.String(), "removed now") {
		t.Errorf("the demo did not say goodbye:\n%s", stdout.String())
	}
}

// TestDemoPublishedSecretsStayOnLoopback: the demo's keys and admin token
// are published, so it listens on loopback addresses only, whatever its
// flags ask, unless its admin token is the operator's own.
func TestDemoPublishedSecretsStayOnLoopback(t *testing.T) {
	for _, args := range [][]string{
		{"--admin-listen", "0.0.0.0:0", "--listen", "127.0.0.1:0"},
		{"--listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0"},
	} {
		var stdout, stderr strings.Builder
		err := run(context.Background(), append([]string{"demo", "--exit", "--duration", "1ms"}, args...), strings.NewReader(""), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("demo %v: %v; want a refusal naming loopback addresses", args, err)
		}
	}
	t.Setenv("COSTGATE_ADMIN_TOKEN", "an-operators-own-token")
	var stdout, stderr strings.Builder
	if err := run(context.Background(), []string{"demo", "--exit", "--duration", "1ms", "--admin-listen", "0.0.0.0:0", "--listen", "127.0.0.1:0"}, strings.NewReader(""), &stdout, &stderr); err != nil {
		t.Errorf("demo with the operator's own admin token on 0.0.0.0: %v", err)
	}
}
