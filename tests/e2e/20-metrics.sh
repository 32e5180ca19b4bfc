#!/usr/bin/env bash
# The opt-in metrics endpoint of both daemons: Prometheus text with live counters.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping python3; need_daemons
sed 's/^# listen = "127.0.0.1:9701"/listen = "127.0.0.1:9701"/' "$HOST_CONF" >"$T/host.toml"
sed 's/^# listen = "127.0.0.1:9702"/listen = "127.0.0.1:9702"/' "$IOC_CONF" >"$T/ioc.toml"
HOST_CONF=$T/host.toml IOC_CONF=$T/ioc.toml
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
get() { ip netns exec "$1" python3 -c "import sys, urllib.request as u
try: print(u.urlopen('http://127.0.0.1:$2$3', timeout=3).read().decode(), end='')
except Exception as e: print('ERR', e); sys.exit(1)"; }
sleep 0.3
h=$(get sd-host 9701 /metrics) || fail "host metrics: $h"
i=$(get sd-ioc 9702 /metrics) || fail "IOC metrics: $i"
val() { echo "$1" | awk -v k="$2" '$1 == k {print $2}'; }
[ "$(val "$h" splitnet_host_fabric_up)" = 1 ] || fail "host fabric_up: $(echo "$h" | grep fabric_up)"
[ "$(val "$h" splitnet_host_carrier)" = 1 ] || fail "host carrier"
[ "$(val "$h" splitnet_host_tx_frames_total)" -ge 3 ] || fail "host tx frames: $(val "$h" splitnet_host_tx_frames_total)"
[ "$(val "$h" splitnet_host_tx_limit_bytes)" -gt 0 ] || fail "host tx byte limit: $(echo "$h" | grep tx_limit_bytes)"
[ "$(val "$i" splitnet_ioc_hosts)" = 1 ] || fail "IOC hosts"
[ "$(val "$i" splitnet_ioc_lan_rx_frames_total)" -ge 3 ] || fail "IOC lan rx"
echo "$i" | grep -q '^splitnet_ioc_host_tx_frames_total{session="1",mac="02:5d:' || fail "per-host counters missing"
echo "$i" | grep -q '^# TYPE splitnet_ioc_protection_errors_total counter' || fail "type lines missing"
get sd-host 9701 /other 2>/dev/null | grep -q "ERR HTTP Error 404" || fail "other paths are not 404"
log "host: tx $(val "$h" splitnet_host_tx_frames_total) frames, credits free $(val "$h" splitnet_host_credits_free); IOC: lan rx $(val "$i" splitnet_ioc_lan_rx_frames_total)"
# The IOC's receive ring overflows while the IOC is stopped: the kernel's drops are counted.
[ "$(val "$i" splitnet_ioc_lan_rx_dropped_total)" = 0 ] || fail "receive drops before the burst"
# Stopped only while the burst is sent (well within the hosts' keepalive timeout).
ip netns exec sd-lan python3 -c "import os, signal, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
os.kill($IOC_PID, signal.SIGSTOP)
try:
    for _ in range(12000): s.sendto(b'x' * 1400, ('10.50.0.1', 9))
finally:
    os.kill($IOC_PID, signal.SIGCONT)"
sleep 0.5
i=$(get sd-ioc 9702 /metrics) || fail "IOC metrics: $i"
dropped=$(val "$i" splitnet_ioc_lan_rx_dropped_total)
log "a burst of 12000 frames at a stopped IOC: $dropped dropped by its receive ring"
[ "$dropped" -gt 0 ] || fail "no receive drops counted after the burst"
[ "$dropped" -lt 12000 ] || fail "every frame of the burst dropped: the ring held none"
# The fanout group's program sent the burst (unicast to host 1's MAC) to host 1's worker's
# receive queues, whichever worker that is: next to none crossed from another worker.
crossed=$(val "$i" splitnet_ioc_worker_crossed_total)
log "frames handed from one worker to another: $crossed"
assert_le "$crossed" 120 "frames of the burst that reached another worker's socket (1%)"
assert_no_grep "$T/host1.log" "fabric lost" "the host's session through the burst"
ping_ok sd-host 10.50.0.2
pass "metrics endpoints"
