#!/usr/bin/env bash
# The NIC's unicast filter holds the host's MAC (lan.promiscuous = "auto"), and both daemons
# follow their interfaces as the kernel reports them (rtnetlink): an MTU change
# of the IOC's NIC reaches sd0 (down, and back up while sd0 follows the NIC; an MTU a user chose
# below it stays), and sd0 taken as a port of a Linux bridge, which makes it promiscuous
# without any flag a user sets, makes the host promiscuous at the IOC (and leaving the bridge
# undoes it). Neither daemon falls back to polling.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping python3 bridge; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
assert_eq "$(sd0_mtu sd-host)" 1500 "sd0's MTU at start"
# lan.promiscuous = "auto": the host's MAC is in the NIC's unicast filter (the kernel lists it
# as a permanent "self" entry), and splitnetctl shows the device's promiscuity (veth cannot
# filter unicast: the kernel makes it promiscuous while the filter holds anything).
host1=$(link_mac sd-host sd0)
bridge -n sd-ioc fdb show dev lan0 | grep -qi "^$host1 .*self permanent" ||
    fail "host 1's MAC $host1 not in the NIC's unicast filter: $(bridge -n sd-ioc fdb show dev lan0 | tr '\n' ';')"
device=$(ip netns exec sd-ioc python3 -c "print(bool(int(open('/sys/class/net/lan0/flags').read(), 16) & 0x100))")
assert_eq "$(ctl_json "$T/ioc.sock" status "d['status']['interface']['promisc']")" "$device" "the NIC's promiscuity in splitnetctl status"
# wait_mtu WANT WHAT: until sd0's MTU is WANT (3 s).
mtu_is() { [ "$(sd0_mtu sd-host)" = "$1" ]; }
wait_mtu() { eventually 3 mtu_is "$1" || fail "$2: sd0's MTU is $(sd0_mtu sd-host), not $1"; }

run ip -n sd-ioc link set lan0 mtu 1400
wait_mtu 1400 "the NIC's MTU lowered to 1400"
ip netns exec sd-host ping -q -c 2 -i 0.2 -W 2 -M "do" -s 1372 10.50.0.2 >/dev/null ||
    fail "a 1400-byte packet (DF) at the new MTU"
ip netns exec sd-host ping -q -c 1 -W 1 -M "do" -s 1373 10.50.0.2 >/dev/null 2>&1 &&
    fail "a 1401-byte packet with DF left sd0 at MTU 1400"
run ip -n sd-ioc link set lan0 mtu 1500
wait_mtu 1500 "the NIC's MTU raised back to 1500 (sd0 follows the NIC)"
ping_ok sd-host 10.50.0.2 -M "do" -s 1472
assert_grep "$T/ioc.log" "NIC link change.*mtu=1400" "the IOC's log of the NIC's MTU change"

# An MTU a user chose below the NIC's stays when the NIC's grows.
run ip -n sd-host link set sd0 mtu 1300
eventually 3 grep -q "MTU changed on sd0; asking the IOC.*" "$T/host1.log" || fail "sd0's MTU change not asked of the IOC"
sleep 0.5
run ip -n sd-ioc link set lan0 mtu 1600
run ip -n sd-lan link set lan1 mtu 1600
eventually 3 grep -q "NIC link change.*mtu=1600" "$T/host1.log" || fail "the host was not told of MTU 1600"
assert_eq "$(sd0_mtu sd-host)" 1300 "sd0's MTU chosen by a user after the NIC's grew"
ping_ok sd-host 10.50.0.2 -M "do" -s 1272

# sd0 as a port of a bridge beside another: promiscuous by the kernel's count, so at the IOC
# too.
promisc() { ctl_json "$T/ioc.sock" hosts "d['hosts']['hosts'][0]['promisc']"; }
is_promisc() { [ "$(promisc)" = "$1" ]; }
assert_eq "$(promisc)" False "the host promiscuous at the IOC at start"
# (A bridge with one port keeps it out of promiscuous mode: a container's veth is the second.)
run ip -n sd-host link add br0 type bridge
run ip -n sd-host link add vc0 type veth peer name vc1
run ip -n sd-host link set vc0 master br0
run ip -n sd-host link set vc0 up
run ip -n sd-host link set br0 up
run ip -n sd-host link set sd0 master br0
eventually 3 is_promisc True || fail "sd0 in a bridge did not make the host promiscuous at the IOC"
run ip -n sd-host link set sd0 nomaster
eventually 3 is_promisc False || fail "sd0 out of the bridge left the host promiscuous at the IOC"
assert_grep "$T/host1.log" "promiscuous mode changed.*promisc=true" "host-driver's log of sd0's promiscuity"
assert_no_grep "$T/ioc.log" "through rtnetlink" "the IOC fell back to polling the NIC"
assert_no_grep "$T/host1.log" "through rtnetlink" "host-driver fell back to polling sd0"
pass "MTU and promiscuity follow the kernel's reports on both sides"
