#!/usr/bin/env bash
# Hot key benchmark (run by hand; not part of CI): one key of a token
# bucket (100,000 a second, burst 10,000) debited from 64 goroutines of
# one replica, strictly and leased (lease: at most 1,000 units, 2 s), in
# the same run, on a private redis-server (BenchmarkHotKey in weighted).
# Figures go to bench/README.md, section "Hot key".
#
#   bash bench/hotkey.sh            # HOTKEY_COUNT (3) runs of HOTKEY_TIME (3s) each
set -euo pipefail
cd "$(dirname "$0")/.."
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(go version | cut -d' ' -f3-), commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
go test -run X -bench 'HotKey' -benchtime "${HOTKEY_TIME:-3s}" -count "${HOTKEY_COUNT:-3}" ./weighted/ | tee /dev/stderr |
	awk '/^BenchmarkHotKey/ {
		mode = ($1 ~ /leased/) ? "leased" : "strict"
		for (i = 3; i < NF; i++) if ($(i+1) == "decisions/s") d[mode] = d[mode] " " $i
	} END {
		print "decisions/s strict:" d["strict"]
		print "decisions/s leased:" d["leased"]
	}'
