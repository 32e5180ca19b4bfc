#!/usr/bin/env bash
# Machines bridged behind a host (containers or VMs, the common case for a NIC): sd0 is a port
# of a Linux bridge in the host's namespace, beside a veth to a "container" namespace. Host 1's
# policy lists its container's MAC ([[auth.hosts]] extra_macs): the container reaches the LAN
# (ping, iperf3 both ways) with no promiscuous mode at the IOC, since its MAC is in the IOC's
# forwarding table. Host 2's policy lists nothing: its container's frames are dropped as
# spoofed and counted, and nothing comes back to it. Neither host may be promiscuous here, and
# host 2 may not send as host 1's container.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3; need_daemons
CTR1=02:aa:00:00:00:01
CTR2=02:bb:00:00:00:02
# Host 1's entry gets its container's MAC; no host may be promiscuous in this test.
python3 - "$IOC_CONF" "$T/ioc.toml" "$CTR1" <<'PY' || fail "cannot write the hosts' policy"
import re, sys
text = open(sys.argv[1]).read().replace("\npromiscuous = true\n", "\n")
text = re.sub(r'^name = "host1"$', 'name = "host1"\nextra_macs = ["%s"]' % sys.argv[3], text, count=1, flags=re.M)
open(sys.argv[2], "w").write(text)
PY
grep -q "^extra_macs = \[\"$CTR1\"\]" "$T/ioc.toml" || fail "no extra_macs for host1 in $T/ioc.toml"
IOC_CONF=$T/ioc.toml
topo_up 2
start_ioc
NO_ADDR=1 start_host 1
NO_ADDR=1 start_host 2

# bridge K MAC ADDR: br0 in host K's namespace with sd0 and a veth to namespace sd-ctrK, whose
# end ctr0 has MAC and ADDR/24.
bridge() {
    local ns ctr=sd-ctr$1
    ns=$(host_ns "$1")
    addns "$ctr"
    run ip -n "$ns" link add br0 type bridge
    run ip -n "$ns" link set sd0 master br0
    run ip -n "$ns" link add vctr type veth peer name ctr0 netns "$ctr"
    run ip -n "$ns" link set vctr master br0
    run ip -n "$ns" link set vctr up
    run ip -n "$ns" link set br0 up
    run ip -n "$ctr" link set ctr0 address "$2"
    run ip -n "$ctr" addr add "$3/24" dev ctr0
    run ip -n "$ctr" link set ctr0 up
}
bridge 1 "$CTR1" 10.50.0.101
bridge 2 "$CTR2" 10.50.0.102
wait_carrier sd-host up 10
wait_carrier sd-host2 up 10
json() { ctl_json "$T/ioc.sock" "$@"; }

eventually 5 ip netns exec sd-ctr1 ping -q -c 1 -W 1 10.50.0.2 >/dev/null ||
    fail "host 1's container cannot reach the LAN peer"
ip netns exec sd-ctr1 ping -q -c 20 -i 0.05 -W 1 10.50.0.2 >"$T/ping1" || fail "pings from host 1's container: $(tail -n 2 "$T/ping1")"
log "host 1's container: $(grep -E 'packets' "$T/ping1")"
up=$(SERVER_NS=sd-lan iperf sd-ctr1 10.50.0.2 5201 -t 2)
down=$(SERVER_NS=sd-lan iperf sd-ctr1 10.50.0.2 5202 -t 2 -R)
assert_positive "$up" "iperf3 from host 1's container (Gb/s)"
assert_positive "$down" "iperf3 to host 1's container (Gb/s)"
log "host 1's container: iperf3 $up Gb/s up, $down Gb/s down"
assert_eq "$(ip -n sd-lan neigh show 10.50.0.101 | awk '{print $5}')" "$CTR1" "the LAN peer's neighbour entry of the container"

# The IOC is not promiscuous for anyone: host 1 may not turn it on (its policy), and the
# container's frames reached it through the forwarding table.
promisc_of() { json hosts "[h['promisc'] for h in d['hosts']['hosts'] if h['name'] == 'host$1'][0]"; }
assert_eq "$(promisc_of 1)" False "host 1 promiscuous at the IOC"
run ip -n sd-host link set sd0 promisc on
sleep 0.5
assert_eq "$(promisc_of 1)" False "host 1 promiscuous at the IOC after asking (its policy forbids it)"
run ip -n sd-host link set sd0 promisc off

# Host 2's container is not in its policy: nothing gets through, and the IOC counts it.
drops2() { json hosts "[h.get('drops', {}).get('tx_spoofed_source', 0) for h in d['hosts']['hosts'] if h['name'] == 'host2'][0]"; }
before=$(drops2)
ip netns exec sd-ctr2 ping -q -c 5 -i 0.1 -W 1 10.50.0.2 >"$T/ping2" && fail "host 2's container reached the LAN without a policy"
log "host 2's container: $(grep -E 'packets' "$T/ping2")"
assert_ge "$(( $(drops2) - before ))" 1 "host 2's frames (ARP requests) dropped as spoofed"
# Nor may host 2 send as host 1's container: the same pings from CTR1's MAC.
ip -n sd-ctr2 link set ctr0 address "$CTR1"
before=$(drops2)
ip netns exec sd-ctr2 ping -q -c 3 -i 0.1 -W 1 10.50.0.2 >/dev/null && fail "host 2 sent as host 1's container"
assert_ge "$(( $(drops2) - before ))" 1 "host 2's frames from host 1's container MAC dropped"
ip netns exec sd-ctr1 ping -q -c 3 -i 0.1 -W 1 10.50.0.2 >/dev/null || fail "host 1's container after host 2's attempts"
pass "a host bridges the machines its policy lists, and only those"
