// Package learned keeps costgate's learned output estimates: per tenant,
// model, route and request shape, a quantile sketch (costmodel/sketch) of
// the output tokens that settled requests really used, so that a request
// can reserve what is likely (its tenant's p95 for requests like it)
// instead of the worst case (its max_tokens).
//
// A Table is learned at settlement (Observe) and read on the request path
// (Estimate), both in memory, in well under a microsecond. Its sketches
// are shared and kept as follows:
//
//   - With Redis (the limiter store), every replica adds its observations
//     to one Redis hash per key, bucket by bucket (HINCRBY: a sketch merges
//     by adding its counts, so the order of replicas' additions does not
//     matter), every Interval, and reads back the merged counts of the
//     keys it uses. A key lives 30 days after its last observation. Redis
//     keeps the sketches across restarts of costgate.
//   - Without Redis (one node), the Table is written to a file in the data
//     directory every Interval when it changed and at Close, and read at
//     Open.
//
// Stored data that does not parse (a truncated file, a foreign version, a
// Redis field that is no bucket) is logged and left out: the keys it
// concerns start cold and fall back to the configured rule, never a crash.
package learned
