#!/usr/bin/env bash
# iperf3 TCP through sd0 in both directions (5 s each): both runs succeed and move data, and
# splitnet's own queues lose nothing on the way (the drops both daemons count, and the TCP
# retransmits iperf3 reports are printed). No throughput threshold here (the benchmark in
# bench/ measures that). Then a sparse UDP flow each way gets its credits back in batches,
# not an update per frame (counters).
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
# Credits go back in batches: a sparse flow of small frames (UDP, 1,000-byte datagrams at
# 20 Mb/s, a frame or two per wake-up) costs its sender a credit update per batch of frames
# (credit_batch 16), not one per frame, which would wake it for each (the build before sent
# one per idle point). Large frames go back at once (32 KiB of them would hold up a sender's
# byte limit), so TCP's 64 KiB frames are not counted here.
# rdma_and_updates SOCK: the frames a daemon wrote into its peer's pools, and the credit
# updates it sent.
rdma_and_updates() {
    ctl_json "$1" stats "'%d %d' % (d['stats']['fabric']['tx']['frames'] - d['stats']['tx_inline'] - d['stats'].get('tx_express', 0), d['stats']['credit_updates'])"
}
port=5203
for dir in up down; do
    read -r h_rdma0 h_upd0 <<<"$(rdma_and_updates "$T/host1.sock")"
    read -r i_rdma0 i_upd0 <<<"$(rdma_and_updates "$T/ioc.sock")"
    args=(-u -b 20M -l 1000 -t 3)
    [ "$dir" = down ] && args+=(-R)
    iperf sd-host 10.50.0.2 "$port" "${args[@]}" >/dev/null || fail "iperf3 UDP at 20 Mb/s ($dir)"
    read -r h_rdma h_upd <<<"$(rdma_and_updates "$T/host1.sock")"
    read -r i_rdma i_upd <<<"$(rdma_and_updates "$T/ioc.sock")"
    if [ "$dir" = up ]; then
        frames=$((h_rdma - h_rdma0)); updates=$((i_upd - i_upd0)); who="the IOC"
    else
        frames=$((i_rdma - i_rdma0)); updates=$((h_upd - h_upd0)); who="the host"
    fi
    log "UDP 20 Mb/s $dir: $frames frames written into $who's pools, $updates credit updates back"
    assert_ge "$frames" 5000 "frames written into $who's pools at 20 Mb/s ($dir)"
    assert_le "$((updates * 8))" "$((frames + 16))" "credit updates from $who (at most one per 8 frames) for $frames frames"
    port=$((port + 1))
done
log "host -> LAN ${tx} Gb/s ($(iperf_field 5201 "d['end']['sum_sent']['retransmits']") TCP retransmits), LAN -> host ${rx} Gb/s ($(iperf_field 5202 "d['end']['sum_sent']['retransmits']"))"
pass "iperf3 TCP both directions; a sparse flow's credits back in batches"
