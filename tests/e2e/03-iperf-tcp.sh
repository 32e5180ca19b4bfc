#!/usr/bin/env bash
# iperf3 TCP through sd0 in both directions (3 s each): both runs succeed and move data. No
# throughput threshold here (the benchmark in bench/ measures that).
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3 ss; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
tx=$(iperf sd-host 10.50.0.2 5201 -t 3) || fail "iperf3 host -> LAN: $tx"
assert_positive "$tx" "host -> LAN throughput (Gb/s)"
assert_ge "$(iperf_field 5201 "d['end']['sum_received']['bytes']")" 1 "bytes received by the LAN peer"
rx=$(iperf sd-host 10.50.0.2 5202 -t 3 -R) || fail "iperf3 LAN -> host: $rx"
assert_positive "$rx" "LAN -> host throughput (Gb/s)"
assert_ge "$(iperf_field 5202 "d['end']['sum_received']['bytes']")" 1 "bytes received by the host"
log "host -> LAN ${tx} Gb/s, LAN -> host ${rx} Gb/s"
pass "iperf3 TCP both directions"
