package redistest

import (
	"strconv"
	"strings"
	"testing"
)

// TestPortTakenByAnotherServer: a server started on a port another test's
// server took between FreePort and its start exits, and the one that
// answers there is the other's; run must refuse it rather than hand the
// test a server it shares.
func TestPortTakenByAnotherServer(t *testing.T) {
	other := New(t)
	_, port, _ := splitAddr(other.Addr)
	cmd, err := run(port, t.TempDir())
	if err == nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("run answered with the server of another process on its port")
	}
	if !strings.Contains(err.Error(), "taken by another redis-server (process "+strconv.Itoa(other.cmd.Process.Pid)+")") {
		t.Errorf("run: %v", err)
	}
}
