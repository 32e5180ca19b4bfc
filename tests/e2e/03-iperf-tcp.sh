#!/usr/bin/env bash
# iperf3 TCP through sd0 in both directions (5 s each): both runs succeed and move data, and
# splitnet's own queues lose nothing on the way (the drops both daemons count, and the TCP
# retransmits iperf3 reports are printed). No throughput threshold here (the benchmark in
# bench/ measures that).
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3 ss; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
# own_drops: frames the host and the IOC dropped in their own queues (the host's flow queue,
# the IOC's ring and quota for the host, and the NIC's receive ring), by cause.
own_drops() {
    local h i
    h=$(ctl_json "$T/host1.sock" stats "sorted((k, v) for k, v in d['stats'].get('drops', {}).items() if k.startswith('tx_flow'))")
    i=$(ctl_json "$T/ioc.sock" stats "sorted((k, v) for k, v in d['stats'].get('drops', {}).items() if k in ('rx_ring_full', 'rx_quota', 'lan_rx_ring_full', 'worker_inbox_full'))")
    echo "host $h, IOC $i"
}
tx=$(iperf sd-host 10.50.0.2 5201 -t 5) || fail "iperf3 host -> LAN: $tx"
assert_positive "$tx" "host -> LAN throughput (Gb/s)"
assert_ge "$(iperf_field 5201 "d['end']['sum_received']['bytes']")" 1 "bytes received by the LAN peer"
assert_eq "$(own_drops)" "host [], IOC []" "frames dropped in splitnet's queues during the upload"
rx=$(iperf sd-host 10.50.0.2 5202 -t 5 -R) || fail "iperf3 LAN -> host: $rx"
assert_positive "$rx" "LAN -> host throughput (Gb/s)"
assert_ge "$(iperf_field 5202 "d['end']['sum_received']['bytes']")" 1 "bytes received by the host"
assert_eq "$(own_drops)" "host [], IOC []" "frames dropped in splitnet's queues during the download"
log "host -> LAN ${tx} Gb/s ($(iperf_field 5201 "d['end']['sum_sent']['retransmits']") TCP retransmits), LAN -> host ${rx} Gb/s ($(iperf_field 5202 "d['end']['sum_sent']['retransmits']"))"
pass "iperf3 TCP both directions"
