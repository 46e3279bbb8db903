#!/usr/bin/env bash
# RLS decision cost (run by hand from anywhere in the checkout; not part of
# CI): costgate's Envoy RLS v3 listener beside gubernator v2.13.0's gRPC
# GetRateLimits and envoyproxy/ratelimit, in the same run, with 1 and 3
# descriptors per decision. Figures go to bench/README.md, section "RLS
# decision cost: costgate vs gubernator".
#
#   bash bench/rls.sh
#
# Everything listens on loopback. The harness is bench/rls (a Go module of
# its own, so that the main module does not pull gubernator's
# dependencies); it starts gubernator itself, in a child process, a single
# node. The script starts a private redis-server (no persistence) unless
# REDIS_URL is set, costgate with the Redis store, and envoyproxy/ratelimit
# on the same Redis when it builds from the Go module proxy; all are
# stopped at the end. Nothing is flushed: a Redis of REDIS_URL keeps the
# runs' keys until they expire.
#
# Then, for 1 and then 3 descriptors, it runs gubernator, the null server
# (the harness's own RLS server that answers OK and decides nothing: what
# grpc-go costs any Go RLS server, the floor), costgate and
# envoyproxy/ratelimit back to back, each a warm-up and a measured window,
# and prints a table: decisions per second, the server's CPU per decision
# (and its Redis's, for the two that keep their state there), and the
# ratio of each to gubernator's. Each runs twice: in a closed loop
# ($RLS_BENCH_CONC calls always in flight: throughput and CPU, latency by
# Little's law about concurrency / throughput) and at a fixed offered rate
# that all of them sustain ($RLS_BENCH_RATE decisions/s over the same
# streams, open loop: the latency of a decision when the machine is not
# saturated). With RLS_BENCH_ROUNDS above 1, a second table gives each
# row's ratios to gubernator's of the same round as their median over the
# rounds, beside each round's: the figure to read against the targets.
#
# The descriptors each decision sends (key index i, 0 to keys - 1):
#   1 descriptor:  [tenant=bench-<i>]
#   3 descriptors: [tenant=bench-<i>], [tenant=bench-<i>, generic_key=search],
#                  [remote_address=10.0.<i/256>.<i%256>]
# in the RLS domain "costgate", hits_addend 1. costgate's config must give
# each a limit far above the load (the ones below are a billion a minute),
# so that every decision is an allowed one.
#
# costgate's config: COSTGATE_RLS_CONFIG, the path of a config that enables
# the RLS listener (rls_listen) on RLS_BENCH_ADDR; default
# examples/envoy/costgate.yaml. The script starts
#   costgate serve --config "$COSTGATE_RLS_CONFIG" --redis URL
#     --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir TMP
# and waits up to 15 s for RLS_BENCH_ADDR. When the config is missing,
# costgate exits, or the address does not answer, it says so and runs the
# other rows.
#
# Knobs (environment): RLS_BENCH_DURATION (10s), RLS_BENCH_WARMUP (2s),
# RLS_BENCH_CONC (64), RLS_BENCH_CONNS (2), RLS_BENCH_KEYS (1000),
# RLS_BENCH_RATE (2000; 0 skips the fixed-rate rows),
# RLS_BENCH_ROUNDS (1), RLS_BENCH_ADDR (127.0.0.1:8081), RLS_BENCH_DOMAIN
# (costgate), RLS_BENCH_ENVOY_RATELIMIT (1; 0 skips envoyproxy/ratelimit),
# RLS_BENCH_LEASED (1; 0 skips costgate-leased: the same config with the
# benchmark's descriptor limits leased), RLS_BENCH_LEASE (their lease
# policy, "{max_share: 0.01, ttl: 10s}"),
# RLS_BENCH_TRANSPORT (costgate's rls.transport: grpcwire, its default, or
# grpc-go; the script turns rls.reflection off, which needs grpc-go),
# RLS_BENCH_NULL (1; 0 skips the null rows: an RLS server in the harness
# that answers OK without deciding anything, grpc-go's floor),
# RLS_BENCH_RATELIMIT_VERSION (the module version of envoyproxy/ratelimit
# to build), REDIS_URL (a Redis to use instead of a private one),
# RLS_BENCH_REDIS_PID (its PID, to measure its CPU), and RLS_BENCH_KEEP, a
# directory to keep the raw results and logs in.
set -euo pipefail

DUR=${RLS_BENCH_DURATION:-10s}
WARMUP=${RLS_BENCH_WARMUP:-2s}
CONC=${RLS_BENCH_CONC:-64}
CONNS=${RLS_BENCH_CONNS:-2}
KEYS=${RLS_BENCH_KEYS:-1000}
RATE=${RLS_BENCH_RATE:-2000}
ROUNDS=${RLS_BENCH_ROUNDS:-1}
ADDR=${RLS_BENCH_ADDR:-127.0.0.1:8081}
DOMAIN=${RLS_BENCH_DOMAIN:-costgate}
ENVOY_RL=${RLS_BENCH_ENVOY_RATELIMIT:-1}
LEASED=${RLS_BENCH_LEASED:-1}
NULL=${RLS_BENCH_NULL:-1}
LEASE=${RLS_BENCH_LEASE:-"{max_share: 0.01, ttl: 10s}"}
TRANSPORT=${RLS_BENCH_TRANSPORT:-grpcwire}
# The version the module proxy served as @latest on 2026-12-01.
RL_VERSION=${RLS_BENCH_RATELIMIT_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}

root=$(cd "$(dirname "$0")/.." && pwd)
# COSTGATE_RLS_CONFIG: the costgate config to benchmark; its RLS listener
# must be on $ADDR.
COSTGATE_RLS_CONFIG=${COSTGATE_RLS_CONFIG:-$root/examples/envoy/costgate.yaml}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/costgate-rls-bench.XXXXXX")
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
	if [ -n "${RLS_BENCH_KEEP:-}" ]; then
		mkdir -p "$RLS_BENCH_KEEP"
		cp "$tmp"/*.txt "$tmp"/*.log "$RLS_BENCH_KEEP"/ 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "# $*"; }

# port_open tells whether something accepts TCP connections on host:port.
port_open() {
	(exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null
}

# wait_port waits up to $2 tenths of a second for $1 to accept connections
# while process $3 lives.
wait_port() {
	local i
	for i in $(seq "$2"); do
		port_open "$1" && return 0
		kill -0 "$3" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

cd "$root"
say "$(date -u +%FT%TZ) $(nproc) CPUs, $(go version | cut -d' ' -f3-), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
(cd bench/rls && go build -o "$tmp/rlsbench" .)
go build -o "$tmp/costgate" ./cmd/costgate
bench=$tmp/rlsbench

# Redis: a private one unless REDIS_URL names one.
redis_pid=${RLS_BENCH_REDIS_PID:-}
if [ -z "${REDIS_URL:-}" ]; then
	port=$(timeout 10 "$bench" -freeport)
	redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
	redis_pid=$!
	pids+=("$redis_pid")
	for i in $(seq 100); do
		[ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break
		[ "$i" = 100 ] && { echo "rls.sh: redis-server did not start" >&2; cat "$tmp/redis.log" >&2; exit 1; }
		sleep 0.1
	done
	REDIS_URL="redis://127.0.0.1:$port/0"
	say "private redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on 127.0.0.1:$port"
else
	if [ -n "$redis_pid" ]; then
		say "Redis of REDIS_URL, PID $redis_pid"
	else
		say "Redis of REDIS_URL; its CPU is not measured (set RLS_BENCH_REDIS_PID)"
	fi
fi
# host:port, for envoyproxy/ratelimit.
redis_hostport=$(sed -E 's#^rediss?://([^@/]*@)?([^/?]*).*#\2#' <<<"$REDIS_URL")

# start_costgate NAME CONFIG ADDR REDIS starts costgate on CONFIG, serving
# RLS on ADDR with the Redis store REDIS, and sets NAME_pid, or NAME_skip
# to why its rows are skipped.
start_costgate() {
	local name=$1 config=$2 addr=$3 redis=$4 pid= skip=
	if [ ! -f "$config" ]; then
		skip="config $config not found (set COSTGATE_RLS_CONFIG)"
	elif port_open "$addr"; then
		skip="something else already listens on $addr (set RLS_BENCH_ADDR to the config's rls_listen)"
	else
		mkdir -p "$tmp/data-$name"
		"$tmp/costgate" serve --config "$config" --redis "$redis" \
			--listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir "$tmp/data-$name" >"$tmp/$name.out" 2>"$tmp/$name.log" &
		pid=$!
		pids+=("$pid")
		if ! wait_port "$addr" 150 "$pid"; then
			if kill -0 "$pid" 2>/dev/null; then
				skip="costgate runs but nothing answers on $addr after 15 s (no RLS listener in this build or config?)"
			else
				skip="costgate exited: $(tail -3 "$tmp/$name.log" | tr '\n' ' ')"
			fi
		fi
	fi
	printf -v "${name}_pid" '%s' "$pid"
	printf -v "${name}_skip" '%s' "$skip"
	if [ -n "$skip" ]; then
		say "${name//_/-}'s RLS is not reachable, its rows are skipped: $skip"
	else
		say "${name//_/-} (PID $pid) serves RLS on $addr, config $config, Redis $redis"
	fi
}

# The config as benchmarked: its rls section served on $TRANSPORT, and
# reflection off, which needs grpc-go's server.
mkdir -p "$tmp/cfg"
sed -e '/^  reflection: /d' -e "s|^rls:.*|rls:\n  transport: $TRANSPORT|" \
	"$COSTGATE_RLS_CONFIG" >"$tmp/cfg/costgate.yaml" 2>/dev/null || true
COSTGATE_RLS_CONFIG=$tmp/cfg/costgate.yaml
say "costgate's RLS transport: $TRANSPORT"

# costgate, serving RLS on $ADDR.
start_costgate costgate "$COSTGATE_RLS_CONFIG" "$ADDR" "$REDIS_URL"
# The same config with every descriptor limit of a billion a minute (the
# benchmark's) leased ($LEASE), on Redis database 1 (REDIS_URL's with /1 for its
# database), serving RLS on a port of its own.
costgate_leased_skip="RLS_BENCH_LEASED=0"
if [ "$LEASED" != 0 ]; then
	leased_addr=127.0.0.1:$("$bench" -freeport)
	mkdir -p "$tmp/cfg-leased"
	sed -e "s|^rls_listen: .*|rls_listen: \"$leased_addr\"|" \
		-e "s|requests_per_unit: 1000000000}|requests_per_unit: 1000000000, lease: $LEASE}|" \
		"$COSTGATE_RLS_CONFIG" >"$tmp/cfg-leased/costgate.yaml" 2>/dev/null || true
	if ! grep -qF "lease: $LEASE" "$tmp/cfg-leased/costgate.yaml"; then
		costgate_leased_skip="no descriptor of $COSTGATE_RLS_CONFIG has requests_per_unit: 1000000000} to lease"
		say "costgate-leased rows are skipped: $costgate_leased_skip"
	else
		leased_redis=$(sed -E 's#(://[^/]*)(/[0-9]*)?(\?.*)?$#\1/1\3#' <<<"$REDIS_URL")
		start_costgate costgate_leased "$tmp/cfg-leased/costgate.yaml" "$leased_addr" "$leased_redis"
	fi
fi

# envoyproxy/ratelimit: built from the Go module proxy, configured by
# environment, its limits a YAML file under RUNTIME_ROOT.
rl_pid=
rl_addr=
rl_skip=
if [ "$ENVOY_RL" = 0 ]; then
	rl_skip="RLS_BENCH_ENVOY_RATELIMIT=0"
elif ! (cd "$tmp" && GOFLAGS=-mod=mod GOBIN="$tmp/bin" go install "github.com/envoyproxy/ratelimit/src/service_cmd@$RL_VERSION") >"$tmp/ratelimit-build.log" 2>&1; then
	rl_skip="it did not build: $(grep -v '^go: downloading' "$tmp/ratelimit-build.log" | tail -3 | tr '\n' ' ')"
else
	mkdir -p "$tmp/runtime/ratelimit/config"
	cat >"$tmp/runtime/ratelimit/config/costgate.yaml" <<EOF
domain: $DOMAIN
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
    descriptors:
      - key: generic_key
        value: search
        rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
EOF
	grpc_port=$("$bench" -freeport)
	env -i PATH="$PATH" HOME="$tmp" LOG_LEVEL=warn DISABLE_STATS=true USE_STATSD=false \
		REDIS_SOCKET_TYPE=tcp REDIS_URL="$redis_hostport" \
		RUNTIME_ROOT="$tmp/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
		HOST=127.0.0.1 PORT="$("$bench" -freeport)" GRPC_HOST=127.0.0.1 GRPC_PORT="$grpc_port" \
		DEBUG_HOST=127.0.0.1 DEBUG_PORT="$("$bench" -freeport)" \
		"$tmp/bin/service_cmd" >"$tmp/ratelimit.log" 2>&1 &
	rl_pid=$!
	pids+=("$rl_pid")
	rl_addr=127.0.0.1:$grpc_port
	if ! wait_port "$rl_addr" 150 "$rl_pid"; then
		rl_skip="it did not listen on $rl_addr: $(tail -3 "$tmp/ratelimit.log" | tr '\n' ' ')"
	fi
fi
if [ -n "$rl_skip" ]; then
	say "envoyproxy/ratelimit rows are skipped: $rl_skip"
else
	say "envoyproxy/ratelimit $RL_VERSION (PID $rl_pid) on $rl_addr, Redis store, default pipelining (none)"
fi

common=(-concurrency "$CONC" -conns "$CONNS" -keys "$KEYS" -duration "$DUR" -warmup "$WARMUP" -domain "$DOMAIN")
results=$tmp/results.txt
: >"$results"
bound=$((${DUR%s} + ${WARMUP%s} + 60))
# row runs one measurement and appends its line, prefixed with the round;
# a failed run is reported and skipped.
row() {
	local round=$1
	shift
	if timeout "$bound" "$bench" "${common[@]}" "$@" >"$tmp/row.txt" 2>>"$tmp/rlsbench.log"; then
		sed "s/^/round=$round /" "$tmp/row.txt" | tee -a "$results"
	else
		say "run failed: $* ($(tail -1 "$tmp/rlsbench.log"))"
	fi
}
loads=(0)
if [ "$RATE" != 0 ]; then
	loads+=("$RATE")
fi
for r in $(seq "$ROUNDS"); do
	for d in 1 3; do
		for rate in "${loads[@]}"; do
			row "$r" -rate "$rate" -target gubernator -descriptors "$d"
			if [ "$NULL" != 0 ]; then
				row "$r" -rate "$rate" -target null -descriptors "$d"
			fi
			if [ -z "$costgate_skip" ]; then
				row "$r" -rate "$rate" -target rls -label costgate -addr "$ADDR" -descriptors "$d" -pid "$costgate_pid" ${redis_pid:+-store-pid "$redis_pid"}
			fi
			if [ -z "$costgate_leased_skip" ]; then
				row "$r" -rate "$rate" -target rls -label costgate-leased -addr "$leased_addr" -descriptors "$d" -pid "$costgate_leased_pid" ${redis_pid:+-store-pid "$redis_pid"}
			fi
			if [ -z "$rl_skip" ]; then
				row "$r" -rate "$rate" -target rls -label envoy-ratelimit -addr "$rl_addr" -descriptors "$d" -pid "$rl_pid" ${redis_pid:+-store-pid "$redis_pid"}
			fi
		done
	done
done
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$costgate_skip" ]; then
	say "costgate rows skipped: $costgate_skip"
fi
if [ -n "$costgate_leased_skip" ]; then
	say "costgate-leased rows skipped: $costgate_leased_skip"
fi
echo

# The table: each row against gubernator's of the same round, descriptors
# and load; "server" is the RLS process alone, "+ Redis" adds the
# store's CPU (gubernator keeps its state in its own process). With
# several rounds, a second table: each ratio's median over the rounds
# (the lower middle one of an even count), beside each round's. One
# round's ratio moves by 20 to 30% with the machine's drift; the median
# of three or more is the figure to read against the targets.
awk -v rounds="$ROUNDS" '
	function val(k) { return (k in f) ? f[k] : "-" }
	function ratio(a, b) { return (a == "-" || b == "" || b == 0) ? "" : sprintf("%.2fx", a / b) }
	# median of the numbers in s, space-separated
	function median(s,    a, n, i, j, t) {
		n = split(s, a, " ")
		for (i = 2; i <= n; i++) {
			t = a[i]
			for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]
			a[j + 1] = t
		}
		return a[int((n + 1) / 2)]
	}
	{
		delete f
		for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = substr($i, length(kv[1]) + 2) }
		case_ = f["descriptors"] "/" f["rate"] "/" f["conc"]
		key = f["round"] "/" case_
		server = val("cpu_us/decision"); store = val("store_cpu_us/decision")
		total = (server == "-") ? "-" : server + ((store == "-") ? 0 : store)
		if (f["target"] == "gubernator") { gs[key] = server; gt[key] = total }
		load = (f["rate"] == "closed") ? "closed, " f["conc"] " in flight" : f["rate"] "/s over " f["conc"]
		n++
		row[n] = sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |",
			f["target"], f["descriptors"], load, f["round"], val("decisions/s"), server, store,
			(total == "-") ? "-" : sprintf("%.2f", total),
			ratio(server, gs[key]), ratio(total, gt[key]), val("p50_ms"), val("p99_ms"), val("errors"), val("load1"))
		# The ratios of each target and case over the rounds.
		if (f["target"] == "gubernator" || server == "-" || gs[key] == "" || gs[key] == 0) next
		k = f["target"] "|" f["descriptors"] "|" load
		if (!(k in rs)) order[++m] = k
		rs[k] = rs[k] " " server / gs[key]; rt[k] = rt[k] " " total / gt[key]
		each[k] = each[k] (used[k] ? ", " : "") sprintf("%.2f", server / gs[key])
		eacht[k] = eacht[k] (used[k] ? ", " : "") sprintf("%.2f", total / gt[key])
		used[k]++
	}
	END {
		print "| target | descriptors | load | round | decisions/s | server CPU µs/decision | Redis CPU µs/decision | server + Redis | server vs gubernator | server + Redis vs gubernator | p50 ms | p99 ms | errors | load |"
		print "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
		for (i = 1; i <= n; i++) print row[i]
		if (rounds <= 1) exit
		print ""
		print "| target | descriptors | load | rounds | server vs gubernator, median | each round | server + Redis vs gubernator, median | each round |"
		print "| --- | ---: | --- | ---: | ---: | --- | ---: | --- |"
		for (i = 1; i <= m; i++) {
			k = order[i]; split(k, c, "|")
			printf "| %s | %s | %s | %d | **%.2fx** | %s | %.2fx | %s |\n", c[1], c[2], c[3], used[k], median(rs[k]), each[k], median(rt[k]), eacht[k]
		}
	}' "$results"
