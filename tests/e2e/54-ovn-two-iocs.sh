#!/usr/bin/env bash
# OVN across two IOCs (issue 44): hosts served by different IOCs in one logical network.
# An OVN central (northd, its two databases) in sd-ovn; IOC A in sd-ioc and IOC B in sd-ioc2,
# each with an Open vSwitch of its own (userspace datapath) and an ovn-controller, joined by
# Geneve over an underlay veth (10.70.0.1 and .2 on each OVS's br-phy, as OVN's
# documentation has it for the userspace datapath). Both IOCs run in ports mode with the
# shipped hook (hooks/port-ovs) on br-int, and both admit both hosts; host 1 connects to A,
# host 2 to B. One logical switch has a logical port per host, named after the host (the
# iface-id the hook sets).
# - each host's logical port is bound to the chassis of the IOC its session is on, and the
#   other IOC, which has the port too, never sets its iface-id;
# - host 1 and host 2 reach each other through the logical switch and the tunnel;
# - an OVN ACL that drops their ICMP stops their pings (and TCP still passes); removed, the
#   pings pass again;
# - host 1 moving to IOC B moves its binding to B's chassis.
. "$(dirname "$0")/../lib.sh"
need_root
need_tool ip ping python3 ovs-vsctl ovs-ofctl ovsdb-server ovs-vswitchd ovsdb-tool ovn-northd \
    ovn-controller ovn-nbctl ovn-sbctl
need_daemons
OVN=$T/ovn
MAC1=02:5d:00:00:01:01
MAC2=02:5d:00:00:02:02
cat >"$T/hook" <<EOF
#!/bin/sh
echo "\$1 \$SPLITNET_PORT \$SPLITNET_HOST mac=\$SPLITNET_MAC ovs=\$SPLITNET_OVS_DB" >>"$T/hook.log"
exec "$ROOT/hooks/port-ovs" "\$@"
EOF
chmod 755 "$T/hook"
python3 - "$IOC_CONF" "$T/ioc.toml" "$T/hook" "$MAC1" "$MAC2" <<'PY' || fail "cannot write the ports-mode configuration"
import re, sys
src, dst, hook, mac1, mac2 = sys.argv[1:]
text = open(src).read()
text = re.sub(r'^interface = .*$', 'mode = "ports"\nport_hook = "%s"' % hook, text, count=1, flags=re.M)
text = re.sub(r'^offload = true$', 'offload = false', text, count=1, flags=re.M)
entries = text.split("\n[[auth.hosts]]")
hosts = [e.replace("promiscuous = true", 'mac = "%s"' % m) for e, m in zip(entries[1:3], (mac1, mac2))]
open(dst, "w").write("\n[[auth.hosts]]".join([entries[0]] + hosts) + "\n")
PY
grep -q "^mac = \"$MAC2\"" "$T/ioc.toml" || fail "no host MACs in $T/ioc.toml"
IOC_CONF=$T/ioc.toml

# Namespaces: the central, two IOCs (each at fabric address 10.200.0.2 in its own namespace),
# a host on each, and the underlay between the IOCs.
for ns in sd-ovn sd-ioc sd-ioc2 sd-host sd-host2; do
    [ -e "/run/netns/$ns" ] && fail "namespace $ns already exists (ip netns del $ns)"
    addns "$ns"
done
# Host 1's fabric: fab0 to IOC A, and fab2 (down) to IOC B for the move at the end.
run ip link add fab0 netns sd-host type veth peer name fab1 netns sd-ioc
run ip -n sd-host addr add 10.200.0.1/24 dev fab0
run ip -n sd-host link set fab0 up
run ip -n sd-ioc addr add 10.200.0.2/24 dev fab1
run ip -n sd-ioc link set fab1 up
run ip -n sd-ioc2 link add fabbr type bridge
run ip -n sd-ioc2 addr add 10.200.0.2/24 dev fabbr
run ip -n sd-ioc2 link set fabbr up
run ip link add fab0 netns sd-host2 type veth peer name fabh2 netns sd-ioc2
run ip link add fab2 netns sd-host type veth peer name fabh1 netns sd-ioc2
run ip -n sd-host2 addr add "$(host_fab_ip 2)/24" dev fab0
run ip -n sd-host2 link set fab0 up
for p in fabh1 fabh2; do
    run ip -n sd-ioc2 link set "$p" master fabbr
    run ip -n sd-ioc2 link set "$p" up
done
run ip link add ul0 netns sd-ioc mtu 1600 type veth peer name ul0 netns sd-ioc2 mtu 1600

# The central: OVN's northbound and southbound databases and northd, on unix sockets.
mkdir -p "$OVN"
for db in nb sb; do
    run ovsdb-tool create "$OVN/$db.db" "/usr/share/ovn/ovn-$db.ovsschema"
    ip netns exec sd-ovn ovsdb-server "$OVN/$db.db" --remote=punix:"$OVN/$db.sock" \
        --pidfile="$OVN/$db.pid" --unixctl="$OVN/$db.ctl" --log-file="$OVN/$db.log" --detach \
        >>"$OVN/start.log" 2>&1 || fail "ovsdb-server ($db): $(tail -n 3 "$OVN/start.log")"
done
ip netns exec sd-ovn env OVN_RUNDIR="$OVN" ovn-northd --ovnnb-db=unix:"$OVN/nb.sock" \
    --ovnsb-db=unix:"$OVN/sb.sock" --pidfile="$OVN/northd.pid" --log-file="$OVN/northd.log" --detach \
    >>"$OVN/start.log" 2>&1 || fail "ovn-northd: $(tail -n 3 "$OVN/start.log")"
nbctl() { ovn-nbctl --timeout=10 --db=unix:"$OVN/nb.sock" "$@"; }
sbctl() { ovn-sbctl --timeout=10 --db=unix:"$OVN/sb.sock" "$@"; }
run nbctl ls-add ls0
run nbctl lsp-add ls0 host1 -- lsp-set-addresses host1 "$MAC1 10.50.0.1"
run nbctl lsp-add ls0 host2 -- lsp-set-addresses host2 "$MAC2 10.50.0.3"

# Each IOC's chassis: OVS with br-int (OVN's) and br-phy (the underlay's address, as the
# userspace datapath's tunnels need it), then ovn-controller.
chassis_up() {
    local ns=$1 d=$2 name=$3 ip=$4
    ovs_up "$ns" "$d"
    run vsctl "$d" add-br br-int -- set bridge br-int datapath_type=netdev fail-mode=secure \
        other-config:disable-in-band=true
    run vsctl "$d" add-br br-phy -- set bridge br-phy datapath_type=netdev
    run vsctl "$d" add-port br-phy ul0 -- set Interface br-phy mtu_request=1600
    run ip -n "$ns" link set ul0 up
    run ip -n "$ns" addr add "$ip/24" dev br-phy
    run ip -n "$ns" link set br-phy up
    run vsctl "$d" set Open_vSwitch . external_ids:system-id="$name" \
        external_ids:ovn-remote=unix:"$OVN/sb.sock" external_ids:ovn-encap-type=geneve \
        external_ids:ovn-encap-ip="$ip" external_ids:ovn-bridge-datapath-type=netdev
    ip netns exec "$ns" env OVN_RUNDIR="$d" OVS_RUNDIR="$d" ovn-controller unix:"$d/db.sock" --pidfile="$d/ovn-controller.pid" \
        --log-file="$d/ovn-controller.log" --detach >>"$d/start.log" 2>&1 ||
        fail "ovn-controller in $ns: $(tail -n 3 "$d/start.log")"
}
chassis_up sd-ioc "$T/ovs-a" chassis-a 10.70.0.1
chassis_up sd-ioc2 "$T/ovs-b" chassis-b 10.70.0.2
two_chassis() { [ "$(sbctl --bare --columns=name list Chassis | grep -c .)" = 2 ]; }
eventually 20 two_chassis || fail "OVN's southbound has not both chassis: $(sbctl show)"

# The IOCs: one in each chassis's namespace, with its OVS database for the hook.
start_ioc_in() {
    local ns=$1 d=$2 sock=$3 log=$4
    SPLITNET_OVS_BRIDGE=br-int SPLITNET_OVS_DB=unix:$d/db.sock ip netns exec "$ns" "$BIN/ioc-driver" \
        --config "$IOC_CONF" --control-socket "$sock" >>"$log" 2>&1 &
    PIDS+=($!)
    LAST_IOC=$!
    for _ in $(seq 100); do
        ip netns exec "$ns" ss -Hltn 'sport = :7400' 2>/dev/null | grep -q 7400 && return 0
        kill -0 "$LAST_IOC" 2>/dev/null || fail "ioc-driver in $ns exited at start: $(tail -n 5 "$log")"
        sleep 0.05
    done
    fail "ioc-driver in $ns is not listening after 5 s"
}
start_ioc_in sd-ioc "$T/ovs-a" "$T/ioc.sock" "$T/ioc.log"
start_ioc_in sd-ioc2 "$T/ovs-b" "$T/ioc2.sock" "$T/ioc2.log"
on_br_int() { vsctl "$1" list-ports br-int | grep -qx "$2"; }
for d in "$T/ovs-a" "$T/ovs-b"; do
    for p in sdp-host1 sdp-host2; do
        eventually 10 on_br_int "$d" "$p" || fail "$p not on $(basename "$d")'s br-int: $(cat "$T/hook.log")"
    done
done

start_host 1; start_host 2
wait_carrier sd-host up 10; wait_carrier sd-host2 up 10
assert_eq "$(link_mac sd-host sd0)" "$MAC1" "host 1's MAC"
iface() { vsctl "$1" --if-exists get Interface "$2" external_ids:iface-id 2>/dev/null | tr -d '"'; }
bound_to() {
    local uuid
    uuid=$(sbctl --bare --columns=chassis find Port_Binding logical_port="$1")
    [ -n "$uuid" ] && sbctl --bare --columns=name list Chassis "$uuid"
}
is_bound() { [ "$(bound_to "$1")" = "$2" ]; }
eventually 20 is_bound host1 chassis-a || fail "host1's logical port bound to '$(bound_to host1)', want chassis-a"
eventually 20 is_bound host2 chassis-b || fail "host2's logical port bound to '$(bound_to host2)', want chassis-b"
assert_eq "$(iface "$T/ovs-a" sdp-host1)" host1 "IOC A's sdp-host1 iface-id"
assert_eq "$(iface "$T/ovs-b" sdp-host1)" "" "IOC B's sdp-host1 iface-id (no session of host 1 there)"
assert_eq "$(iface "$T/ovs-b" sdp-host2)" host2 "IOC B's sdp-host2 iface-id"
assert_eq "$(iface "$T/ovs-a" sdp-host2)" "" "IOC A's sdp-host2 iface-id (no session of host 2 there)"
log "host1 bound to chassis-a, host2 to chassis-b; the other IOC's ports unbound"

# Through the logical switch and the tunnel.
eventually 10 ip netns exec sd-host ping -q -c 1 -W 1 10.50.0.3 >/dev/null 2>&1 ||
    fail "host 1 cannot reach host 2 through OVN: $(sbctl show)"
ping_ok sd-host 10.50.0.3
ping_ok sd-host2 10.50.0.1
SERVER_NS=sd-host2 iperf sd-host 10.50.0.3 5231 -t 2 >"$T/across" || fail "host 1 -> host 2 iperf3: $(cat "$T/across")"
across=$(cat "$T/across")
assert_positive "$across" "host 1 -> host 2 throughput through OVN"
geneve=$(vsctl "$T/ovs-a" --bare --columns=name find Interface type=geneve | head -n 1)
[ -n "$geneve" ] || fail "no Geneve port on IOC A's br-int"
log "host 1 <-> host 2 through OVN's logical switch and Geneve ($geneve): ping, TCP $across Gb/s"

# An ACL on the logical switch: ICMP between them dropped, TCP still passes.
run nbctl acl-add ls0 from-lport 1001 "icmp4" drop
dropping() { ! ip netns exec sd-host ping -q -c 1 -W 1 10.50.0.3 >/dev/null 2>&1; }
eventually 10 dropping || fail "host 1's pings still answered with the ACL in"
ping_fails sd-host 10.50.0.3
ping_fails sd-host2 10.50.0.1
SERVER_NS=sd-host2 iperf sd-host 10.50.0.3 5232 -t 1 >"$T/acl-tcp" || fail "TCP with the ICMP ACL: $(cat "$T/acl-tcp")"
run nbctl acl-del ls0 from-lport 1001 "icmp4"
eventually 10 ip netns exec sd-host ping -q -c 1 -W 1 10.50.0.3 >/dev/null 2>&1 ||
    fail "host 1's pings not answered with the ACL removed"
ping_ok sd-host 10.50.0.3
log "OVN ACL: ICMP dropped both ways while in (TCP passed), answered once removed"

# Host 1 moves to IOC B (its fabric address moved to the link to B): A's port gives up the
# iface-id as the session ends, B's takes it, and OVN binds host1 to chassis-b.
stop_host 1
unset_a() { [ -z "$(iface "$T/ovs-a" sdp-host1)" ]; }
eventually 10 unset_a || fail "IOC A kept sdp-host1's iface-id with host 1 gone"
run ip -n sd-host addr del 10.200.0.1/24 dev fab0
run ip -n sd-host link set fab0 down
run ip -n sd-host addr add 10.200.0.1/24 dev fab2
run ip -n sd-host link set fab2 up
start_host 1
wait_carrier sd-host up 10
eventually 20 is_bound host1 chassis-b || fail "host1's logical port bound to '$(bound_to host1)' after the move, want chassis-b"
assert_eq "$(iface "$T/ovs-b" sdp-host1)" host1 "IOC B's sdp-host1 iface-id after the move"
assert_eq "$(iface "$T/ovs-a" sdp-host1)" "" "IOC A's sdp-host1 iface-id after the move"
eventually 10 ip netns exec sd-host ping -q -c 1 -W 1 10.50.0.3 >/dev/null 2>&1 ||
    fail "host 1 on IOC B cannot reach host 2"
ping_ok sd-host 10.50.0.3
log "host 1 moved to IOC B: bound to chassis-b, reaching host 2 on the same chassis"
pass "OVN across two IOCs"
