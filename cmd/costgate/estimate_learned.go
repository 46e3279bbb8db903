package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/learned"
	"github.com/costgate/costgate/proxy"
)

// learnedQuote adds to out, the estimate `costgate estimate` prints, the
// learned output estimate of tenant for the request q: its quantile,
// sample count and key, read from where serve keeps them (the config's
// Redis, or its data directory); when it has samples enough, the
// reservation it makes.
func learnedQuote(cfg *config.Config, tenant string, q proxy.Quote, out map[string]any, stderr io.Writer) error {
	why := out["why"].([]string)
	reserve := cfg.Costs.OutputReserve
	if reserve.Quantile == 0 {
		out["why"] = append(why, fmt.Sprintf("output_reserve is %s, a percentage: no learned estimate applies", reserve))
		return nil
	}
	if !slices.ContainsFunc(cfg.Tenants, func(t config.TenantConfig) bool { return t.Name == tenant }) {
		return fmt.Errorf("tenant %q: not in the config", tenant)
	}
	est, err := costmodel.NewEstimator(cfg.CostModel())
	if err != nil {
		return err
	}
	route := q.Route
	for path, kind := range config.RouteKinds {
		if string(kind) == route {
			route = path
		}
	}
	key, ok := learned.KeyOf(tenant, route, est.Canonical(q.Estimate.Model), &q.Estimate)
	if !ok {
		out["why"] = append(why, "this request's output is not learned (no output, audio output, or a stream whose hidden reasoning costgate cannot count): its output limit is reserved")
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t, closeTable, err := gate.OpenLearned(ctx, cfg, func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) })
	if err != nil {
		return err
	}
	defer closeTable()
	e := t.Estimate(key, reserve.Quantile)
	minSamples := cfg.Costs.Learned.MinSamples
	if minSamples == 0 {
		minSamples = 100
	}
	l := map[string]any{"quantile": reserve.String(), "key": key.String(), "samples": e.Samples, "min_samples": minSamples, "reserved": e.OK}
	if !e.OK {
		out["learned"] = l
		out["why"] = append(why, fmt.Sprintf("tenant %s's learned %s rests on %d settled requests like this one, fewer than costs.learned.min_samples (%d): the whole output limit is reserved", tenant, reserve, e.Samples, minSamples))
		return nil
	}
	l["output_tokens"] = e.Tokens
	out["learned"] = l
	learnt := est.WithOutput(q.Estimate, e.Tokens)
	raw, err := json.Marshal(learnt)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return err
	}
	out["reserved_output_tokens"] = learnt.Usage.OutputTokens
	out["why"] = append(why, fmt.Sprintf("output_reserve is %s: tenant %s's learned %s of %d settled requests like this one is %d output tokens (within 1%%), capped by the output limit, %d: %d output tokens are reserved instead, unless the tenant's learned reservations in flight reach costs.learned.max_exposure",
		reserve, tenant, reserve, e.Samples, e.Tokens, q.Estimate.OutputCap, learnt.Usage.OutputTokens))
	return nil
}
