// Package ledger records every admitted request exactly once, for billing.
//
// The life of an entry follows the reservation pattern of the limiter: the
// proxy calls Reserve with the estimate before it forwards a request, and
// Settle with what the upstream reported once the response is over. Both
// calls are one append to a local write-ahead spool (a few microseconds);
// a background flusher, the only writer of the store, moves the spool into
// the store in batches, in order, and idempotently by request id. The store
// is PostgreSQL (Config.DSN) or an embedded SQLite file under Config.Dir;
// both behave the same and pass the same test suite.
//
// Because the spool, not the database, is what makes an entry durable, a
// database outage costs nothing but latency of the reports: entries wait in
// the bounded spool and are replayed in order when the database returns. A
// process that dies between Reserve and Settle leaves a reservation without
// its settlement; the next Open of the same Dir finalizes it at its estimate
// with status StatusRecovered. A settlement found later in the spool still
// wins over the recovery, so an entry is charged at its estimate only when no
// settlement was ever recorded.
//
// Money is costmodel.NanoUSD and token counts are int64; no float is ever
// stored. Timestamps are kept to the microsecond, in UTC.
package ledger
