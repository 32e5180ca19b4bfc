#!/usr/bin/env bash
# UDP at a moderate rate (iperf3 -u -b 50M -t 3) through sd0 in both directions: no datagram
# lost on the path. A datagram the receiving application's own socket buffer overflowed
# (the kernel's Udp RcvbufErrors in the receiver's namespace: iperf3 was not scheduled in
# time) is not a loss of the driver and is reported separately; everything else counts, and
# splitnet's own drop counters must stay at zero. Then a host the scheduler keeps off its
# cores for 10 ms every 100 ms (host-driver stopped and continued) loses nothing of a UDP
# download at 500 Mb/s (about 430 MTU-sized frames a stall; the build before small send
# buffers dropped 537 of them here) nor of a TCP one at 1 Gb/s in 4 flows: the IOC holds
# what arrives meanwhile (its share of send buffers, a small buffer per MTU-sized frame)
# until the host reads again. (UDP at 1 Gb/s of MTU-sized datagrams is beyond what this path forwards per
# frame on a 2-core machine even without stalls: README, "Send buffers".)
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

# stall PID: stops PID for 10 ms every 100 ms until killed.
stall() {
    trap - EXIT
    while kill -STOP "$1" 2>/dev/null; do
        sleep 0.01
        kill -CONT "$1"
        sleep 0.09
    done
}
# named_drops: splitnet's drops by cause, host and IOC, for the log.
named_drops() {
    local f=$1
    "$CTL" -s "$T/$f.sock" --json stats | python3 -c 'import json, sys; print(json.load(sys.stdin)["stats"].get("drops") or "none")'
}
for what in udp tcp; do
    stall "${HOST_PID[1]}" &
    staller=$!
    PIDS+=("$staller")
    buf0=$(rcvbuf_errors sd-host); drops0=$(drops)
    if [ "$what" = udp ]; then
        iperf sd-host 10.50.0.2 "$port" -u -b 500M -t 5 -w 8M -R >/dev/null || fail "iperf3 UDP at 500 Mb/s, host stalled"
    else
        rate=$(iperf sd-host 10.50.0.2 "$port" -P 4 -b 250M -t 5 -R) || fail "iperf3 TCP at 1 Gb/s (4 flows), host stalled"
    fi
    kill "$staller"; wait "$staller" 2>/dev/null; kill -CONT "${HOST_PID[1]}"
    log "drops by cause: host $(named_drops host1), IOC $(named_drops ioc)"
    if [ "$what" = udp ]; then
        sent=$(iperf_field "$port" "d['end']['sum']['packets']")
        lost=$(iperf_field "$port" "d['end']['sum']['lost_packets']")
        buf=$(($(rcvbuf_errors sd-host) - buf0))
        log "UDP rx at 500 Mb/s, host-driver stopped 10 ms every 100 ms: $sent datagrams, $lost lost ($buf overflowed the receiving socket's buffer)"
        assert_ge "$sent" 100000 "UDP rx: datagrams sent in 5 s at 500 Mb/s"
        assert_eq "$((lost - buf))" 0 "UDP rx at 500 Mb/s, host stalled: datagrams lost on the path of $sent"
    else
        log "TCP rx at 1 Gb/s in 4 flows, host-driver stopped 10 ms every 100 ms: $rate Gb/s"
    fi
    assert_eq "$(($(drops) - drops0))" 0 "$what rx, host stalled: frames dropped by splitnet"
    port=$((port + 1))
done
pass "UDP 50 Mb/s both directions, and UDP 500 Mb/s and TCP 1 Gb/s (4 flows) to a host stalled 10 ms at a time, without loss on the path"
