package gate

// Upstream objects and the tenants they were made for.
//
// Every tenant's requests reach an upstream under costgate's one
// credential, so what the upstream keeps (a stored Responses answer, which
// a later request continues by its previous_response_id) is kept under
// one account: a tenant that knows another's id could continue that
// tenant's conversation and read it. The front door records, before the
// client has an answer that names an object, the tenant it was made for
// (OwnObject), and asks before forwarding a request that names one
// (ObjectOwner): an object this gate has no record of is no tenant's.
//
// The records live where the limiter's counters do: in Redis, shared by
// every replica, kept objectTTL (an upstream keeps a stored response 30
// days); in memory, in a bounded table of this process.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// objectTTL is how long a record of an object's tenant is kept: as long
// as OpenAI keeps a stored response.
const objectTTL = 30 * 24 * time.Hour

// maxObjectID bounds the id of an object recorded or asked for.
const maxObjectID = 256

// memObjects is how many records the in-memory table keeps, in two
// generations of half as many: when the newer fills, the older is dropped.
const memObjects = 1 << 18

// ErrObjectID is an object id that is empty or longer than maxObjectID.
var ErrObjectID = errors.New("gate: object id empty or too long")

// objects records which tenant each upstream object was made for. It is
// safe for concurrent use.
type objects struct {
	mu       sync.Mutex
	cur, old map[string]string // id -> tenant
}

// OwnObject records that the upstream object id was made for tenant. With
// Redis, an error is the store's; the record is then not made.
func (g *Gate) OwnObject(ctx context.Context, tenant, id string) error {
	if id == "" || len(id) > maxObjectID {
		return ErrObjectID
	}
	if g.redis != nil {
		err := g.objectCall(ctx, func(ctx context.Context) error {
			return g.redis.Set(ctx, objectKey(id), tenant, objectTTL).Err()
		})
		if err != nil {
			return fmt.Errorf("gate: record object: %w", err)
		}
		return nil
	}
	o := &g.objects
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cur == nil || len(o.cur) >= memObjects/2 {
		o.old, o.cur = o.cur, make(map[string]string)
	}
	o.cur[id] = tenant
	return nil
}

// ObjectOwner returns the tenant the upstream object id was made for;
// found is false when this gate has no record of it. With Redis, an error
// is the store's: the object's tenant is then unknown.
func (g *Gate) ObjectOwner(ctx context.Context, id string) (tenant string, found bool, err error) {
	if id == "" || len(id) > maxObjectID {
		return "", false, nil
	}
	if g.redis != nil {
		err := g.objectCall(ctx, func(ctx context.Context) (err error) {
			tenant, err = g.redis.Get(ctx, objectKey(id)).Result()
			return err
		})
		switch {
		case errors.Is(err, redis.Nil):
			return "", false, nil
		case err != nil:
			return "", false, fmt.Errorf("gate: read object: %w", err)
		}
		return tenant, true, nil
	}
	o := &g.objects
	o.mu.Lock()
	defer o.mu.Unlock()
	if t, ok := o.cur[id]; ok {
		return t, true, nil
	}
	t, ok := o.old[id]
	return t, ok, nil
}

// objectCall makes a record's Redis call, bounded as a limiter call is
// (objTimeout). While the breaker holds the limiter's Redis out it fails
// at once: a request that waits on a record would otherwise wait its
// whole bound on every call of an outage. Records do not count for or
// against the breaker.
func (g *Gate) objectCall(ctx context.Context, f func(context.Context) error) error {
	if g.breaker != nil && !g.breaker.ready() {
		return errBreakerOpen
	}
	ctx, cancel := context.WithTimeout(ctx, g.objTimeout)
	defer cancel()
	return f(ctx)
}

// objectKey is the Redis key of an object's record.
func objectKey(id string) string { return "cg:obj:" + id }
