#!/usr/bin/env bash
# Two hosts share one IOC: both reach the LAN peer and each other at the same time.
. "$(dirname "$0")/../lib.sh"
need_root; need_tools ip ping iperf3 python3
topo_up 2; start_ioc; start_host 1; start_host 2
wait_carrier sd-host up 10 >/dev/null; wait_carrier sd-host2 up 10 >/dev/null
m1=$(ip -n sd-host -br link show sd0 | awk '{print $3}')
m2=$(ip -n sd-host2 -br link show sd0 | awk '{print $3}')
[ "$m1" != "$m2" ] || fail "both hosts got MAC $m1"
ping_ok sd-host 10.50.0.2
ping_ok sd-host2 10.50.0.2
ping_ok sd-host 10.50.0.3
ping_ok sd-host2 10.50.0.1
ping_ok sd-host2 fd50::1 -6
# Both at once: each host runs iperf3 to the LAN peer while pinging the other host.
iperf sd-host 10.50.0.2 5211 -t 3 >"$T/a.rate" & a=$!
iperf sd-host2 10.50.0.2 5212 -t 3 >"$T/b.rate" & b=$!
ip netns exec sd-host ping -q -c 10 -i 0.2 10.50.0.3 >"$T/p1" 2>&1 & p1=$!
ip netns exec sd-host2 ping -q -c 10 -i 0.2 10.50.0.1 >"$T/p2" 2>&1 & p2=$!
wait $a || fail "host 1 iperf3"; wait $b || fail "host 2 iperf3"
wait $p1 || fail "host1 -> host2 ping during load: $(tail -n 2 "$T/p1")"
wait $p2 || fail "host2 -> host1 ping during load: $(tail -n 2 "$T/p2")"
log "host1 $(cat "$T/a.rate") Gb/s, host2 $(cat "$T/b.rate") Gb/s at once; host-to-host pings ok"
# Host to host TCP through the IOC's hairpin.
SERVER_NS=sd-host2 iperf sd-host 10.50.0.3 5213 -t 2 >"$T/h.rate" || fail "host-to-host iperf3"
log "host1 -> host2 $(cat "$T/h.rate") Gb/s"
pass "two hosts share the IOC"
