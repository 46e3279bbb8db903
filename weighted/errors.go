package weighted

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

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

// ErrUnreadable is returned, with the store's reply, when the store ran a
// request and could not read one of its keys: a key of the wrong type, a
// value too short to read, a sliding log whose marks do not add up to
// their recorded sum. The store answered, and answered the other
// requests of its script call: it is the request's failure, not the
// store's, and a circuit breaker must not count it, or one tenant's
// spoiled key would turn every tenant over to its fallback. The request
// has no decision: nothing of it was applied.
var ErrUnreadable = errors.New("weighted: a key of the request cannot be read")

// unreadable returns err, the error of a script call that ran one request
// alone or the error reply of one request of a batch, marked as the
// request's own failure (ErrUnreadable) when Redis ran the script and the
// request could not read its keys: a key of the wrong type (WRONGTYPE), or
// a Lua error of the script reading a value (a runtime error,
// "user_script:", or the script's own "weighted:" error). Every other
// error (a server out of memory, loading, read-only, busy, a lost
// connection) is returned as it is: the store's.
func unreadable(err error) error {
	var re redis.Error
	if !errors.As(err, &re) {
		return err
	}
	msg := strings.TrimPrefix(re.Error(), "ERR ")
	msg = strings.TrimPrefix(strings.TrimPrefix(msg, "weighted: request failed: "), "ERR ")
	if strings.HasPrefix(msg, "WRONGTYPE ") || strings.HasPrefix(msg, "user_script:") || strings.HasPrefix(msg, "weighted: ") {
		return fmt.Errorf("%w (%w)", err, ErrUnreadable)
	}
	return err
}

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
//   - errors that Redis answered of itself (a server out of memory,
//     loading, read-only, busy);
//   - a reply of the wrong shape;
//   - a request sent whose reply did not come within CallTimeout
//     (ErrUnknownOutcome from the store's own bound).
//
// It is false for nil and for every error about the request or its
// caller: a *CostError, ErrDuplicateItem, ErrInvalidCost, ErrUnreadable
// (a request whose keys the store could not read), an invalid
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
	case errors.Is(err, ErrStale), errors.Is(err, ErrOverloaded), errors.Is(err, ErrInvalidCost), errors.Is(err, ErrUnreadable),
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
