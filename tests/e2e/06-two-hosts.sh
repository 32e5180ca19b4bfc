#!/usr/bin/env bash
# Two hosts (sd-host and sd-host2, same host.toml) share one IOC through the fabric bridge:
# both reach the LAN peer and each other, also at the same time (concurrent iperf3 and pings).
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3 ss; need_daemons
topo_up 2; start_ioc; start_host 1; start_host 2
wait_carrier sd-host up 10; wait_carrier sd-host2 up 10
m1=$(link_mac sd-host sd0); m2=$(link_mac sd-host2 sd0)
assert_ne "$m1" "$m2" "the two hosts' sd0 MACs"
ping_ok sd-host 10.50.0.2
ping_ok sd-host2 10.50.0.2
ping_ok sd-host 10.50.0.3
ping_ok sd-host2 10.50.0.1
ping_ok sd-host2 fd50::1 -6
ping_ok sd-host fd50::3 -6
ping_ok sd-lan 10.50.0.3
# All at once: each host runs iperf3 to the LAN peer while the two ping each other.
iperf sd-host 10.50.0.2 5211 -t 3 >"$T/a.rate" & a=$!
iperf sd-host2 10.50.0.2 5212 -t 3 >"$T/b.rate" & b=$!
ip netns exec sd-host ping -q -c 10 -i 0.2 -W 2 10.50.0.3 >"$T/p1" 2>&1 & p1=$!
ip netns exec sd-host2 ping -q -c 10 -i 0.2 -W 2 10.50.0.1 >"$T/p2" 2>&1 & p2=$!
wait $a || fail "host 1's iperf3 to the LAN peer (concurrent)"
wait $b || fail "host 2's iperf3 to the LAN peer (concurrent)"
wait $p1 || fail "host 1 -> host 2 ping under load: $(tail -n 2 "$T/p1" | tr '\n' ' ')"
wait $p2 || fail "host 2 -> host 1 ping under load: $(tail -n 2 "$T/p2" | tr '\n' ' ')"
assert_positive "$(cat "$T/a.rate")" "host 1's throughput during the concurrent run"
assert_positive "$(cat "$T/b.rate")" "host 2's throughput during the concurrent run"
log "at once: host 1 $(cat "$T/a.rate") Gb/s and host 2 $(cat "$T/b.rate") Gb/s to the LAN peer; host <-> host pings all answered"
# Host to host TCP (hairpinned inside the IOC).
h=$(SERVER_NS=sd-host2 iperf sd-host 10.50.0.3 5213 -t 2) || fail "host 1 -> host 2 iperf3: $h"
assert_positive "$h" "host 1 -> host 2 throughput"
log "host 1 -> host 2: $h Gb/s"
pass "two hosts share the IOC"
