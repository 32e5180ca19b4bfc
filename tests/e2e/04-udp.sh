#!/usr/bin/env bash
# UDP at a moderate rate (iperf3 -u -b 50M -t 3) through sd0 in both directions: no datagram
# lost on the path. A datagram the receiving application's own socket buffer overflowed
# (the kernel's Udp RcvbufErrors in the receiver's namespace: iperf3 was not scheduled in
# time) is not a loss of the driver and is reported separately; everything else counts, and
# splitnet's own drop counters must stay at zero.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3 ss; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
CTL=$BIN/splitnetctl

# rcvbuf_errors NS: the kernel's count of UDP datagrams dropped for a full socket buffer.
rcvbuf_errors() {
    ip netns exec "$1" awk '/^Udp:/ { if (!h) { for (i = 1; i <= NF; i++) c[$i] = i; h = 1 } else print $c["RcvbufErrors"] }' /proc/net/snmp
}
# drops: frames splitnet dropped anywhere (host in and out, IOC towards the host and from it).
drops() {
    local h i
    h=$("$CTL" -s "$T/host1.sock" --json stats) || fail "splitnetctl stats (host)"
    i=$("$CTL" -s "$T/ioc.sock" --json stats) || fail "splitnetctl stats (IOC)"
    python3 -c 'import json, sys
h, i = (json.loads(a)["stats"]["fabric"] for a in sys.argv[1:])
print(sum(d[k]["dropped"] for d in (h, i) for k in ("tx", "rx")))' "$h" "$i"
}

port=5203
for dir in tx rx; do
    args=(-u -b 50M -t 3 -w 1M)
    receiver=sd-lan
    [ "$dir" = rx ] && { args+=(-R); receiver=sd-host; }
    buf0=$(rcvbuf_errors "$receiver"); drops0=$(drops)
    iperf sd-host 10.50.0.2 "$port" "${args[@]}" >/dev/null || fail "iperf3 UDP $dir"
    sent=$(iperf_field "$port" "d['end']['sum']['packets']")
    lost=$(iperf_field "$port" "d['end']['sum']['lost_packets']")
    buf=$(($(rcvbuf_errors "$receiver") - buf0))
    assert_ge "$sent" 1000 "UDP $dir: datagrams sent in 3 s at 50 Mb/s"
    assert_eq "$(($(drops) - drops0))" 0 "UDP $dir: frames dropped by splitnet"
    assert_eq "$((lost - buf))" 0 "UDP $dir: datagrams lost on the path of $sent ($lost lost, $buf of them in the receiver's socket buffer)"
    log "UDP $dir: $sent datagrams at 50 Mb/s, $lost lost ($buf overflowed the receiving socket's buffer)"
    port=$((port + 1))
done
pass "UDP 50 Mb/s both directions without loss on the path"
