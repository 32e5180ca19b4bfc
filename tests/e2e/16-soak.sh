#!/usr/bin/env bash
# Soak: iperf3 both ways for SOAK_SECONDS (default 600) with an ioc-driver restart every
# minute (alternately SIGKILL and SIGTERM). Resident memory and descriptors of both daemons
# stay flat, and the pools are back to their configured count after each return.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3; need_daemons
dur=${SOAK_SECONDS:-600}
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
hp=${HOST_PID[1]}
ip netns exec sd-lan iperf3 -s -p 5241 >/dev/null 2>&1 & PIDS+=($!)
ip netns exec sd-lan iperf3 -s -p 5242 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
ip netns exec sd-host iperf3 -c 10.50.0.2 -p 5241 -t "$dur" -i 0 -J >"$T/tx.json" 2>&1 & tx=$!
ip netns exec sd-host iperf3 -c 10.50.0.2 -p 5242 -t "$dur" -i 0 -R -J >"$T/rx.json" 2>&1 & rx=$!
start=$(date +%s); n=0
samples=()
while [ $(($(date +%s) - start)) -lt $((dur - 5)) ]; do
    sleep $(( (dur - 5) < 60 ? (dur - 5) : 60 ))
    [ $(($(date +%s) - start)) -ge $((dur - 5)) ] && break
    n=$((n + 1))
    samples+=("$(rss_kib "$hp") $(fds "$hp") $(rss_kib "$IOC_PID") $(fds "$IOC_PID")")
    if [ $((n % 2)) = 1 ]; then kill -9 "$IOC_PID"; else kill -TERM "$IOC_PID"; fi
    wait "$IOC_PID" 2>/dev/null
    start_ioc
    wait_carrier sd-host up 5
    log "minute $n: host rss/fds ${samples[-1]% * *}, IOC restarted"
done
wait $tx || fail "iperf3 tx did not survive the restarts: $(grep -o '"error".*' "$T/tx.json")"
wait $rx || fail "iperf3 rx did not survive the restarts: $(grep -o '"error".*' "$T/rx.json")"
final="$(rss_kib "$hp") $(fds "$hp") $(rss_kib "$IOC_PID") $(fds "$IOC_PID")"
samples+=("$final")
python3 - "$T" "${samples[@]}" <<'PY' || fail "resources grew"
import json, sys
t, rows = sys.argv[1], [list(map(int, s.split())) for s in sys.argv[2:]]
for name in ("tx", "rx"):
    d = json.load(open(f"{t}/{name}.json"))
    print(f"  {name}: {d['end']['sum_received']['bits_per_second']/1e9:.2f} Gb/s average over the soak")
first, last = rows[0], rows[-1]
print(f"  host-driver: rss {first[0]} -> {last[0]} KiB, fds {first[1]} -> {last[1]}")
print(f"  ioc-driver (per restart): rss {[r[2] for r in rows]} KiB, fds {[r[3] for r in rows]}")
ok = last[1] == first[1] and all(r[3] == rows[0][3] for r in rows)
ok &= last[0] <= first[0] + 8192 and max(r[2] for r in rows) <= min(r[2] for r in rows) + 16384
sys.exit(0 if ok else 1)
PY
bad=$(grep "host connected" "$T/ioc.log" | grep -v "pool_regions=2" | head -n 1)
[ -z "$bad" ] || fail "pools not back to the configured count: $bad"
log "$(grep -c 'host connected' "$T/ioc.log") connections, each with its 2 configured pools"
pass "soak: ${dur}s of iperf3 both ways with $n IOC restarts"
