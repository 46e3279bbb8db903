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
// days); in memory, in a bounded table of this process, where a tenant
// that fills it gives up its own oldest records, never another's.

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

// memObjects is how many records the in-memory table keeps: past it the
// oldest record of the tenant that holds the most is dropped.
const memObjects = 1 << 18

// ErrObjectID is an object id that is empty or longer than maxObjectID.
var ErrObjectID = errors.New("gate: object id empty or too long")

// objects records which tenant each upstream object was made for. It is
// safe for concurrent use.
type objects struct {
	mu    sync.Mutex
	owner map[string]string // id -> tenant; nil until the first record
	ids   *queues[string]   // each tenant's ids, oldest first
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
	if o.owner == nil {
		o.owner, o.ids = map[string]string{}, newQueues[string](memObjects)
		o.ids.dropped = func(tenant, id string) {
			if o.owner[id] == tenant { // not recorded since for another
				delete(o.owner, id)
			}
		}
	}
	if o.owner[id] == tenant {
		return nil
	}
	o.owner[id] = tenant
	o.ids.add(tenant, id)
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
	t, ok := o.owner[id]
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
