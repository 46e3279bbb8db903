package ledger

import (
	"strings"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// entryColumns are the columns of the entries table, in the order of
// entryArgs and scanEntry. Both stores share them.
var entryColumns = []string{
	"request_id", "node", "tenant", "user_id", "key_id", "route", "upstream", "model", "region",
	"decision", "policy", "friction", "status", "http_status",
	"est_input", "est_cached_input", "est_cache_write", "est_output", "est_reasoning", "est_units",
	"act_input", "act_cached_input", "act_cache_write", "act_output", "act_reasoning", "act_units",
	"estimated_cost", "actual_cost", "cost", "created_at", "settled_at",
	"est_extra", "act_extra", "requests", "key_model", "key_route", "plan",
	"key_ip", "key_attrs", "key_desc",
}

// readColumns are the columns scanEntry reads (all but node).
var readColumns = strings.Join(append([]string{entryColumns[0]}, entryColumns[2:]...), ", ")

// entryArgs returns the values of e's columns; times go through tm.
func entryArgs(node string, e *Entry, tm func(time.Time) any) []any {
	return []any{
		e.RequestID, node, e.Tenant, e.User, e.KeyID, e.Route, e.Upstream, e.Model, e.Region,
		e.Decision, e.Policy, e.Friction, string(e.Status), int64(e.HTTPStatus),
		e.Estimated.InputTokens, e.Estimated.CachedInputTokens, e.Estimated.CacheWriteTokens,
		e.Estimated.OutputTokens, e.Estimated.ReasoningTokens, e.Estimated.Units,
		e.Actual.InputTokens, e.Actual.CachedInputTokens, e.Actual.CacheWriteTokens,
		e.Actual.OutputTokens, e.Actual.ReasoningTokens, e.Actual.Units,
		int64(e.EstimatedCost), int64(e.ActualCost), int64(e.Charge()), tm(e.CreatedAt), tm(e.SettledAt),
		extraOf(&e.Estimated), extraOf(&e.Actual), e.Requests, e.KeyModel, e.KeyRoute, e.Plan,
		e.KeyIP, e.KeyAttrs, e.KeyDesc,
	}
}

type scanner interface{ Scan(dest ...any) error }

// scanEntry reads readColumns into e; created and settled receive the times
// for the caller to convert.
func scanEntry(s scanner, e *Entry, created, settled any) error {
	var status, estExtra, actExtra string
	var http, estCost, actCost, cost int64
	err := s.Scan(&e.RequestID, &e.Tenant, &e.User, &e.KeyID, &e.Route, &e.Upstream, &e.Model, &e.Region,
		&e.Decision, &e.Policy, &e.Friction, &status, &http,
		&e.Estimated.InputTokens, &e.Estimated.CachedInputTokens, &e.Estimated.CacheWriteTokens,
		&e.Estimated.OutputTokens, &e.Estimated.ReasoningTokens, &e.Estimated.Units,
		&e.Actual.InputTokens, &e.Actual.CachedInputTokens, &e.Actual.CacheWriteTokens,
		&e.Actual.OutputTokens, &e.Actual.ReasoningTokens, &e.Actual.Units,
		&estCost, &actCost, &cost, created, settled, &estExtra, &actExtra, &e.Requests, &e.KeyModel, &e.KeyRoute, &e.Plan,
		&e.KeyIP, &e.KeyAttrs, &e.KeyDesc)
	if err != nil {
		return err
	}
	if err := setExtra(&e.Estimated, estExtra); err != nil {
		return err
	}
	if err := setExtra(&e.Actual, actExtra); err != nil {
		return err
	}
	e.Status, e.HTTPStatus = Status(status), int(http)
	e.EstimatedCost, e.ActualCost = costmodel.NanoUSD(estCost), costmodel.NanoUSD(actCost)
	return err
}
