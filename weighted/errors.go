package weighted

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/redis/go-redis/v9"
)

// ErrInvalidCost is the sentinel of a cost that is not a cost: a negative
// item cost, actual cost or counted amount, or one that a limit's
// algorithm does not take (see Restorer). It is found before anything is
// sent to the store.
var ErrInvalidCost = errors.New("weighted: invalid cost")

// ErrOverloaded is returned when a request waited RedisConfig.QueueTimeout
// (or until its context ended) for a script call of its queue and was not
// sent: nothing was applied. It is load shedding, not a failure of the
// store: answer it as such (a 503 or 429 with Retry-After), and do not
// count it against a circuit breaker.
var ErrOverloaded = errors.New("weighted: overloaded: the request was not sent")

// ErrCrowded is returned, with ErrOverloaded, when a debit or peek was not
// sent because each of its items' hash tags (a tenant's) already had as
// many requests waiting in its queue as it may (16 script calls' worth):
// nothing was applied. It is the tenant's own excess, not the store's:
// answer it as a refusal of that request (429), which a front door that
// lets an unavailable limiter's requests through (Envoy's rate limit
// filter by default) does not let through.
var ErrCrowded = errors.New("weighted: crowded: the request's hash tags have too many requests waiting")

// ErrUnknownOutcome is returned when a request was sent to Redis and no
// reply came within RedisConfig.CallTimeout (or before the caller's
// context ended): the request may have run. A Debit of that outcome must
// be treated as applied; the store keeps waiting for the reply in the
// background and, if the debit was admitted, cancels it (see
// RedisConfig.ReplyTimeout and Redis.Stats).
var ErrUnknownOutcome = errors.New("weighted: unknown outcome: no reply from the store")

// errCallTimeout marks an ErrUnknownOutcome that the store's CallTimeout
// caused, as opposed to the caller's context.
var errCallTimeout = errors.New("weighted: call timeout")

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
//   - a reply of the wrong shape;
//   - a request sent whose reply did not come within CallTimeout
//     (ErrUnknownOutcome from the store's own bound).
//
// It is false for nil and for every error about the request or its
// caller: a *CostError, ErrDuplicateItem, ErrInvalidCost, an invalid
// limit, id, settle or restore argument, ErrStale, ErrOverloaded, and the
// caller's context ending (context.Canceled or DeadlineExceeded, also
// when wrapped with ErrUnknownOutcome or ErrOverloaded). Errors this
// package does not know are false.
func IsStoreFailure(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, errCallTimeout):
		return true
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The caller's context. (context.DeadlineExceeded is also a
		// net.Error: this case comes first.)
		return false
	case errors.Is(err, ErrStale), errors.Is(err, ErrOverloaded), errors.Is(err, ErrInvalidCost),
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
