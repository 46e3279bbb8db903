package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/costgate/costgate/internal/pgtest"
)

func TestPrivateStopsAndStarts(t *testing.T) {
	p := pgtest.NewPrivate(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	query := func() error {
		c, err := pgx.Connect(ctx, p.URL())
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		var one int
		return c.QueryRow(ctx, "SELECT 1").Scan(&one)
	}
	if err := query(); err != nil {
		t.Fatalf("running server: %v", err)
	}
	p.Stop()
	if err := query(); err == nil {
		t.Fatal("stopped server answered")
	}
	p.Start()
	if err := query(); err != nil {
		t.Fatalf("restarted server: %v", err)
	}
}
