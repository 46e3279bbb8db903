// Package rls is costgate's front door for Envoy: the rate limit service
// of Envoy's global rate limiting (envoy.service.ratelimit.v3, the
// ShouldRateLimit call) on a gRPC listener of its own.
//
// Envoy is trusted: a request names its tenant, user and model in its
// descriptors (the config's rls section says which entries do), and the
// tenant's plan applies with its configured limits and budgets, beside
// the descriptors' own limits. All the descriptors of a request are
// debited in one call of the gate, all or nothing: a denied request leaves
// no partial debit behind (envoyproxy/ratelimit debits them one by one and
// keeps the debits of a denied request). The answer carries overall_code,
// a status per descriptor (current_limit, limit_remaining,
// duration_until_reset), and in response_headers_to_add the RateLimit and
// RateLimit-Policy fields of the limit that decided, and Retry-After on
// OVER_LIMIT.
//
// A descriptor's hits (its hits_addend, else the request's, else 1) count
// requests or tokens. Hits of 0 check that the limits have room left and
// debit nothing; hits in tokens above 0 are the usage of a request already
// served, charged whatever the limits say, so that the next check refuses
// once the limits are spent: the two phases of LLM token limiting behind
// Envoy (a check when the request arrives, the actual tokens when its
// stream ends, as apply_on_stream_done sends them).
//
// Outcomes map onto Envoy's answers so that an outage is never reported
// as throttling: a limit or budget spent, a hits_addend no limit can hold,
// a check or debit of a descriptor whose limit is 0 or whose limit
// override cannot be applied (a charge of one is charged all the same),
// a tenant whose requests already fill the limiter's queue, and a
// fail-closed limit whose store is down are OVER_LIMIT; a limiter that cannot decide (overloaded, or its
// counters not yet restored) and a ledger that cannot record a priced
// request are the gRPC error UNAVAILABLE, which Envoy's failure_mode_deny
// turns into an answer.
package rls

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/grpcwire"
)

// Options are a Server's optional settings.
type Options struct {
	// Logger receives the server's logs; nil logs nowhere.
	Logger *slog.Logger
	// Reflection registers the gRPC reflection service (costgate serve
	// sets it from rls.reflection). Default false. It needs grpc-go's
	// server, which then serves instead of grpcwire.
	Reflection bool
	// GRPCGo serves the calls with grpc-go's server instead of grpcwire
	// (costgate serve sets it from rls.transport: grpc-go).
	GRPCGo bool
	// GRPC are more options for grpc-go's server; any serves with it.
	GRPC []grpc.ServerOption
}

// streamWorkers is the number of goroutines that serve calls: Envoy keeps
// a few connections with many concurrent streams each.
const streamWorkers = 64

// Server is the rate limit service on a gate. It reads the gate's active
// configuration on every request, so that a reload applies at once. It is
// safe for concurrent use.
type Server struct {
	g      *gate.Gate
	log    *slog.Logger
	grpc   *grpc.Server     // grpc-go's server, or nil
	wire   *grpcwire.Server // else grpcwire's
	health *health.Server
	tree   atomic.Pointer[tree] // the rls section of the last configuration seen, compiled
	calls  sync.Pool            // *call
}

// New returns a Server that decides on g; Serve starts it.
func New(g *gate.Gate, opts Options) *Server {
	// Stream workers keep their goroutines, and the stacks they have grown,
	// from call to call: a new goroutine per call would grow its stack
	// through the gate again each time. Calls past the workers get one.
	// The codec reads requests and writes responses without protobuf
	// reflection (see codec.go).
	s := &Server{g: g, log: opts.Logger, health: health.NewServer()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.calls.New = func() any { return new(call) }
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	if !opts.GRPCGo && !opts.Reflection && len(opts.GRPC) == 0 {
		s.wire = s.newWire()
		return s
	}
	gopts := append([]grpc.ServerOption{grpc.NumStreamWorkers(streamWorkers), grpc.ForceServerCodecV2(newCodec())}, opts.GRPC...)
	s.grpc = grpc.NewServer(gopts...)
	rlsv3.RegisterRateLimitServiceServer(s.grpc, service{s: s})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	if opts.Reflection {
		reflection.Register(s.grpc)
	}
	return s
}

// Serve answers on ln until GracefulStop or Close; it returns nil after
// them.
func (s *Server) Serve(ln net.Listener) error {
	if s.wire != nil {
		if err := s.wire.Serve(ln); !errors.Is(err, grpcwire.ErrServerStopped) {
			return err
		}
		return nil
	}
	err := s.grpc.Serve(ln)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// GracefulStop reports NOT_SERVING, stops accepting and waits for the
// calls under way.
func (s *Server) GracefulStop() {
	s.health.Shutdown()
	if s.wire != nil {
		s.wire.GracefulStop()
		return
	}
	s.grpc.GracefulStop()
}

// Close stops the server at once, cancelling the calls under way. It
// works before Serve and after a partial start.
func (s *Server) Close() error {
	s.health.Shutdown()
	if s.wire != nil {
		s.wire.Stop()
		return nil
	}
	s.grpc.Stop()
	return nil
}

// service is the RateLimitService on a Server.
type service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s *Server
}

var _ rlsv3.RateLimitServiceServer = service{}

func (sv service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return sv.s.ShouldRateLimit(ctx, req)
}

// ShouldRateLimit decides req. It is the gRPC method, callable without a
// listener.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	t, err := s.current()
	if err != nil {
		s.log.Error("rls: the configuration does not compile", "err", err)
		return nil, status.Error(codes.Internal, "costgate: the rls configuration does not compile")
	}
	dom := t.domains[req.GetDomain()]
	if dom == nil {
		// As envoyproxy/ratelimit: no limit applies to an unknown domain.
		if n := len(req.GetDescriptors()); n == 0 || n > maxDescriptors {
			return nil, status.Error(codes.InvalidArgument, "a request needs 1 to 64 descriptors")
		}
		return unlimited(len(req.GetDescriptors())), nil
	}
	c := s.calls.Get().(*call)
	defer s.calls.Put(c)
	if err := c.convert(dom, req, nil); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if len(c.others) > 0 {
		return s.decideTenants(ctx, t, c, req)
	}
	return s.decide(ctx, t, c)
}

// decideTenants decides c, a request whose descriptors name other
// tenants, users or models than its caller's (c.others). Each tenant's
// plan applies to the descriptors that name it, each user's limits to
// its own, and each model's usage is priced as that model's, whichever
// comes first: a request whose checks or debits name two tenants, two
// users or two models is refused, debiting nothing
// (two plans cannot be decided all or nothing as one caller's; decided
// as the first tenant's, the other's descriptors counted on no plan). The
// usage that descriptors report was served all the same: each tenant's,
// of each user and model, is charged on a call of its own, on the tenant's plan
// and in a ledger entry of its model. Every party is charged before the
// answer, even when costgate cannot decide or record for one of them
// (the answer is then UNAVAILABLE): a charge is counted on its limits
// whatever the ledger says.
func (s *Server) decideTenants(ctx context.Context, t *tree, c *call, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var resp *rlsv3.RateLimitResponse
	var failed error // the first party's that costgate could not decide or record
	if c.othersAsk {
		if c.groups[kindCharge].n > 0 {
			caller := s.g.Trusted(c.tenant, c.user, "", c.plan)
			if d := s.ask(ctx, caller, c, kindCharge); d.Undecided {
				failed = s.cannotDecide(c, c.tenant, d)
			}
		}
		resp = twoTenants(c)
	} else {
		resp, failed = s.decide(ctx, t, c)
	}
	for i := range c.others {
		o := s.calls.Get().(*call)
		if err := o.convert(c.dom, req, &c.others[i]); err != nil || o.groups[kindCharge].n == 0 {
			s.calls.Put(o) // c converted: o does too
			continue
		}
		var out [numKinds]outcome
		out[kindCharge] = outcome{ran: true, d: s.ask(ctx, s.g.Trusted(o.tenant, o.user, "", o.plan), o, kindCharge)}
		if d := out[kindCharge].d; d.Undecided {
			if failed == nil {
				failed = s.cannotDecide(c, o.tenant, d)
			}
			s.calls.Put(o)
			continue
		}
		if failed == nil {
			sub := respond(t, o, &out)
			for i := range o.descs {
				if !o.descs[i].other && o.descs[i].kind == kindCharge {
					resp.Statuses[i] = sub.Statuses[i]
				}
			}
		}
		s.calls.Put(o)
	}
	if failed != nil {
		return nil, failed
	}
	return resp, nil
}

// cannotDecide logs and returns the gRPC error UNAVAILABLE of d, the
// answer to tenant's part of c when costgate cannot decide it or record
// it (gate.Decision.Undecided).
func (s *Server) cannotDecide(c *call, tenant string, d gate.Decision) error {
	s.log.Warn("rls: costgate cannot decide", "domain", c.dom.name, "tenant", tenant, "code", d.Error.Code)
	return status.Error(codes.Unavailable, d.Error.Message)
}

// current returns the tree of the gate's active configuration, compiling
// it the first time it is seen.
func (s *Server) current() (*tree, error) {
	cfg, est := s.g.Config(), s.g.Estimator()
	if t := s.tree.Load(); t != nil && t.cfg == cfg && t.est == est {
		return t, nil
	}
	t, err := compile(cfg, est)
	if err != nil {
		return nil, err
	}
	s.tree.Store(t)
	return t, nil
}

// outcome is what the gate answered one group.
type outcome struct {
	ran bool
	d   gate.Decision
}

// decide asks the gate for each group of c, charges first (they are
// facts), then checks, then debits, and stops at the first refusal.
func (s *Server) decide(ctx context.Context, t *tree, c *call) (*rlsv3.RateLimitResponse, error) {
	for i := range c.descs {
		if l := c.limitOf(&c.descs[i]); l != nil && l.block && l.shadow {
			s.g.Telemetry().ShadowWouldBlock("", l.info.current.Name, c.tenant)
		}
	}
	caller := s.g.Trusted(c.tenant, c.user, "", c.plan)
	if c.block >= 0 {
		// A descriptor whose limit is 0 refuses the request, which debits
		// nothing; the usage it reports was served all the same, and is
		// charged.
		if c.groups[kindCharge].n > 0 {
			if d := s.ask(ctx, caller, c, kindCharge); d.Undecided {
				return nil, s.cannotDecide(c, c.tenant, d)
			}
		}
		return blocked(c), nil
	}
	var out [numKinds]outcome
	for _, k := range [...]kind{kindCharge, kindCheck, kindDebit} {
		g := &c.groups[k]
		if g.n == 0 {
			continue
		}
		o := &out[k]
		o.ran = true
		o.d = s.ask(ctx, caller, c, k)
		if !o.d.Allowed() {
			if o.d.Undecided {
				return nil, s.cannotDecide(c, c.tenant, o.d)
			}
			if k != kindCharge {
				break
			}
		}
	}
	return respond(t, c, &out), nil
}

// ask runs the gate request of c's group of kind k.
func (s *Server) ask(ctx context.Context, caller *gate.Caller, c *call, k kind) gate.Decision {
	g := &c.groups[k]
	// The policies answer a tenant's request as they answer the proxy's,
	// with request.route "rls:DOMAIN": its check and its debit. A charge
	// is usage already served, which no policy can refuse.
	req := gate.Request{
		Caller: caller, Route: c.dom.route, Estimate: costmodel.Estimate{Model: c.model},
		Extra: g.extras, ExtraOnly: !g.named, NoPolicy: !g.named || k == kindCharge, NoRequests: true, States: true,
	}
	switch k {
	case kindCheck:
		req.Check = true
		_, d := s.g.Reserve(ctx, &req)
		return d
	case kindDebit:
		// A debit is carried out whether or not Envoy waits for the
		// answer: past its timeout Envoy lets the request through
		// (failure_mode_deny off, its default), and it counts.
		ctx = detach(ctx)
		req.Requests = g.requests
		req.Estimate.Cost = g.cost
		req.Final = true
		res, d := s.g.Reserve(ctx, &req)
		if res == nil {
			return d
		}
		return s.settle(ctx, res, c, gate.Charge{Cost: g.cost, Model: c.model, HTTPStatus: 200}, d)
	default: // kindCharge
		// Usage already served is counted whether or not Envoy waits for
		// the answer (its filter's timeout is 20 ms by default), and
		// whatever the limits say: the gate admits it (Served) and the
		// settlement charges it, debt and clamps included.
		ctx = detach(ctx)
		req.Served = true
		res, d := s.g.Reserve(ctx, &req)
		if res == nil {
			return d
		}
		priced := c.model != "" && g.named
		var price func(costmodel.Usage) costmodel.NanoUSD
		if priced {
			price = func(u costmodel.Usage) costmodel.NanoUSD { return res.Price(c.model, u) }
		}
		g.bill(price)
		ch := gate.Charge{Usage: g.usage, Model: c.model, HTTPStatus: 200, Extra: g.actual}
		if priced {
			ch.Cost = res.Price(c.model, g.usage)
			g.cost = ch.Cost
		}
		return s.settle(ctx, res, c, ch, d)
	}
}

// settle ends an admitted reservation at once: an RLS decision is final.
// A request that spends money is recorded in the ledger first, and so is
// one that counts requests or tokens on a limit the ledger restores
// after a data loss: the tenant's own limits (gate.Reservation.Restorable)
// and its descriptor limits (gate.Reservation.CountsExtra), whose
// counters the entry records; one that counts on none, a check of 0 hits
// for one, is not. One that costs nothing and counts only on descriptor
// limits, not Served usage, is a tally (gate.Reservation.Tally): its
// counters join the ledger's entry of such calls of its second, since an
// entry of its own cost most of a decision's CPU. What it counts on
// descriptor limits that name no tenant (under the domain's tag) is
// tallied first, whether or not it has a tenant
// (gate.Reservation.TallyShared), so that a loss does not give those a
// whole window again. ctx is without cancellation (see detach).
func (s *Server) settle(ctx context.Context, res *gate.Reservation, c *call, ch gate.Charge, d gate.Decision) gate.Decision {
	var record func(context.Context) (gate.Decision, bool)
	shared := true // what it counts under the domain's tag is still to be tallied
	switch {
	case c.tenant == "":
	case ch.Cost > 0 || res.Restorable(ch):
		record = res.Record
	case !res.CountsExtra():
	case res.Request().Served:
		record = res.Record
	default:
		record, shared = res.Tally, false // its descriptor limits alone, the domain's with them
	}
	if shared {
		if refused, ok := res.TallyShared(ctx); !ok {
			if res.Request().Served {
				res.Settle(ctx, ch) // usage served counts on its limits all the same
			}
			return refused
		}
	}
	if record != nil {
		if refused, ok := record(ctx); !ok {
			if res.Request().Served {
				res.Settle(ctx, ch) // usage served counts on its limits all the same
			}
			return refused
		}
	}
	res.Settle(ctx, ch)
	return d
}

// detach is ctx without its cancellation, as context.WithoutCancel makes
// it, under a value of no meaning: a value looked up on WithoutCancel's
// context itself (the telemetry's span, the tracer's) allocates each time,
// its Value method boxing its receiver, while a lookup through a context
// above it does not.
func detach(ctx context.Context) context.Context {
	return context.WithValue(context.WithoutCancel(ctx), detachedKey{}, nil)
}

// detachedKey is the key of detach's value.
type detachedKey struct{}

// errorBody is the raw_body of an OVER_LIMIT answer: the refusal as the
// proxy's OpenAI-shaped error.
func errorBody(e *gate.Error) []byte {
	b, err := json.Marshal(struct {
		Error *gate.Error `json:"error"`
	}{e})
	if err != nil {
		return nil
	}
	return b
}
