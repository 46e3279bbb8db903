// Package chaos holds costgate's chaos drills: tests that run costgate as a
// separate process against a real Redis, a real PostgreSQL and an upstream
// that reports random usage, inject faults (SIGKILL, a stopped database, a
// Redis that loses its data) under load, and fail when a limit, a budget or
// the ledger breaks its stated bound. The drills and their bounds are listed
// in README.md. The package has no code of its own.
package chaos
