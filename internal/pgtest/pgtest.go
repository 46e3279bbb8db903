// Package pgtest gives tests a real, empty PostgreSQL database.
//
// New connects to the server named by DATABASE_URL (by default
// postgres://postgres@127.0.0.1:5432/postgres, the local server with trust
// auth), creates a database of its own for the calling test and drops it
// when the test ends. When no server answers, the test fails under CI (the
// CI environment variable is set) and is skipped elsewhere.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/internal/servicetest"
)

// DefaultURL is used when DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// New creates an empty database for t and returns its URL.
func New(t testing.TB) string {
	t.Helper()
	admin := os.Getenv("DATABASE_URL")
	if admin == "" {
		admin = DefaultURL
	}
	// CREATE DATABASE waits for the others under way: with a loaded
	// machine's parallel packages each making theirs, it took more than
	// 10 s, which failed a test for the machine's sake.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		servicetest.Unavailable(t, "PostgreSQL at %s: %v", redact(admin), err)
	}
	defer conn.Close(context.Background())

	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "costgate_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("pgtest: DATABASE_URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
