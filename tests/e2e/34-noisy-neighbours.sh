#!/usr/bin/env bash
# Noisy neighbours on one IOC worker (fabric.workers = 1, so every host shares one event loop
# and one packet socket): a well-behaved host (host 1) runs iperf3 to the LAN and pings while
# host 2 storms the IOC with SetMac requests, then SetMulticast requests, then broadcast
# frames (the rogue, `rogue noisy`), and while host 3 uploads with four streams at once (a
# bulk neighbour, served beside host 1 by deficit round robin). Asserted, from counters: the
# storms were cut to their rates (requests answered Busy, frames dropped as storm control),
# the noisy host's session stayed up, host 1's pings were all answered and no watchdog tick
# was withheld. Host 1's throughput during each storm is printed as a ratio of its solo run,
# and its share beside the bulk neighbour; timings never decide the test.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3; need_daemons; need_rogue
# The noisy host speaks the plain handshake of an admitted host (e2e 32 tests admission).
open_admission
sed -e 's/^workers = 0/workers = 1/' -e 's/^# listen = "127.0.0.1:9702"/listen = "127.0.0.1:9702"/' \
    "$IOC_CONF" >"$T/ioc.toml"
grep -q '^workers = 1' "$T/ioc.toml" || fail "could not set fabric.workers = 1"
grep -q '^listen = "127.0.0.1:9702"' "$T/ioc.toml" || fail "could not set the IOC's metrics listener"
IOC_CONF=$T/ioc.toml
# metric NAME: the sum of a metric's samples (every label set).
metric() {
    ip netns exec sd-ioc python3 -c "import sys, urllib.request as u
t = 0
for l in u.urlopen('http://127.0.0.1:9702/metrics', timeout=2).read().decode().splitlines():
    if l.split('{')[0].split(' ')[0] == sys.argv[1]: t += float(l.split()[-1])
print(int(t))" "$1"
}
# storm_drops: frames dropped by storm control, every host's.
storm_drops() {
    ip netns exec sd-ioc python3 -c "import urllib.request as u
t = 0
for l in u.urlopen('http://127.0.0.1:9702/metrics', timeout=2).read().decode().splitlines():
    if l.startswith('splitnet_ioc_host_dropped_by_cause_total{') and 'cause=\"tx_storm_control\"' in l: t += int(l.split()[-1])
print(t)"
}
ratio() { python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$1" "$2"; }

topo_up 3; start_ioc; start_host 1; start_host 3
wait_carrier sd-host up 10
wait_carrier sd-host3 up 10
ping_ok sd-host 10.50.0.2
ping_ok sd-host3 10.50.0.2
solo=$(iperf sd-host 10.50.0.2 5340 -t 4) || fail "iperf3 of host 1 alone"
log "host 1 alone: $solo Gb/s to the LAN"

port=5341
for storm in setmac setmulticast broadcast; do
    limited0=$(metric splitnet_ioc_cfg_rate_limited_total)
    storm0=$(storm_drops)
    ip netns exec sd-host2 "$ROGUE" noisy 10.200.0.2:7400 "$storm" 8 >"$T/$storm.out" 2>&1 &
    noisy=$!
    PIDS+=("$noisy")
    eventually 5 grep -q '^mac ' "$T/$storm.out" || fail "the noisy host did not connect: $(cat "$T/$storm.out")"
    sleep 1
    rate=$(iperf sd-host 10.50.0.2 "$port" -t 4) || fail "iperf3 of host 1 during the $storm storm"
    port=$((port + 1))
    PING_COUNT=10 ping_ok sd-host 10.50.0.2
    # Read while the noisy host is connected (its counters leave with its session).
    storm1=$(storm_drops)
    wait "$noisy" || fail "the $storm storm: $(cat "$T/$storm.out")"
    log "during the $storm storm: $(grep "^$storm:" "$T/$storm.out")"
    log "host 1: $rate Gb/s, $(ratio "$rate" "$solo")x its solo run"
    case $storm in
        setmac | setmulticast)
            busy=$(awk '/ busy /{for (i = 1; i < NF; i++) if ($i == "busy") print $(i + 1)}' "$T/$storm.out")
            assert_positive "${busy:-0}" "$storm requests answered Busy"
            assert_ge "$(metric splitnet_ioc_cfg_rate_limited_total)" $((limited0 + busy)) \
                "CfgUtil requests over the rate, counted"
            ;;
        broadcast)
            assert_positive "$((storm1 - storm0))" "broadcast frames dropped by storm control"
            ;;
    esac
done

# A bulk neighbour: host 3 uploads with four streams while host 1 uploads with one. The
# worker reads each host's frames in turn, a quantum of bytes each.
iperf sd-host3 10.50.0.2 5350 -t 7 -P 4 >"$T/bulk.rate" &
bulk=$!
sleep 1
rate=$(iperf sd-host 10.50.0.2 5351 -t 4) || fail "iperf3 of host 1 beside the bulk neighbour"
PING_COUNT=10 ping_ok sd-host 10.50.0.2
wait "$bulk" || fail "the bulk neighbour's iperf3"
log "beside a 4-stream neighbour ($(cat "$T/bulk.rate") Gb/s): host 1 $rate Gb/s, $(ratio "$rate" "$solo")x its solo run"

assert_eq "$(metric splitnet_ioc_watchdog_withheld_total)" 0 "watchdog ticks withheld during the storms"
assert_alive "$IOC_PID" "ioc-driver"
ping_ok sd-host 10.50.0.2
pass "storms cut to their rates and counted; the good host served throughout"
