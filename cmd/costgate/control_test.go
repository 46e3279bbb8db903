package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/proxy"
)

// TestControlCommands drives the control plane's subcommands against a
// running costgate's admin API.
func TestControlCommands(t *testing.T) {
	cfg, err := config.Parse(fmt.Appendf(nil, `
admin_token: cli-admin
data_dir: %q
upstreams:
  - name: openai
    kind: openai
    base_url: http://127.0.0.1:1
    simulate: always
`, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := serveForCLI(t, cfg)

	cli := func(args ...string) map[string]any {
		t.Helper()
		out, _, err := runCmd(t, "", args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("%v printed %q: %v", args, out, err)
		}
		return m
	}
	cli("tenants", "create", "acme2", "--plan", "pro", "--budget", "100/month")
	cli("teams", "create", "--tenant", "acme2", "research", "--budget", "$10/day")
	key := cli("keys", "create", "--tenant", "acme2", "--team", "research", "--budget", "1.00/day", "--model", "gpt-4o-mini")
	id, secret := key["id"].(string), key["key"].(string)
	if !strings.HasPrefix(secret, "cgk_") {
		t.Fatalf("keys create: %v", key)
	}
	if srv.Gate().Identify(secret) == nil {
		t.Fatal("the key created through the CLI is not identified")
	}
	list := cli("keys", "list", "--tenant", "acme2", "--team", "research")
	if ks, _ := list["keys"].([]any); len(ks) != 1 {
		t.Fatalf("keys list: %v", list)
	}
	lv := cli("budgets", "show", id)
	if ls, _ := lv["levels"].([]any); len(ls) != 3 {
		t.Fatalf("budgets show: %v", lv)
	}
	cli("budgets", "raise", "team", teamID(t, cli), "day", "--amount", "20", "--for", "1h")
	rot := cli("keys", "rotate", id, "--grace", "0s")
	if rot["key"] == secret || srv.Gate().Identify(secret) != nil || srv.Gate().Identify(rot["key"].(string)) == nil {
		t.Fatal("keys rotate with no grace: the old secret still works, or the new one does not")
	}
	cli("keys", "revoke", id)
	if srv.Gate().Identify(rot["key"].(string)) != nil {
		t.Fatal("a revoked key is identified")
	}
	audit := cli("audit", "--entity", id)
	if a, _ := audit["audit"].([]any); len(a) != 3 || !strings.Contains(fmt.Sprint(a), "admin:carol") {
		t.Fatalf("audit: %v", audit)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "create", "--tenant", "acme2", "--budget", "1.00"}, "AMOUNT/PERIOD"},
		{[]string{"keys", "create", "--tenant", "acme2", "--budget", "-1/day"}, "must be positive"},
		{[]string{"keys", "create", "--tenant", "nope"}, "does not exist"},
		{[]string{"keys", "get"}, "takes one argument"},
		{[]string{"keys", "frob"}, "unknown command keys frob"},
		{[]string{"budgets", "reset", "planet", "x", "day"}, "want tenant, team, user or key"},
		{[]string{"keys", "list", "--token", "wrong"}, "401"},
	} {
		if _, _, err := runCmd(t, "", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

func teamID(t *testing.T, cli func(...string) map[string]any) string {
	t.Helper()
	teams := cli("teams", "list", "--tenant", "acme2")
	ts, _ := teams["teams"].([]any)
	if len(ts) != 1 {
		t.Fatalf("teams list: %v", teams)
	}
	return ts[0].(map[string]any)["id"].(string)
}

// serveForCLI serves cfg on the memory store and the embedded ledger, on
// loopback, points the CLI's admin commands at it (admin token
// cli-admin, actor carol) and returns the server and its data plane.
func serveForCLI(t *testing.T, cfg *config.Config) (*proxy.Server, *httptest.Server) {
	t.Helper()
	cfg.Store.Redis, cfg.Ledger.DSN = "", ""
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	admin := httptest.NewServer(srv.AdminHandler())
	t.Cleanup(admin.Close)
	data := httptest.NewServer(srv.Handler())
	t.Cleanup(data.Close)
	t.Setenv("COSTGATE_ADMIN_URL", admin.URL)
	t.Setenv("COSTGATE_ADMIN_TOKEN", "cli-admin")
	t.Setenv("USER", "carol")
	return srv, data
}
