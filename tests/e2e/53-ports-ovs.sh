#!/usr/bin/env bash
# Ports mode on Open vSwitch (issue 44): the IOC's switch is an OVS bridge (userspace
# datapath) in sd-ioc holding the NIC lan0 as a trunk; the shipped hook (hooks/port-ovs)
# attaches each host's port with the host's VLAN as its tag. The LAN side is tagged: a second
# OVS in sd-lan trunks lan1 and gives VLAN 10 to peer sd-lan10 (10.50.0.10) and VLAN 20 to
# sd-lan20 (10.50.0.20), all in one subnet, so only the VLANs keep them apart.
# - host 1 (vlan = 10) reaches the VLAN 10 peer only (TCP too, offloads passed through OVS's
#   userspace TSO), host 2 (vlan = 20) the VLAN 20 peer
#   only, and never each other; the frames on the LAN's wire carry their tags;
# - the hook records the host in the Interface (splitnet-host, attached-mac) and sets
#   iface-id while the host's session is up, removed when it ends; a reload's change of a
#   host's VLAN moves the port's tag;
# - the hook warns (in the IOC's log) of a receive buffer too small for the userspace datapath;
# - an OpenFlow rule that drops ICMP from host 1's port stops exactly host 1's pings;
# - a reload that removes host 2's entry takes its port out of the bridge.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping python3 dumpcap tshark ovs-vsctl ovs-ofctl ovsdb-server ovs-vswitchd ovsdb-tool
need_daemons
CTL=$BIN/splitnetctl
OVS=$T/ovs-ioc
OVS_LAN=$T/ovs-lan
cat >"$T/hook" <<EOF
#!/bin/sh
echo "\$1 \$SPLITNET_PORT \$SPLITNET_HOST mac=\$SPLITNET_MAC vlan=\$SPLITNET_VLAN" >>"$T/hook.log"
exec "$ROOT/hooks/port-ovs" "\$@"
EOF
chmod 755 "$T/hook"
BASE_CONF=$IOC_CONF
vlan_conf() {
    python3 - "$BASE_CONF" "$1" "$T/hook" "$2" "$3" <<'PY' || fail "cannot write the ports-mode configuration"
import re, sys
src, dst, hook, vlan1, vlan2 = sys.argv[1:]
text = open(src).read()
text = re.sub(r'^interface = .*$', 'mode = "ports"\nport_hook = "%s"' % hook, text, count=1, flags=re.M)
entries = text.split("\n[[auth.hosts]]")
hosts = [e.replace("promiscuous = true", "vlan = %s" % v) for e, v in zip(entries[1:3], (vlan1, vlan2)) if v]
open(dst, "w").write("\n[[auth.hosts]]".join([entries[0]] + hosts) + "\n")
PY
}
vlan_conf "$T/ioc.toml" 10 20
grep -q '^vlan = 20' "$T/ioc.toml" || fail "no VLANs in $T/ioc.toml"
IOC_CONF=$T/ioc.toml
topo_up 2

# The LAN: lan1 a trunk of a second OVS, VLAN 10 and 20 to one peer each.
run ip -n sd-lan addr flush dev lan1
ovs_up sd-lan "$OVS_LAN" tso
run vsctl "$OVS_LAN" add-br brl -- set bridge brl datapath_type=netdev
run vsctl "$OVS_LAN" add-port brl lan1
for v in 10 20; do
    addns "sd-lan$v"
    run ip link add "v$v" netns sd-lan type veth peer name eth0 netns "sd-lan$v"
    run ip -n sd-lan link set "v$v" up
    run vsctl "$OVS_LAN" add-port brl "v$v" -- set Port "v$v" tag=$v
    run ip -n "sd-lan$v" addr add "10.50.0.$v/24" dev eth0
    run ip -n "sd-lan$v" link set eth0 up
done
# The IOC's switch: br0 with the NIC as a trunk; the hook adds the ports.
# With userspace TSO, as offloads pass through the ports (offload = true).
ovs_up sd-ioc "$OVS" tso
run vsctl "$OVS" add-br br0 -- set bridge br0 datapath_type=netdev
run vsctl "$OVS" add-port br0 lan0
run ip -n sd-ioc link set lan0 up
export SPLITNET_OVS_BRIDGE=br0 SPLITNET_OVS_DB=unix:$OVS/db.sock
start_ioc
in_bridge() { vsctl "$OVS" list-ports br0 | grep -qx "$1"; }
for p in sdp-host1 sdp-host2; do
    eventually 10 in_bridge "$p" || fail "$p not in br0 after the IOC started: $(cat "$T/hook.log" 2>/dev/null)"
done
iface() { vsctl "$OVS" --if-exists get Interface "$1" "external_ids:$2" 2>/dev/null | tr -d '"'; }
assert_eq "$(vsctl "$OVS" get Port sdp-host1 tag)" 10 "sdp-host1's tag"
assert_eq "$(vsctl "$OVS" get Port sdp-host2 tag)" 20 "sdp-host2's tag"
assert_eq "$(iface sdp-host1 splitnet-host)" host1 "sdp-host1's splitnet-host"
assert_eq "$(iface sdp-host1 iface-id)" "" "sdp-host1's iface-id before its host connects"
# The hook's word on the userspace datapath's receive buffer reaches the IOC's log.
hint="port hook: port-ovs: br0 is a userspace datapath and net.core.rmem_default"
if [ "$(cat /proc/sys/net/core/rmem_default)" -lt 4194304 ]; then
    eventually 5 grep -q "$hint" "$T/ioc.log" || fail "no rmem_default warning of the hook's in the IOC's log"
else
    assert_no_grep "$T/ioc.log" "$hint" "a rmem_default warning with rmem_default large enough"
fi

start_host 1; start_host 2
wait_carrier sd-host up 10; wait_carrier sd-host2 up 10
host1=$(link_mac sd-host sd0); host2=$(link_mac sd-host2 sd0)
has_id() { [ "$(iface "$1" iface-id)" = "$2" ]; }
eventually 10 has_id sdp-host1 host1 || fail "sdp-host1's iface-id with its host up: '$(iface sdp-host1 iface-id)'"
eventually 10 has_id sdp-host2 host2 || fail "sdp-host2's iface-id with its host up: '$(iface sdp-host2 iface-id)'"
assert_eq "$(iface sdp-host1 attached-mac)" "$host1" "sdp-host1's attached-mac"
assert_eq "$(iface sdp-host2 attached-mac)" "$host2" "sdp-host2's attached-mac"

# Each host its VLAN's peer, and nothing else; the wire between the switches tagged.
ip netns exec sd-lan dumpcap -q -i lan1 -a duration:8 -w "$T/lan.pcap" >"$T/dumpcap.out" 2>&1 &
cap=$!; PIDS+=("$cap")
sleep 1
ping_ok sd-host 10.50.0.10
ping_ok sd-host2 10.50.0.20
ping_ok sd-lan10 10.50.0.1
ping_fails sd-host 10.50.0.20
ping_fails sd-host2 10.50.0.10
ping_fails sd-host 10.50.0.3
ping_fails sd-host2 10.50.0.1
wait "$cap" || fail "dumpcap on lan1: $(cat "$T/dumpcap.out")"
tagged() { tshark -r "$T/lan.pcap" -Y "vlan.id == $1 && icmp && eth.src == $2" 2>/dev/null | wc -l; }
assert_ge "$(tagged 10 "$host1")" 3 "host 1's ICMP on the LAN tagged 10"
assert_ge "$(tagged 20 "$host2")" 3 "host 2's ICMP on the LAN tagged 20"
assert_eq "$(tshark -r "$T/lan.pcap" -Y "eth.src == $host1 && !vlan" 2>/dev/null | wc -l)" 0 \
    "host 1's frames on the LAN untagged"
log "VLAN 10 and 20: each host reaches its own VLAN's peer only; the LAN's frames tagged"
up=$(SERVER_NS=sd-lan10 iperf sd-host 10.50.0.10 5241 -t 2) || fail "host 1 -> VLAN 10 iperf3: $up"
assert_positive "$up" "host 1 -> VLAN 10 throughput"
down=$(SERVER_NS=sd-lan20 iperf sd-host2 10.50.0.20 5242 -t 2 -R) || fail "VLAN 20 -> host 2 iperf3: $down"
assert_positive "$down" "VLAN 20 -> host 2 throughput"
log "TCP through OVS (userspace TSO): host 1 -> VLAN 10 $up Gb/s, VLAN 20 -> host 2 $down Gb/s"

# An OpenFlow rule on host 1's port: its ICMP dropped, host 2's not.
run ofctl "$OVS" br0 add-flow "priority=100,in_port=sdp-host1,icmp,actions=drop"
ping_fails sd-host 10.50.0.10
ping_ok sd-host2 10.50.0.20
drops=$(ofctl "$OVS" br0 dump-flows "in_port=sdp-host1,icmp" | grep -o 'n_packets=[0-9]*' | cut -d= -f2)
assert_ge "${drops:-0}" 3 "ICMP frames the rule dropped"
run ofctl "$OVS" br0 del-flows "in_port=sdp-host1,icmp"
ping_ok sd-host 10.50.0.10
log "an OpenFlow drop of host 1's ICMP stopped host 1's pings only ($drops dropped)"

# A host's session that ends takes its iface-id; the next one sets it again.
stop_host 1
eventually 10 has_id sdp-host1 "" || fail "sdp-host1 kept iface-id '$(iface sdp-host1 iface-id)' with its host stopped"
assert_eq "$(iface sdp-host1 splitnet-host)" host1 "sdp-host1's splitnet-host with its host stopped"
start_host 1
wait_carrier sd-host up 10
eventually 10 has_id sdp-host1 host1 || fail "sdp-host1 has no iface-id with its host back"
ping_ok sd-host 10.50.0.10

# A reload: host 1 moves to VLAN 20, host 2's entry goes.
vlan_conf "$T/ioc.next" 20 ""
mv "$T/ioc.next" "$T/ioc.toml"
"$CTL" -s "$T/ioc.sock" reload >"$T/reload.out" 2>&1 || fail "reload: $(cat "$T/reload.out")"
tag_is() { [ "$(vsctl "$OVS" get Port sdp-host1 tag 2>/dev/null)" = "$1" ]; }
eventually 10 tag_is 20 || fail "sdp-host1's tag after the reload: $(vsctl "$OVS" get Port sdp-host1 tag)"
eventually 10 eval '! in_bridge sdp-host2' || fail "sdp-host2 still in br0 after its entry went"
ping_ok sd-host 10.50.0.20
ping_fails sd-host 10.50.0.10
assert_grep "$T/hook.log" "^remove sdp-host2 host2 " "the hook's remove of sdp-host2"
log "reload: host 1's port tagged 20 and reaching VLAN 20's peer; sdp-host2 left br0"
pass "ports on Open vSwitch"
