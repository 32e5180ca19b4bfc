#!/usr/bin/env bash
# Two hosts and lan.promiscuous = "auto": both hosts' MACs and host 1's bridged machine's are
# in the NIC's unicast filter, and the status shows the NIC's flags.
# A promiscuous host snooping (its policy lets it be promiscuous): host 2 turns sd0 promiscuous
# and captures on it while the LAN talks to host 1, to host 1's bridged machine (a MAC in host
# 1's extra_macs) and to the IOC machine's own NIC address, and sends frames to a MAC no one
# owns. Host 2 sees the frames for no one (promiscuous works) and none of the others; host 1's
# traffic and pings go on.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping python3 dumpcap bridge; need_daemons
BRIDGED=02:aa:00:00:00:01
NOBODY=02:99:99:99:99:99
python3 - "$IOC_CONF" "$T/ioc.toml" "$BRIDGED" <<'PY' || fail "cannot write the hosts' policy"
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r'^name = "host1"$', 'name = "host1"\nextra_macs = ["%s"]' % sys.argv[3], text, count=1, flags=re.M)
open(sys.argv[2], "w").write(text)
PY
grep -q "^extra_macs = \[\"$BRIDGED\"\]" "$T/ioc.toml" || fail "no extra_macs for host1 in $T/ioc.toml"
IOC_CONF=$T/ioc.toml
topo_up 2; start_ioc; start_host 1; start_host 2
wait_carrier sd-host up 10
wait_carrier sd-host2 up 10
ping_ok sd-host 10.50.0.2
host1=$(link_mac sd-host sd0)
host2=$(link_mac sd-host2 sd0)
nic=$(link_mac sd-ioc lan0)
# lan.promiscuous = "auto" with two hosts: the NIC's unicast filter holds both hosts' MACs and
# host 1's bridged machine's (the kernel lists them as permanent "self" entries), and
# splitnetctl shows the device's promiscuity as its flags say.
for m in "$host1" "$host2" "$BRIDGED"; do
    bridge -n sd-ioc fdb show dev lan0 | grep -qi "^$m .*self permanent" ||
        fail "$m not in the NIC's unicast filter: $(bridge -n sd-ioc fdb show dev lan0 | tr '\n' ';')"
done
nic_promisc() { ip netns exec sd-ioc python3 -c "print(bool(int(open('/sys/class/net/lan0/flags').read(), 16) & 0x100))"; }
assert_eq "$(ctl_json "$T/ioc.sock" status "d['status']['interface']['promisc']")" "$(nic_promisc)" \
    "the NIC's promiscuity in splitnetctl status, two hosts"
run ip -n sd-host2 link set sd0 promisc on
promisc2() { ctl_json "$T/ioc.sock" hosts "[h['promisc'] for h in d['hosts']['hosts'] if h['name'] == 'host2'][0]"; }
is_promisc2() { [ "$(promisc2)" = True ]; }
eventually 5 is_promisc2 || fail "host 2 not promiscuous at the IOC (its policy allows it)"

ip netns exec sd-host2 dumpcap -q -i sd0 -a duration:8 -w "$T/snoop.pcap" >"$T/dumpcap.out" 2>&1 &
cap=$!
PIDS+=("$cap")
sleep 1
# Unicast from the LAN to: host 1 (its pings' replies), its bridged machine, the IOC
# machine's NIC, and nobody. Static neighbours make the LAN peer address each MAC.
run ip -n sd-lan neigh replace 10.50.0.201 lladdr "$BRIDGED" dev lan1 nud permanent
run ip -n sd-lan neigh replace 10.50.0.202 lladdr "$nic" dev lan1 nud permanent
run ip -n sd-lan neigh replace 10.50.0.203 lladdr "$NOBODY" dev lan1 nud permanent
PING_COUNT=10 ping_ok sd-host 10.50.0.2
for a in 10.50.0.201 10.50.0.202 10.50.0.203; do
    ip netns exec sd-lan ping -q -c 10 -i 0.05 -W 1 "$a" >/dev/null 2>&1
done
wait "$cap" || fail "dumpcap on host 2's sd0: $(cat "$T/dumpcap.out")"
# count MAC: frames in the capture addressed to MAC.
count() { pcap_count "$T/snoop.pcap" "$1"; }
to_nobody=$(count "$NOBODY")
to_host1=$(count "$host1")
to_bridged=$(count "$BRIDGED")
to_nic=$(count "$nic")
log "host 2 captured: $to_nobody frames for nobody, $to_host1 for host 1, $to_bridged for its bridged MAC, $to_nic for the IOC's NIC"
assert_positive "$to_nobody" "frames for no one reaching the promiscuous host (the capture works)"
assert_eq "$to_host1" 0 "frames for host 1 seen by the promiscuous host"
assert_eq "$to_bridged" 0 "frames for host 1's bridged machine seen by the promiscuous host"
assert_eq "$to_nic" 0 "frames for the IOC machine's NIC seen by the promiscuous host"
ping_ok sd-host 10.50.0.2
pass "a promiscuous host sees the LAN's frames for no one, never another host's, its bridged machines' or the IOC's"
