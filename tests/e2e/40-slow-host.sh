#!/usr/bin/env bash
# A host that keeps its session alive (keepalives, a GetStats a second) but never reads its
# data channel, while the LAN floods it with UDP: its frames are dropped and counted against
# it (rx_quota), it is not dropped as silent, and the other host's traffic goes on: never
# reconnected, its iperf3 and pings through, and afterwards LAN delivery works for every
# host. The throughput ratio of the good host (flood on the slow host / before) is printed,
# not asserted (timings never decide a test).
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3 ping; need_daemons
need_rogue
# The hostile peer speaks the plain handshake of an admitted host (e2e 32 tests admission).
open_admission
json() { ctl_json "$T/ioc.sock" "$@"; }
topo_up 2; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
before=$(iperf sd-host 10.50.0.2 5301 -t 4 -R) || fail "iperf3 before the flood"
log "good host, LAN -> host: $before Gb/s before"

ip netns exec sd-host2 "$ROGUE" slow 10.200.0.2:7400 22 >"$T/slow.out" 2>&1 &
slow=$!
PIDS+=("$slow")
eventually 5 grep -q '^mac ' "$T/slow.out" || fail "the slow host did not connect: $(cat "$T/slow.out")"
mac=$(awk '/^mac /{print $2}' "$T/slow.out")
run ip -n sd-lan neigh replace 10.50.0.99 lladdr "$mac" dev lan1 nud permanent
ip netns exec sd-lan python3 "$ROOT/tests/udp_flood.py" 10.50.0.99 9 800 18 >"$T/flood.out" 2>&1 &
flood=$!
PIDS+=("$flood")
sleep 2
during=$(iperf sd-host 10.50.0.2 5302 -t 8 -R) || fail "the good host's iperf3 during the flood"
PING_COUNT=10 ping_ok sd-host 10.50.0.2
log "good host, LAN -> host: $during Gb/s while the slow host is flooded ($(awk -v a="$during" -v b="$before" 'BEGIN { printf "%.2f", a / b }')x)"
assert_positive "$during" "the good host's throughput during the flood"
held=$(json hosts "max(h['buffer_bytes'] - h['buffer_quota_bytes'] for h in d['hosts']['hosts'])")
assert_le "$held" 0 "no host holds more send buffers than its quota"
wait "$flood" || fail "the flood failed: $(cat "$T/flood.out")"
log "flood: $(cat "$T/flood.out")"
wait "$slow"; rc=$?
sed 's/^/  slow: /' "$T/slow.out"
[ "$rc" = 0 ] || fail "the IOC dropped the slow host although it kept its session alive"

dropped=$(json stats "d['stats'].get('drops', {}).get('rx_quota', 0)")
log "IOC: $dropped frames for the slow host dropped at its quota"
assert_ge "$dropped" 1000 "frames for the slow host dropped and counted (rx_quota)"
assert_no_grep "$T/ioc.log" "silent beyond the keepalive" "a host dropped as silent"
assert_no_grep "$T/host1.log" "fabric lost|connection lost" "the good host reconnected"

# Afterwards the LAN reaches every host: the good one, and a new host where the slow one was.
ping_ok sd-host 10.50.0.2
start_host 2
wait_carrier sd-host2 up 10
ping_ok sd-host2 10.50.0.2
in_use=$(json stats "d['stats']['send_buffer_bytes'][0]")
log "IOC send buffers in use after: $in_use bytes"
pass "a host that does not read costs only itself"
