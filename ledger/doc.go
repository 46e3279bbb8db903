// Package ledger records every admitted request exactly once, for billing.
//
// # Life of an entry
//
// The proxy calls Reserve with the estimate before it forwards a request, and
// Settle with what the upstream reported once the response is over (status
// settled, or failed for an upstream error, charged what the upstream
// reported). Each call is one append to a local write-ahead spool, about a
// microsecond; a background flusher, the only writer of the store, moves the
// spool into the store in batches, in spool order, starting one at most every
// Config.BatchDelay (50ms) under load: most requests then reach the store as
// one row written once, already settled. The store is PostgreSQL
// (Config.DSN) or an embedded SQLite file under Config.Dir (pure Go, no
// cgo); both run the same merge code and pass the same test suite.
//
// # Tallies
//
// A call that costs nothing and counts only on a front door's descriptor
// limits (a rate limit service's) is not an entry of its own: Tally
// appends one spool record, as durable as a reservation, and sums its
// counters (Entry.KeyDesc) into an aggregate in memory per shape (the
// entry's columns but its id, costs and usage) and UTC ten seconds.
// Just after each ten seconds, and at the start of Flush, the aggregates
// become settled entries of no request and no cost, created at their
// latest call, with ids "tly_<node>_..." (a prefix no request's id may
// take), followed by a tick record, all in one write. CountsBy grouping
// by Desc adds the aggregates not yet in the store as pending entries
// (until the flusher has committed their tick's entries). Open
// writes the tallies a dead process left after its last tick record; the
// spool keeps their segments until then. A tick's write the death of the
// process cut short is cut off at Open, so that its tallies are written
// once.
//
// # Exactly once
//
// The request id is the idempotency key. Applying a batch is idempotent, so
// a batch retried after an error, or replayed from the spool after a crash,
// changes nothing twice: a reservation creates its entry only if none
// exists; a settlement finalizes an entry that is reserved or recovered,
// creates it if none exists, and does nothing to one already settled or
// failed (the first settlement wins).
//
// # Durability
//
// Reserve returns once the record is in the operating system (one
// write(2)), so it survives the death of the process at once; the spool is
// fsynced every Config.SyncInterval (10 ms), so a record survives a crash of
// the machine after at most that long. With Config.SyncEach, Reserve and
// Settle wait for a group fsync instead (an fsync of latency, shared by
// concurrent callers). SettleDurable always waits for it: the proxy calls
// it once the upstream has reported its usage and before the client gets
// the end of the response, so that a request the client saw complete is
// never recovered at its estimate, even after a crash of the machine. A torn record at the end of the spool, left by a
// machine crash (nothing whole follows it, or only after blocks the
// machine never wrote, zeros), is cut off at Open; damage anywhere else,
// a bad record followed by whole ones included, stops Open rather than
// losing records silently. Files: Dir/spool/*.spool (segments, deleted
// once wholly in the store and their tallies in entries), Dir/spool/applied (how far the store has it; a
// hint, as replay is idempotent), Dir/node (this data directory's id),
// Dir/lock (one process per Dir), Dir/ledger.db (the embedded store).
//
// # Crashes
//
// A process that dies between Reserve and Settle leaves a reservation that
// no settlement will follow. Open appends a recovery marker after the dead
// run's records; when the flusher applies it, every reservation of this
// node still open is finalized at its estimate (Actual = Estimated, status
// recovered). Only the running process's marker recovers: an earlier
// run's, met again when the spool is replayed from before it (the applied
// hint lost), changes nothing, so that no reservation is recovered before
// the records of its own run that follow. A settlement found later in the
// spool still wins over the recovery, so an entry is charged at its
// estimate only when no settlement was ever recorded. Several nodes may
// share one PostgreSQL: entries carry the node of the Dir that wrote
// them, and recovery touches only its own.
// To find them without an index on status (which would cost an index write
// per settlement), each node keeps an open-since mark in the store: the
// earliest creation time of its reservations that may be open.
//
// A node whose Dir is lost for good never opens again, so its open
// reservations stay reserved, charged at their estimate. Nodes lists every
// node with the reservations it holds open and the oldest one's time, and
// RecoverNode finalizes a dead node's reservations created before a time
// the operator gives, at their estimate, in a transaction of its own; a
// tool opens the ledger for it with Config.Admin. A settlement recorded
// later, by a node that was alive after all, still wins, and an extension
// it records (Extend) raises the estimate the entry is charged.
//
// # Outages
//
// While the store is unreachable, records wait in the spool and the flusher
// retries with backoff (Config.RetryMin to RetryMax); when the store
// returns they are applied in order. The spool is bounded by
// Config.SpoolLimit: past it Reserve fails with ErrSpoolFull (new
// admissions stop; the caller decides whether to refuse the request),
// while Settle is always accepted so that admitted requests are finalized.
// Stats reports the backlog and the store's last error, for readiness
// checks and metrics.
//
// # Spend
//
// Spend is the period-to-date charge of a tenant, or of one of its users or
// keys (reservations at their estimate, final entries at their actual
// cost), for a day or a month in Config.TimeZone; Summary gives every
// tenant's. Both read a roll-up kept in the same transaction as the entries,
// at 15-minute and UTC-day grains, so a month costs at most 31 + 2×96 rows
// whatever its number of entries, and any time zone with offsets in
// multiples of 15 minutes is exact. A limiter that keeps a spend counter for
// per-request budget checks reconciles it from Spend or Summary. Both see
// what is in the store: call Flush first to include what is still in the
// spool. While the store cannot be reached, Spend answers from what this
// node knows (its last read of the same query plus its own records spooled
// since) with a *LocalSpendError that says so.
//
// Counts is what a caller's entries counted on a limiter in other units
// (requests, input and output tokens; see Entry.Counts) over a range. It
// reads the entries rather than the roll-up, a range scan of the tenant's,
// for a rare read: a limiter's counter restored after its store lost its
// data. While the store cannot be reached it answers as Spend does.
// CountsBy is Counts and the charge of a tenant's entries grouped by any
// of user, key, route, upstream, model, region, plan, key ip and key
// attributes, in one such read: a limiter restores with it the counters
// of limits keyed by model, route, upstream, region, client address or
// attribute, each entry under the model and route the limiter keyed it by
// (Entry.KeyModel, Entry.KeyRoute) and the address and attributes as its
// keys wrote them (Entry.KeyIP, Entry.KeyAttrs). TotalCountsBy is
// the same read of every tenant's entries together (a range scan by
// creation time), for the limits of a whole deployment, those of some
// plans from the entries of those plans (Entry.Plan, the caller's at the
// decision; an entry without one counts for every plan).
//
// # Queries and export
//
// Entries pages through a tenant's entries by creation time with an opaque
// cursor; a Query's To is exclusive, and ParseRange reads the range a
// person gives (dates as whole UTC days, both ends included; RFC 3339 times
// exact). Export writes them as CSV, as a JSON array, or as CloudEvents 1.0
// usage events (a JSON batch as OpenMeter ingests; the event id is the
// request id, so billing systems deduplicate re-exports). A tool that runs
// beside a serving process opens the ledger with Config.ReadOnly.
//
// Money is costmodel.NanoUSD and token counts are int64; no float is ever
// stored. One entry costs at most MaxCost (2^53 nano-dollars, about $9
// million): Reserve refuses a larger estimate, and a larger settlement is
// charged MaxCost. Every sum of costs saturates at math.MaxInt64.
// Timestamps are kept to the microsecond, in UTC.
package ledger
