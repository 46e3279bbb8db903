#!/usr/bin/env bash
# Proxy load benchmark (run by hand from anywhere in the checkout; not part
# of CI): costgate's full pipeline against a bare httputil.ReverseProxy, in
# front of the same stub upstream, in the same run. Figures go to
# bench/README.md, section "proxy".
#
#   bash bench/proxy.sh
#
# Everything listens on loopback: a private redis-server (no persistence),
# the stub upstream, the bare proxy and costgate (Redis store, three
# limits, a Rego policy, the embedded ledger in a temporary directory), all
# stopped at the end. Then, for each round, the load generator runs
# "direct" (the stub itself), "bare" and "costgate" back to back, each a
# warm-up and a measured window at $CONNS connections, and the report gives
# medians and ratios. perf, when installed and PROXY_BENCH_PERF is not 0,
# profiles costgate during one more window to split its CPU by stage (the
# leased costgate with PROXY_BENCH_PERF=leased).
#
# The last pair of each round, "bare-rate" and "costgate-rate", offers a
# fixed rate that both sustain ($RATE req/s over $CONNS connections, open
# loop): there the added p50 is what the pipeline adds to a request, not
# the queueing that saturation brings.
#
# With PROXY_BENCH_LEASED (1), a second costgate runs the same config with
# every limit leased (lease: {max_share: 0.01, ttl: 2s}, on Redis database
# 1), measured as "leased", "leased-c1" and "leased-rate" in each round
# beside the others.
#
# Knobs (environment): PROXY_BENCH_ROUNDS (5), PROXY_BENCH_DURATION (4s),
# PROXY_BENCH_WARMUP (1s), PROXY_BENCH_CONNS (32), PROXY_BENCH_RATE (2000),
# PROXY_BENCH_PERF (1), PROXY_BENCH_GOGC (GOGC for costgate alone; unset:
# costgate's own default), and
# PROXY_BENCH_KEEP, a directory to keep the raw results, logs and the
# perf profile in.
set -euo pipefail

ROUNDS=${PROXY_BENCH_ROUNDS:-5}
DUR=${PROXY_BENCH_DURATION:-4s}
WARMUP=${PROXY_BENCH_WARMUP:-1s}
CONNS=${PROXY_BENCH_CONNS:-32}
RATE=${PROXY_BENCH_RATE:-2000}
PERF=${PROXY_BENCH_PERF:-1}
LEASED=${PROXY_BENCH_LEASED:-1}
ADMIN_TOKEN=bench-admin

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/costgate-proxy-bench.XXXXXX")
pids=()

cleanup() {
	local p i
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		for i in $(seq 50); do
			kill -0 "$p" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$p" 2>/dev/null || true
	done
	if [ -n "${PROXY_BENCH_KEEP:-}" ]; then
		mkdir -p "$PROXY_BENCH_KEEP"
		cp "$tmp"/*.jsonl "$tmp"/*.json "$tmp"/*.log "$tmp"/*.txt "$tmp"/perf.data "$tmp/costgate" "$PROXY_BENCH_KEEP"/ 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_file, start_stack, start_costgate
. "$root/bench/proxy/stack.sh"

# check sends one request and fails unless the answer is 200.
check() {
	local code
	code=$(curl -s -m 5 -o "$tmp/check.out" -w '%{http_code}' "$1/v1/chat/completions" \
		-H 'Authorization: Bearer cg-bench' -H 'Content-Type: application/json' \
		-d '{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}')
	if [ "$code" != 200 ]; then
		echo "proxy.sh: $1 answered $code: $(cat "$tmp/check.out")" >&2
		return 1
	fi
}

cd "$root"
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(go version | cut -d' ' -f3-), commit $(git rev-parse --short HEAD)"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
start_stack
start_costgate costgate 0 ""
admin=$costgate_admin
grep -o '"msg":"costgate: [^"]*"' "$tmp/costgate.log" | sed 's/^"msg":"\(.*\)"$/# \1/'

leased_pid=
if [ "$LEASED" != 0 ]; then
	start_costgate leased 1 "{max_share: 0.01, ttl: 2s}"
fi

check "http://$upstream"
check "http://$bare"
check "http://$costgate"
[ -z "$leased_pid" ] || check "http://$leased"

common=(-c "$CONNS" -d "$DUR" -warmup "$WARMUP" -pids "upstream=$upstream_pid,bare=$bare_pid,costgate=$costgate_pid,redis=$redis_pid${leased_pid:+,leased=$leased_pid}")
results=$tmp/results.jsonl
bound=$((${DUR%s} + ${WARMUP%s} + 30))
for r in $(seq "$ROUNDS"); do
	timeout "$bound" "$pl" load "${common[@]}" -round "$r" -label direct -url "http://$upstream" | tee -a "$results"
	timeout "$bound" "$pl" load "${common[@]}" -round "$r" -label bare -url "http://$bare" | tee -a "$results"
	timeout "$bound" "$pl" load "${common[@]}" -round "$r" -label costgate -url "http://$costgate" \
		-metrics "http://$admin/metrics" -admin-token "$ADMIN_TOKEN" | tee -a "$results"
	# One connection: the latency a request adds when nothing queues.
	timeout "$bound" "$pl" load "${common[@]}" -c 1 -round "$r" -label bare-c1 -url "http://$bare" | tee -a "$results"
	timeout "$bound" "$pl" load "${common[@]}" -c 1 -round "$r" -label costgate-c1 -url "http://$costgate" \
		-metrics "http://$admin/metrics" -admin-token "$ADMIN_TOKEN" | tee -a "$results"
	# A fixed rate both sustain: what the pipeline adds without queueing.
	timeout "$bound" "$pl" load "${common[@]}" -rate "$RATE" -round "$r" -label bare-rate -url "http://$bare" | tee -a "$results"
	timeout "$bound" "$pl" load "${common[@]}" -rate "$RATE" -round "$r" -label costgate-rate -url "http://$costgate" \
		-metrics "http://$admin/metrics" -admin-token "$ADMIN_TOKEN" | tee -a "$results"
	if [ -n "$leased_pid" ]; then
		for mode in "" "-c1" "-rate"; do
			extra=()
			[ "$mode" = -c1 ] && extra=(-c 1)
			[ "$mode" = -rate ] && extra=(-rate "$RATE")
			timeout "$bound" "$pl" load "${common[@]}" "${extra[@]}" -round "$r" -label "leased$mode" -url "http://$leased" \
				-metrics "http://$leased_admin/metrics" -admin-token "$ADMIN_TOKEN" | tee -a "$results"
		done
	fi
done
if [ -n "$leased_pid" ]; then
	curl -s -m 5 -H "Authorization: Bearer $ADMIN_TOKEN" "http://$leased_admin/admin/v1/leases" |
		grep -o '"store":{[^}]*}' | sed 's/^/# leased costgate: /' || true
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
curl -s -m 5 -H "Authorization: Bearer $ADMIN_TOKEN" "http://$admin/metrics" |
	awk '/^go_memstats_heap_inuse_bytes / { h = $2 } /^process_resident_memory_bytes / { r = $2 } /^go_gc_duration_seconds_count / { g = $2 }
		END { printf "# costgate memory at the end: heap in use %.1f MiB, resident %.1f MiB, %d GC cycles since start\n", h / 1048576, r / 1048576, g }' || true
echo "# costgate log: $(grep -c 'config reloaded' "$tmp/costgate.log" || true) config reloads," \
	"$(grep -c 'limiter store failed' "$tmp/costgate.log" || true) limiter store failures," \
	"$(grep -c 'limiter settle failed' "$tmp/costgate.log" || true) limiter settle failures"
redis-cli -p "$port" info commandstats | grep -E '^cmdstat_(evalsha|eval|script)' | sed 's/^/# redis /' || true
echo
"$pl" report "$results"

if [ "$PERF" = 0 ] || ! command -v perf >/dev/null; then
	exit 0
fi

# syscalls counts the system calls a proxy makes per request, over one
# measured window (perf stat starts when the load generator's warm-up ends).
syscalls() {
	local label=$1 pid=$2 url=$3 events=syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_pwrite64,syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_nanosleep
	(sleep "${WARMUP%s}" && timeout "$bound" perf stat -x, -e "$events" -p "$pid" -o "$tmp/stat-$label.txt" -- sleep "${DUR%s}") &
	local stat_pid=$!
	timeout "$bound" "$pl" load "${common[@]}" -round 0 -label "$label" -url "$url" >"$tmp/stat-$label.json"
	wait "$stat_pid" || true
	local n
	n=$(grep -o '"requests":[0-9]*' "$tmp/stat-$label.json" | cut -d: -f2) || true
	printf '| %s |' "$label"
	awk -F, -v n="${n:-0}" '/syscalls:/ && n > 0 { sub("syscalls:sys_enter_", "", $3); printf " %s %.2f |", $3, $1 / n }' \
		"$tmp/stat-$label.txt" 2>/dev/null || printf ' perf stat failed |'
	echo
}
echo
echo "System calls per request, by the proxy process alone (perf stat over one ${DUR} window):"
echo
syscalls bare-syscalls "$bare_pid" "http://$bare"
syscalls costgate-syscalls "$costgate_pid" "http://$costgate"
# With PROXY_BENCH_PERF=leased, the leased costgate is the one profiled.
target=costgate target_pid=$costgate_pid target_url=http://$costgate
if [ "$PERF" = leased ] && [ -n "$leased_pid" ]; then
	target=leased target_pid=$leased_pid target_url=http://$leased
	syscalls leased-syscalls "$leased_pid" "$target_url"
fi

# One more window of the target under perf record: the share of its CPU
# samples under each stage's function (callees included), times its CPU
# per request, is the stage's CPU per request.
timeout "$bound" perf record -q -F 1999 -g -p "$target_pid" -o "$tmp/perf.data" -- sleep $((${DUR%s} + ${WARMUP%s})) \
	>/dev/null 2>"$tmp/perf.log" &
perf_pid=$!
timeout "$bound" "$pl" load "${common[@]}" -round 0 -label "$target-perf" -url "$target_url" >"$tmp/perf-run.json"
wait "$perf_pid" || true
cpu=$(grep -o "\"$target\":[0-9.]*" "$tmp/perf-run.json" | cut -d: -f2) || true
echo
echo "perf record: $target at $(grep -o '"rps":[0-9]*' "$tmp/perf-run.json" | cut -d: -f2) req/s, $cpu µs CPU/request;" \
	"share of its samples under each function, callees included, and that share of the CPU per request:"
echo
perf report -i "$tmp/perf.data" --children --no-demangle --sort symbol --stdio -q -g none --percent-limit 0.3 2>/dev/null \
	>"$tmp/perf.txt" || true
echo "| stage | function | share | µs CPU/request |"
echo "| --- | --- | ---: | ---: |"
for f in \
	'http-server net/http.(*conn).serve' \
	'pipeline proxy.(*Server).serve' \
	'identify proxy.(*state).identify' \
	'estimate costmodel.(*Estimator).Estimate' \
	'debit proxy.(*Server).debit' \
	'debit:redis weighted.(*Redis).Debit' \
	'policy proxy.(*Server).decide' \
	'policy:rego policies.(*Set).Decide' \
	'ledger-reserve ledger.(*Ledger).Reserve' \
	'forward httputil.(*ReverseProxy).ServeHTTP' \
	'forward:upstream-write net/http.(*persistConn).writeLoop' \
	'forward:upstream-read net/http.(*persistConn).readLoop' \
	'settle proxy.(*Server).settle' \
	'settle:redis weighted.(*Redis).Settle' \
	'settle:ledger ledger.(*Ledger).Settle' \
	'settle:usage proxy.(*exchange).actualUsage' \
	'record proxy.(*exchange).record' \
	'background:ledger-apply ledger.(*Ledger).flushLoop' \
	'ledger-apply:load ledger.(*sqliteTx).load' \
	'ledger-apply:write ledger.(*sqliteTx).write' \
	'ledger-apply:commit ledger.(*sqliteTx).commit' \
	'ledger-apply:spool-read ledger.(*spool).read' \
	'ledger-apply:mark ledger.(*spool).markApplied' \
	'background:ledger-fsync ledger.(*spool).syncLoop' \
	'background:gc runtime.gcBgMarkWorker' \
	'all-goroutines runtime.goexit.abi0'; do
	set -- $f
	awk -v stage="$1" -v s="$2" -v cpu="$cpu" '
		{ f = $4 }
		f == s || substr(f, length(f) - length(s)) == "/" s { p = $1; sub("%", "", p); printf "| %s | `%s` | %.1f%% | %.1f |\n", stage, s, p, p / 100 * cpu; found = 1; exit }
		END { if (!found) printf "| %s | `%s` | <0.3%% | |\n", stage, s }' "$tmp/perf.txt" 2>/dev/null || true
done
