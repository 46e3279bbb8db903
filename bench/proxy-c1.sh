#!/usr/bin/env bash
# Where the time goes at one connection (run by hand from anywhere in the
# checkout; not part of CI): the bare proxy and costgate with every limit
# leased (bench/proxy.sh's "bare-c1" and "leased-c1"), alternated round by
# round, each under `perf stat` counting its own system calls and context
# switches per request; then one window of each under `perf record`, with
# the share of each process's CPU samples under the Go scheduler's
# functions (sysmon, findRunnable) and under costgate's pipeline. Figures
# go to bench/README.md, section "proxy", "At one connection".
#
#   bash bench/proxy-c1.sh
#
# Needs perf (the syscalls:* tracepoints and the cpu-clock event) and
# redis-server. Knobs: PROXY_C1_ROUNDS (3), PROXY_C1_DURATION (4s),
# PROXY_C1_WARMUP (1s).
set -euo pipefail

ROUNDS=${PROXY_C1_ROUNDS:-3}
DUR=${PROXY_C1_DURATION:-4s}
WARMUP=${PROXY_C1_WARMUP:-1s}
root=$(cd "$(dirname "$0")/.." && pwd)
command -v perf >/dev/null || { echo "proxy-c1.sh: needs perf" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "proxy-c1.sh: needs redis-server" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/costgate-c1.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
# wait_file, start_stack, start_costgate
. "$root/bench/proxy/stack.sh"

cd "$root"
start_stack
start_costgate leased 1 "{max_share: 0.01, ttl: 2s}"
declare -A url pid
url[bare]=http://$bare
url[leased]=http://$leased
pid[bare]=$bare_pid
pid[leased]=$leased_pid
load() { # label round
	"$pl" load -c 1 -d "$DUR" -warmup "$WARMUP" -round "$2" -label "$1" -url "${url[$1]}" \
		-pids "upstream=$upstream_pid,bare=$bare_pid,costgate=$leased_pid" >"$tmp/$1-$2.json"
}
num() { grep -o "\"$2\":[0-9.]*" "$1" | head -1 | cut -d: -f2; }

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(go version | cut -d' ' -f3), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| round | proxy | p50 µs | req/s | proxy CPU µs/req | read | write | futex | epoll_pwait | nanosleep | context switches |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
ev=syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_nanosleep,context-switches
for r in $(seq "$ROUNDS"); do
	for p in bare leased; do
		(sleep "${WARMUP%s}" && perf stat -x, -e "$ev" -p "${pid[$p]}" -o "$tmp/stat-$p-$r.txt" -- sleep "${DUR%s}") &
		sp=$!
		load "$p" "$r"
		wait "$sp" || true
		f=$tmp/$p-$r.json
		n=$(num "$f" requests)
		key=$p
		[ "$p" = leased ] && key=costgate
		cpu=$(grep -o "\"$key\":[0-9.]*" "$f" | tail -1 | cut -d: -f2)
		printf '| %s | %s | %.0f | %.0f | %.0f |' "$r" "$p" "$(num "$f" p50_us)" "$(num "$f" rps)" "$cpu"
		awk -F, -v n="$n" '$3 != "" && n > 0 { printf " %.2f |", $1 / n }' "$tmp/stat-$p-$r.txt"
		echo
	done
done

echo
echo "perf record (cpu-clock, 4999 Hz, one window each): share of the process's samples under each function, callees included"
echo
echo "| function | bare | leased |"
echo "| --- | ---: | ---: |"
for p in bare leased; do
	(sleep "${WARMUP%s}" && perf record -q -e cpu-clock -F 4999 -g -p "${pid[$p]}" -o "$tmp/perf-$p.data" -- sleep "${DUR%s}" >/dev/null 2>&1) &
	sp=$!
	load "$p" 0
	wait "$sp" || true
	perf report -i "$tmp/perf-$p.data" --children --sort symbol --stdio -q -g none 2>/dev/null >"$tmp/perf-$p.txt" || true
done
for f in 'pvm_irq_enable' 'runtime.sysmon' 'runtime.findRunnable' 'net/http.(*conn).serve' \
	'proxy.(*Server).serve' 'httputil.(*ReverseProxy).ServeHTTP' 'ledger.(*Ledger).append' 'runtime.gcBgMarkWorker'; do
	printf '| `%s` |' "$f"
	for p in bare leased; do
		s=$(grep -F "$f" "$tmp/perf-$p.txt" | head -1 | awk "{print \$1}" || true)
		printf ' %s |' "${s:--}"
	done
	echo
done
