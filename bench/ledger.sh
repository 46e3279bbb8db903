#!/bin/sh
# Ledger benchmarks (run by hand, from the repository root): the
# request-path cost of Reserve, sustained entries per second from
# Reserve/Settle into PostgreSQL, and the period-to-date spend query. Needs the PostgreSQL of DATABASE_URL (or
# the local default of internal/pgtest). Figures go to bench/README.md,
# section "ledger".
set -eu
N=${LEDGER_BENCH_N:-300000}
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
go test -count=3 -run XXX -bench 'Reserve/background-fsync' -benchmem -benchtime 200000x ./ledger/
go test -count=1 -run XXX -bench 'Reserve/sync-each' -benchmem -benchtime 2000x ./ledger/
LEDGER_BENCH_N=$N go test -count=3 -run XXX -bench PostgresThroughput -benchtime 1x ./ledger/
LEDGER_BENCH_N=$N go test -count=1 -run XXX -bench EmbeddedThroughput -benchtime 1x ./ledger/
go test -count=1 -run XXX -bench Spend -benchmem ./ledger/
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
