package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/internal/servicetest"
)

// BinDir holds initdb and pg_ctl; PGBIN overrides it.
const BinDir = "/usr/lib/postgresql/15/bin"

// Private is a PostgreSQL server of one test's own, which the test may stop
// and start (an outage), unlike the shared server behind New.
type Private struct {
	t       testing.TB
	bin     string // directory of initdb and pg_ctl
	dir     string // data directory
	port    int
	run     []string // prefix that runs a command as the server's owner
	running bool
}

// NewPrivate initializes a server in a temporary directory, starts it on a
// free loopback port and stops it when the test ends. initdb refuses to run
// as root, so under root the server runs as the user postgres. Without the
// binaries the test fails under CI and is skipped elsewhere.
func NewPrivate(t testing.TB) *Private {
	t.Helper()
	bin := os.Getenv("PGBIN")
	if bin == "" {
		bin = BinDir
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		servicetest.Unavailable(t, "initdb: %v", err)
	}
	base, err := os.MkdirTemp("", "pgtest-private-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	p := &Private{t: t, bin: bin, dir: filepath.Join(base, "data"), port: servicetest.FreePort(t)}
	t.Cleanup(func() {
		if p.running {
			p.ctl("stop", "-m", "immediate")
		}
		os.RemoveAll(base)
	})
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			servicetest.Unavailable(t, "running as root and no user postgres to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(base, uid, gid); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		p.run = []string{"runuser", "-u", "postgres", "--"}
	}
	out, err := p.command(filepath.Join(bin, "initdb"), "-D", p.dir, "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput()
	if err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = on\nshared_buffers = 32MB\nmax_connections = 30\n", p.port, base)
	f, err := os.OpenFile(filepath.Join(p.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	f.WriteString(conf)
	f.Close()
	p.Start()
	return p
}

func (p *Private) command(name string, args ...string) *exec.Cmd {
	argv := append(append([]string{}, p.run...), name)
	argv = append(argv, args...)
	return exec.Command(argv[0], argv[1:]...)
}

func (p *Private) ctl(args ...string) error {
	args = append([]string{"-D", p.dir, "-w", "-t", "60", "-l", filepath.Join(filepath.Dir(p.dir), "log")}, args...)
	var out bytes.Buffer
	cmd := p.command(filepath.Join(p.bin, "pg_ctl"), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pg_ctl %v: %v\n%s", args, err, out.String())
	}
	return nil
}

// URL is the server's URL for the database postgres.
func (p *Private) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Start starts the server; pg_ctl -w returns once it accepts connections.
func (p *Private) Start() {
	p.t.Helper()
	if err := p.ctl("start"); err != nil {
		p.t.Fatalf("pgtest: %v", err)
	}
	p.running = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		p.t.Fatalf("pgtest: private server started but does not answer: %v", err)
	}
	c.Close(ctx)
}

// Stop stops the server the way a crash does (immediate mode: no checkpoint,
// connections cut), and returns once it is down.
func (p *Private) Stop() {
	p.t.Helper()
	if err := p.ctl("stop", "-m", "immediate"); err != nil {
		p.t.Fatalf("pgtest: %v", err)
	}
	p.running = false
}
