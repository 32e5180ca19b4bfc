#!/usr/bin/env bash
# UDP with 8000-byte datagrams (6 IP fragments each at MTU 1500) from the host to the LAN, at
# 300 Mb/s and 1 Gb/s, through kernel VXLAN (+ bridge, the peer of bench/) and through
# splitnet in the same run. Checks:
#  - every fragment splitnet lost is counted where it was lost and splitnetctl stats names
#    the place: sd0's queue to host-driver (TAP tx dropped), host-driver, the IOC, the NIC,
#    or the LAN receiver's kernel (no reassembly, socket buffer full: not splitnet's);
#  - at 300 Mb/s splitnet loses at most twice what VXLAN loses (with a floor of 0.2% of the
#    datagrams: one lost fragment loses a datagram, and a few are noise on a 2-core machine).
#    Datagrams the LAN receiver's socket had no room for arrived whole and are not a path's
#    loss: on one machine they measure how long the receiver waited for a CPU (the daemons
#    share it; on real machines they do not), so both paths' losses are taken without them.
# The 1 Gb/s ratio is printed; UDP_1G_BOUND=1 also asserts it. At 1 Gb/s both paths lose at the
# LAN receiver's socket while the CPUs are busy, and splitnet loses up to some 0.5% of its
# datagrams in host-driver's flow queue too (the daemons and iperf3 share 2 cores: the path is
# at capacity). The figure swings between runs: a timing, reported and not asserted by default.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss python3 iperf3; need_daemons
CTL=$BIN/splitnetctl
DUR=${UDP_SECONDS:-5}

# udp PORT RATE: iperf3 -u -l 8000 at RATE for DUR s from sd-host to sd-lan, then half a
# second for what is still on its way; prints "sent lost refused": datagrams sent, lost, and
# of those lost, refused whole by the LAN receiver's full socket.
udp() {
    local port=$1 rate=$2 buf0
    ip netns exec sd-lan timeout 60 iperf3 -s -1 -p "$port" >"$T/server.$port" 2>&1 &
    PIDS+=($!)
    wait_listen sd-lan "$port"
    buf0=$(lan_rcvbuf)
    # iperf3 warns on stdout that the datagram exceeds the MSS: keep the JSON only.
    timeout 60 ip netns exec sd-host iperf3 -c 10.50.0.2 -p "$port" -u -l 8000 -b "$rate" \
        -t "$DUR" -J 2>&1 | sed -n '/^{/,$p' >"$T/udp.$port.json"
    sleep 0.5
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d: sys.exit("iperf3: " + d["error"])
s = d["end"]["sum"]; print(s["packets"], s["lost_packets"], int(sys.argv[2]))' \
        "$T/udp.$port.json" "$(($(lan_rcvbuf) - buf0))" ||
        fail "iperf3 UDP at $rate: $(head -c 300 "$T/udp.$port.json")"
}
# pct LOST SENT
pct() { awk -v l="$1" -v s="$2" 'BEGIN { printf "%.2f", s ? 100 * l / s : 0 }'; }
# frames NS DEV FIELD: a kernel counter of DEV.
counter() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/$3"; }
# lan_rcvbuf: datagrams the LAN receiver's kernel reassembled but could not deliver, its
# socket buffer full (not a path's loss: see the top).
lan_rcvbuf() {
    ip netns exec sd-lan awk '/^Udp:/ { if (!h) { for (i = 1; i <= NF; i++) c[$i] = i; h = 1 } else print $c["RcvbufErrors"] }' /proc/net/snmp
}
# splitnet_counted: frames splitnet's stats say it dropped on the way to the LAN: sd0's queue
# (TAP tx dropped), host-driver's and the IOC's fabric drops, the NIC's tx drops and errors.
splitnet_counted() {
    local h i
    h=$("$CTL" -s "$T/host1.sock" --json stats) || fail "splitnetctl stats (host)"
    i=$("$CTL" -s "$T/ioc.sock" --json stats) || fail "splitnetctl stats (IOC)"
    python3 -c 'import json, sys
h, i = (json.loads(a)["stats"] for a in sys.argv[1:])
print(h["nic"]["tx"]["dropped"], h["fabric"]["tx"]["dropped"], i["fabric"]["rx"]["dropped"],
      i["nic"]["tx"]["dropped"] + i["nic"]["tx_errors"])' "$h" "$i"
}

# --- kernel VXLAN + bridge, as bench/ sets it up ---------------------------------------------
topo_up 1
run ip -n sd-host link add gt0 type vxlan id 42 local 10.200.0.1 remote 10.200.0.2 dstport 4789
run ip -n sd-host addr add 10.50.0.1/24 dev gt0
run ip -n sd-host link set gt0 up
run ip -n sd-ioc link add gt1 type vxlan id 42 local 10.200.0.2 remote 10.200.0.1 dstport 4789
run ip -n sd-ioc link add br0 type bridge
run ip -n sd-ioc link set gt1 master br0
run ip -n sd-ioc link set lan0 master br0
for d in gt1 br0 lan0; do run ip -n sd-ioc link set "$d" up; done
eventually 5 ip netns exec sd-host ping -q -c 1 -W 1 10.50.0.2 >/dev/null || fail "no ping through VXLAN"
declare -A VX
port=5501
for rate in 300M 1G; do
    read -r sent lost full < <(udp "$port" "$rate")
    VX[$rate]="$sent $((lost - full))"
    log "VXLAN    $rate: $lost of $sent datagrams lost ($(pct "$lost" "$sent")%); LAN socket buffer full $full datagrams"
    port=$((port + 1))
done
topo_down || fail "VXLAN topology not removed"

# --- splitnet -------------------------------------------------------------------------------
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
for rate in 300M 1G; do
    read -r q0 h0 i0 n0 < <(splitnet_counted)
    tap0=$(counter sd-host sd0 tx_packets); lan0=$(counter sd-lan lan1 rx_packets)
    read -r sent lost full < <(udp "$port" "$rate")
    read -r q1 h1 i1 n1 < <(splitnet_counted)
    tap1=$(counter sd-host sd0 tx_packets); lan1=$(counter sd-lan lan1 rx_packets)
    queue=$((q1 - q0)); host=$((h1 - h0)); ioc=$((i1 - i0)); nic=$((n1 - n0))
    # Frames sd0 took (tx_packets) or dropped at its queue, against frames lan1 received:
    # what splitnet lost on the way must all be counted.
    offered=$((tap1 - tap0 + queue)); arrived=$((lan1 - lan0))
    missing=$((offered - arrived)); counted=$((queue + host + ioc + nic))
    log "splitnet $rate: $lost of $sent datagrams lost ($(pct "$lost" "$sent")%); fragments: $offered offered to sd0, $arrived reached lan1; counted: sd0 queue $queue, host-driver $host, IOC $ioc, NIC $nic; LAN socket buffer full $full datagrams"
    # Non-UDP frames (ARP, ND) move both ways too: a handful of frames of slack.
    [ "$missing" -le $((counted + 20)) ] ||
        fail "$rate: $missing fragments lost between sd0 and the LAN, only $counted counted by splitnet"
    # Each path's own losses: the datagrams lost, less those the LAN receiver's socket refused.
    read -r vsent vlost <<<"${VX[$rate]}"
    own=$((lost - full))
    bound=$(awk -v vl="$vlost" -v vs="$vsent" -v s="$sent" 'BEGIN { b = 2 * vl / vs; if (b < 0.002) b = 0.002; printf "%d", b * s }')
    if [ "$rate" = 300M ] || [ "${UDP_1G_BOUND:-0}" = 1 ]; then
        assert_le "$own" "$bound" "$rate: datagrams splitnet lost before the LAN receiver's socket (VXLAN lost $vlost of $vsent in the same run)"
    fi
    log "$rate: datagrams lost before the LAN receiver's socket: splitnet $own, VXLAN $vlost; ratio $(awk -v a="$own" -v b="$sent" -v c="$vlost" -v d="$vsent" 'BEGIN { if (c <= 0) print "n/a (VXLAN lost none)"; else printf "%.1f", (a / b) / (c / d) }')"
    port=$((port + 1))
done
pass "UDP 8000-byte datagrams: every lost fragment counted where it was lost; 300 Mb/s within 2x of VXLAN"
