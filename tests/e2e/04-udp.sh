#!/usr/bin/env bash
# UDP at a moderate rate (50 Mb/s) through sd0 in both directions, no datagram lost.
. "$(dirname "$0")/../lib.sh"
need_root; need_tools ip iperf3 python3
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10 >/dev/null
for dir in "" "-R"; do
    iperf sd-host 10.50.0.2 5203 -u -b 50M -t 3 $dir >/dev/null || fail "udp $dir"
    lost=$(python3 -c "import json; d=json.load(open('$T/iperf.5203.json')); print(d['end']['sum']['lost_packets'], d['end']['sum']['packets'])")
    set -- $lost
    [ "$1" = 0 ] || fail "UDP ${dir:-tx}: $1 of $2 datagrams lost"
    [ "$2" -gt 1000 ] || fail "UDP ${dir:-tx}: only $2 datagrams sent"
    log "UDP ${dir:-tx}: $2 datagrams, 0 lost"
done
pass "UDP 50 Mb/s both directions without loss"
