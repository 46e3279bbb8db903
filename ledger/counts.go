package ledger

// Counts reads what the limiter counted of a caller's requests in units
// other than dollars (requests, input and output tokens) from the entries
// themselves, not from the spend roll-up: a limiter reads it only to
// restore a counter after its store lost its data, a rare read, and an
// index on (tenant, created_at) makes it a range scan of the tenant's
// entries in the range.

import (
	"context"
	"errors"
)

// Counts is what entries counted on a limiter in units other than
// dollars: requests, and the input and output tokens of their charged
// usage (the estimate while reserved, the actual usage once final, as
// Entry.Charge is for the cost). The zero value counts nothing. Sums
// saturate at the largest int64.
type Counts struct {
	Requests     int64 `json:"requests"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// Tokens is the input and output tokens together, saturating, as a
// limiter's tokens unit counts them.
func (c Counts) Tokens() int64 {
	return addSat(c.InputTokens, c.OutputTokens)
}

// add is c+d, each field saturating.
func (c Counts) add(d Counts) Counts {
	return Counts{
		Requests:     addSat(c.Requests, d.Requests),
		InputTokens:  addSat(c.InputTokens, d.InputTokens),
		OutputTokens: addSat(c.OutputTokens, d.OutputTokens),
	}
}

// sub is c-d, each field saturating.
func (c Counts) sub(d Counts) Counts {
	return c.add(Counts{Requests: -d.Requests, InputTokens: -d.InputTokens, OutputTokens: -d.OutputTokens})
}

// countedDecision tells whether an entry of decision d is one a limiter
// admitted and counted: the gate records admitted requests only, with
// the policies' "allow" or "soft" (served with friction); an entry of any
// other decision (a refusal some other writer recorded) counts nothing.
// The empty decision is an entry that names none, counted.
func countedDecision(d string) bool {
	return d == "allow" || d == "soft" || d == ""
}

// Counts is what e counts on a limiter: nothing unless its decision is
// an admission (see countedDecision); else the requests the limiter
// counted it for (Entry.Requests), none if it failed without an HTTP
// status (a reservation cancelled, or a request that never reached its
// upstream: the limiter returns its requests), and the input and output
// tokens of its charged usage, the estimate while reserved, the actual
// usage once final.
func (e *Entry) Counts() Counts {
	if !countedDecision(e.Decision) {
		return Counts{}
	}
	u := e.Actual
	if e.Status == StatusReserved {
		u = e.Estimated
	}
	c := Counts{Requests: e.Requests, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens}
	if e.Status == StatusFailed && e.HTTPStatus == 0 {
		c.Requests = 0
	}
	return c
}

// countsRequest, countsInput and countsOutput are what a store's counts
// read sums of an entry's row: its requests, input and output tokens, as
// Entry.Counts computes them in Go; countsDecisions keeps the rows of the
// counted decisions (see countedDecision).
const (
	countsDecisions = `decision IN ('allow', 'soft', '')`
	countsRequest   = `CASE WHEN status = 'failed' AND http_status = 0 THEN 0 ELSE requests END`
	countsInput     = `CASE WHEN status = 'reserved' THEN est_input ELSE act_input END`
	countsOutput    = `CASE WHEN status = 'reserved' THEN est_output ELSE act_output END`
	countsEntry     = `CASE WHEN status = 'failed' AND http_status = 0 THEN 0 ELSE 1 END`
)

// countedEntry is what an entry of decision, status and HTTP status
// counts among a group's Entries (see countsEntry): 1 or 0.
func countedEntry(decision string, status Status, http int) int64 {
	if !countedDecision(decision) || status == StatusFailed && http == 0 {
		return 0
	}
	return 1
}

// Counts returns what the entries q selects counted on a limiter (see
// Entry.Counts): q's tenant, and its user, key and region when set, over
// its period or [From, To), exactly (no roll-up bucket rounds the range),
// as they are in the store. It is CountsBy grouping by nothing: it reads
// the entries, so its cost grows with the tenant's entries in the range,
// for a rare read, a limiter's counter restored after its store lost its
// data.
//
// When the store fails (and ctx is not done), a ledger with a spool
// answers as Spend does: the last value read for the same query plus this
// node's records spooled since, with a *LocalSpendError whose Counts and
// PendingCounts are that answer and its spooled part (its dollar fields
// are zero), and whose Unknown says the store's part is not known.
//
// Counts fails with ErrInvalid for a tenant, user, key or region that is
// not valid text (see ValidText), and as Spend does for a bad range.
func (l *Ledger) Counts(ctx context.Context, q SpendQuery) (Counts, error) {
	gs, err := l.CountsBy(ctx, q, GroupBy{})
	var c, pending Counts
	if len(gs) > 0 {
		c, pending = gs[0].Counts, gs[0].PendingCounts
	}
	var local *LocalSpendError
	switch {
	case errors.As(err, &local):
		local.Counts, local.PendingCounts = c, pending
	case err != nil:
		return Counts{}, err
	}
	return c, err
}
