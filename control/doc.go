// Package control is costgate's control plane: tenants, teams inside
// them, users and API keys, each with budgets, limits, allowed models and
// routes, an expiry and an active flag, managed live through the admin API
// (package admin) and the CLI.
//
// The entities live in the ledger's database (PostgreSQL, or a SQLite file
// beside the embedded ledger), with their own migrations; a key is stored
// as its SHA-256 alone, and its secret shown once, when it is created or
// rotated. Each replica holds the whole control plane in memory (a
// Directory, which the gate asks for the keys its configuration does not
// declare: no database call on the request path), and polls the database
// for changes (one indexed read of a version number per poll, 250 ms by
// default). While the database is down, a replica keeps serving from its
// last copy; it also keeps that copy on disk (snapshot.go), and serves
// from it when it starts while the database is down.
//
// The promotions of shadow policies to enforce (promote.go) live in the
// same database and reach every replica's gate by the same poll.
//
// A request under a control-plane key is checked against every level it
// belongs to (key, user, team, tenant) in the gate's one atomic debit,
// with the configured limits of its tenant's plan; a refusal names the
// level and the limit ("team/research/day").
//
// Budget alerts (alerts.go) are CloudEvents, recorded once per threshold,
// budget and period under an idempotency key, delivered at least once,
// signed with HMAC-SHA256 and retried with exponential backoff.
package control
