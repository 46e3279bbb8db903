# Sourced by bench/proxy.sh and bench/proxy-c1.sh, which set $root (the
# checkout), $tmp (their temporary directory) and the pids array (what
# their exit stops). It builds costgate and the load generator into $tmp
# and starts the benchmark's processes on loopback.

# wait_file waits up to 10 s for a non-empty file.
wait_file() {
	local i
	for i in $(seq 100); do
		[ -s "$1" ] && return 0
		sleep 0.1
	done
	echo "${0##*/}: timed out waiting for $1" >&2
	return 1
}

# start_stack builds $tmp/costgate and the load generator, $pl, and
# starts a private redis-server (no persistence), the stub upstream and the
# bare proxy in front of it. It sets port and redis_pid, upstream and
# upstream_pid, bare and bare_pid (addresses host:port).
start_stack() {
	local i
	(cd "$root" && go build -o "$tmp/costgate" ./cmd/costgate && go build -o "$tmp/proxyload" ./bench/proxyload)
	pl=$tmp/proxyload
	port=$(timeout 10 "$pl" freeport)
	redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
	pids+=($!)
	redis_pid=$!
	for i in $(seq 100); do
		[ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break
		[ "$i" = 100 ] && { echo "${0##*/}: redis-server did not start" >&2; cat "$tmp/redis.log" >&2; exit 1; }
		sleep 0.1
	done

	"$pl" upstream -addr-file "$tmp/upstream.addr" 2>"$tmp/upstream.log" &
	pids+=($!)
	upstream_pid=$!
	wait_file "$tmp/upstream.addr"
	upstream=$(cat "$tmp/upstream.addr")

	"$pl" bare -upstream "http://$upstream" -addr-file "$tmp/bare.addr" 2>"$tmp/bare.log" &
	pids+=($!)
	bare_pid=$!
	wait_file "$tmp/bare.addr"
	bare=$(cat "$tmp/bare.addr")
}

# start_costgate NAME DB LEASE starts costgate on bench/proxy/costgate.yaml
# in front of the stub, on Redis database DB, every limit with LEASE (a
# lease policy such as "{max_share: 0.01, ttl: 2s}", or empty: strict). Its
# config gets a directory of its own: costgate watches the config file's
# whole directory and reloads on any change in it (see the README). It sets
# NAME_pid, NAME (the data plane's address) and NAME_admin (the admin
# plane's); the log is $tmp/NAME.log.
start_costgate() {
	local name=$1 db=$2 lease=$3 i p addr
	mkdir -p "$tmp/data-$name" "$tmp/cfg-$name"
	sed -e "s|@UPSTREAM@|$upstream|" -e "s|@POLICIES@|$root/bench/proxy/policies|" "$root/bench/proxy/costgate.yaml" |
		if [ -n "$lease" ]; then sed -e "s|^\(    period: .*\)$|\1\n    lease: $lease|"; else cat; fi >"$tmp/cfg-$name/costgate.yaml"
	${PROXY_BENCH_GOGC:+env GOGC=$PROXY_BENCH_GOGC} "$tmp/costgate" serve --config "$tmp/cfg-$name/costgate.yaml" \
		--listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --redis "redis://127.0.0.1:$port/$db" --data-dir "$tmp/data-$name" \
		>"$tmp/$name.out" 2>"$tmp/$name.log" &
	p=$!
	pids+=("$p")
	for i in $(seq 100); do
		grep -q 'costgate: serving' "$tmp/$name.log" 2>/dev/null && break
		kill -0 "$p" 2>/dev/null || { echo "${0##*/}: costgate ($name) exited" >&2; cat "$tmp/$name.log" >&2; exit 1; }
		[ "$i" = 100 ] && { echo "${0##*/}: costgate ($name) did not start" >&2; exit 1; }
		sleep 0.1
	done
	# The startup lines are log records on stderr, beside the logs.
	addr=$(sed -n 's/.*costgate: serving .* on \([0-9.:]*\) (admin on \([0-9.:]*\)).*/\1 \2/p' "$tmp/$name.log" | head -1)
	printf -v "${name}_pid" '%s' "$p"
	printf -v "$name" '%s' "${addr% *}"
	printf -v "${name}_admin" '%s' "${addr#* }"
}
