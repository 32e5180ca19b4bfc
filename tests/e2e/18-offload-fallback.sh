#!/usr/bin/env bash
# Offload negotiation falls back cleanly: a host with offload = false (plain frames, full
# checksums), and a NIC with every offload turned off (the kernel segments and checksums what
# the hosts send with virtio-net headers). TCP and UDP work both ways in each case.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3 ethtool; need_daemons
sed 's/^offload = true/offload = false/' "$HOST_CONF" >"$T/host-nooffload.toml"
grep -q "^offload = false" "$T/host-nooffload.toml" || fail "could not derive a no-offload config"

topo_up 1; start_ioc
HOST_CONF=$T/host-nooffload.toml start_host 1
wait_carrier sd-host up 10
grep -q "csum: false, tso: false" "$T/host1.log" || fail "TAP offloads not disabled: $(grep offloads "$T/host1.log")"
tx=$(iperf sd-host 10.50.0.2 5271 -t 2) || fail "no-offload host tx"
rx=$(iperf sd-host 10.50.0.2 5272 -t 2 -R) || fail "no-offload host rx"
iperf sd-host 10.50.0.2 5273 -u -b 20M -t 2 >/dev/null || fail "no-offload host udp"
log "host without offloads: tx $tx Gb/s, rx $rx Gb/s"
topo_down || fail "first topology not removed"

topo_up 1
ip netns exec sd-ioc ethtool -K lan0 tx off tso off gso off gro off sg off >/dev/null 2>&1 ||
    fail "ethtool could not turn lan0's offloads off"
ip netns exec sd-lan ethtool -K lan1 tx off tso off gso off gro off sg off >/dev/null 2>&1
start_ioc; start_host 1
wait_carrier sd-host up 10
tx=$(iperf sd-host 10.50.0.2 5274 -t 2) || fail "NIC without offloads: tx"
rx=$(iperf sd-host 10.50.0.2 5275 -t 2 -R) || fail "NIC without offloads: rx"
ping_ok sd-host 10.50.0.2 -s 1400
log "NIC without offloads: tx $tx Gb/s, rx $rx Gb/s"
topo_down || fail "second topology not removed"

# An IOC configured without offload pass-through (lan.offload = false) refuses the host's
# offload features; the host turns sd0's offloads off and sends plain frames.
sed 's/^offload = true/offload = false/' "$IOC_CONF" >"$T/ioc-nooffload.toml"
grep -q "^offload = false" "$T/ioc-nooffload.toml" || fail "could not derive a no-offload IOC config"
topo_up 1
IOC_CONF=$T/ioc-nooffload.toml start_ioc; start_host 1
wait_carrier sd-host up 10
eventually 3 grep -q "IOC does not take checksum/segmentation offloads" "$T/host1.log" ||
    fail "host did not fall back when the IOC refused offloads"
off=$(ip netns exec sd-host ethtool -k sd0 | awk '/^tcp-segmentation-offload:/{print $2}')
assert_eq "$off" off "sd0 TSO after the IOC refused offloads"
assert_eq "$(ctl_json "$T/ioc.sock" hosts "d['hosts']['hosts'][0]['offloads']")" \
    "['vnet_hdr']" "features the IOC agreed with the host"
tx=$(iperf sd-host 10.50.0.2 5276 -t 2) || fail "IOC without offloads: tx"
rx=$(iperf sd-host 10.50.0.2 5277 -t 2 -R) || fail "IOC without offloads: rx"
log "IOC without offload pass-through: tx $tx Gb/s, rx $rx Gb/s"
pass "offload fallback: host without offloads, NIC without offloads, IOC refusing offloads"
