#!/usr/bin/env bash
# UDP at a moderate rate (iperf3 -u -b 50M -t 3) through sd0 in both directions: no datagram
# lost.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3 ss; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
port=5203
for dir in tx rx; do
    args=(-u -b 50M -t 3)
    [ "$dir" = rx ] && args+=(-R)
    iperf sd-host 10.50.0.2 "$port" "${args[@]}" >/dev/null || fail "iperf3 UDP $dir"
    sent=$(iperf_field "$port" "d['end']['sum']['packets']")
    lost=$(iperf_field "$port" "d['end']['sum']['lost_packets']")
    assert_ge "$sent" 1000 "UDP $dir: datagrams sent in 3 s at 50 Mb/s"
    assert_eq "$lost" 0 "UDP $dir: datagrams lost of $sent"
    log "UDP $dir: $sent datagrams at 50 Mb/s, 0 lost"
    port=$((port + 1))
done
pass "UDP 50 Mb/s both directions without loss"
