package weighted

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/redis/go-redis/v9"
)

// ErrInvalidCost is the sentinel of a cost that is not a cost: a negative
// item cost or actual cost. It is found before anything is sent to the
// store.
var ErrInvalidCost = errors.New("weighted: invalid cost")

// errBadReply marks a reply of a script that does not have the shape the
// script gives: the store is not the one this package wrote.
var errBadReply = errors.New("weighted: malformed reply")

// IsStoreFailure reports whether err, returned by a Store's method, says
// that the store itself failed, so that a circuit breaker should count it.
// It is an allow-list: true only for
//   - transport errors: a connection refused, reset or closed, a network
//     timeout, an exhausted or closed client pool;
//   - errors that Redis answered (a script that failed on the server, a
//     key of the wrong type, a server out of memory or loading);
//   - a reply of the wrong shape.
//
// It is false for nil and for every error about the request or its
// caller: a *CostError, ErrDuplicateItem, ErrInvalidCost, an invalid
// limit, id or settle argument, and the caller's context ending
// (context.Canceled or DeadlineExceeded). Errors this package does not
// know are false.
func IsStoreFailure(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The caller's context. (context.DeadlineExceeded is also a
		// net.Error: this case comes first.)
		return false
	case errors.Is(err, ErrInvalidCost),
		errors.Is(err, ErrCostExceedsCapacity), errors.Is(err, ErrDuplicateItem):
		return false
	case errors.Is(err, errBadReply), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted):
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}
