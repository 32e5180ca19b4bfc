#!/usr/bin/env bash
# The NIC's mapped ring (lan.rx_ring = true, issue 43): the IOC reads the LAN through
# TPACKET_V2 rings. Pings (frames that fit a slot) come from the ring's slots, a download's
# GSO frames (too long for a slot) from the socket's queue, and no frame is cut, refused or
# lost on the way: the replies come back, the transfers move, the counters say which way
# each frame came.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3; need_daemons
sed 's/^rx_ring = false$/rx_ring = true/' "$IOC_CONF" >"$T/ioc-ring.toml"
grep -q '^rx_ring = true$' "$T/ioc-ring.toml" || fail "cannot give the IOC mapped rings"
sed -i 's/^# listen = "127.0.0.1:9702"/listen = "127.0.0.1:9702"/' "$T/ioc-ring.toml"
grep -q '^listen = "127.0.0.1:9702"' "$T/ioc-ring.toml" || fail "cannot open the IOC's metrics"
IOC_CONF=$T/ioc-ring.toml
# metric NAME: the IOC's counter NAME (its metrics endpoint).
metric() {
    ip netns exec sd-ioc python3 -c "import urllib.request as u
m = u.urlopen('http://127.0.0.1:9702/metrics', timeout=3).read().decode()
print(next(l.split()[1] for l in m.splitlines() if l.startswith('$1 ')))"
}
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10

ring0=$(metric splitnet_ioc_lan_rx_ring_total)
ip netns exec sd-host ping -c 20 -i 0.05 -W 2 -q 10.50.0.2 >"$T/ping.out" ||
    fail "pings through the ring: $(tail -n 2 "$T/ping.out")"
ring_took() { [ "$(metric splitnet_ioc_lan_rx_ring_total)" -ge "$1" ]; }
eventually 5 ring_took $((ring0 + 20)) ||
    fail "the pings' replies from the ring's slots: $(metric splitnet_ioc_lan_rx_ring_total) frames, want $((ring0 + 20))"
ip netns exec sd-host ping -6 -c 3 -i 0.2 -W 2 fd50::2 >/dev/null ||
    fail "IPv6 ping through the ring"

rx0=$(metric splitnet_ioc_lan_rx_frames_total)
ring0=$(metric splitnet_ioc_lan_rx_ring_total)
down=$(iperf sd-host 10.50.0.2 5301 -t 3 -R) || fail "download: $down"
assert_positive "$down" "download through the ring (Gb/s)"
up=$(iperf sd-host 10.50.0.2 5302 -t 3) || fail "upload: $up"
assert_positive "$up" "upload, its acknowledgements through the ring (Gb/s)"
rx=$(( $(metric splitnet_ioc_lan_rx_frames_total) - rx0 ))
ring=$(( $(metric splitnet_ioc_lan_rx_ring_total) - ring0 ))
log "LAN frames during the transfers: $rx, $ring of them from the ring's slots"
assert_ge "$ring" 1000 "frames of the upload's acknowledgements from the ring's slots"
assert_ge $((rx - ring)) 1000 "the download's GSO frames from the socket's queue"
assert_eq "$(metric splitnet_ioc_lan_rx_truncated_total)" 0 "frames cut by the read"
assert_eq "$(metric splitnet_ioc_lan_rx_bad_frame_total)" 0 "frames refused by the checks"
assert_eq "$(metric splitnet_ioc_lan_rx_unreadable_total)" 0 "frames the kernel could not hand over"
retr=$(iperf_field 5302 "d['end']['sum_sent'].get('retransmits', 0)")
log "upload retransmits: $retr; download $down Gb/s, upload $up Gb/s"
pass "the NIC's mapped ring"
