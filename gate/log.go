package gate

import (
	"context"
	"fmt"
	"log/slog"
)

// ledgerLogf is ledger.Config.Logf for the server: the ledger's own reports
// (its store failing and coming back, the flusher stopping, reservations
// recovered after a crash) become records of the process logger, at warning
// level when they carry an error.
func ledgerLogf(log *slog.Logger) func(format string, args ...any) {
	return func(format string, args ...any) {
		level := slog.LevelInfo
		for _, a := range args {
			if _, ok := a.(error); ok {
				level = slog.LevelWarn
			}
		}
		log.Log(context.Background(), level, fmt.Sprintf(format, args...), "component", "ledger")
	}
}

// redisLog sends go-redis's own log lines to the server's logger at debug
// level.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}
