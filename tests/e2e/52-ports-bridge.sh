#!/usr/bin/env bash
# Ports mode on a Linux bridge (issue 44): lan.mode = "ports" gives each admitted host a port
# on the IOC's machine (sdp-host1, sdp-host2: persistent TAPs with MAC fe:ff:ff:ff:ff:ff) in
# bridge br0, which holds the NIC; the IOC opens no NIC of its own.
# - the ports exist before any host connects, without carrier; a port has carrier while its
#   host's session is up; splitnetctl hosts names each host's port;
# - both hosts reach the LAN peer (IPv4, IPv6) and each other (through the bridge), and carry
#   TCP both ways;
# - host 2, not promiscuous, never receives frames the bridge floods for a MAC no one has, nor
#   the frames for host 1 (its capture holds none; the IOC counts what it filtered), while
#   host 1 receives its own;
# - the port hook runs with the port, host, MAC and MTU in its environment: add for every
#   port, up when a host's session takes it (with the MAC it has), change when the host sets
#   its MTU, down when the session leaves it, remove when its entry goes;
# - the port's MTU, set on the switch's side, reaches the host's sd0 (down and up);
# - the ports survive an IOC restart (no carrier meanwhile) and serve the hosts after it;
# - a reload that removes host 2's entry ends its session and removes its port from the
#   bridge and the machine; host 1 goes on.
# - a reload that renames host 1's port ends its session (the hook's down on the old port,
#   then remove) and the host comes back on the new one, in the bridge.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3 dumpcap tshark bridge; need_daemons
CTL=$BIN/splitnetctl
NOBODY=02:99:99:99:99:99
cat >"$T/hook" <<EOF
#!/bin/sh
echo "\$1 \$SPLITNET_PORT \$SPLITNET_HOST mac=\$SPLITNET_MAC mtu=\$SPLITNET_MTU bridge=\$SPLITNET_BRIDGE" >>"$T/hook.log"
EOF
chmod 755 "$T/hook"
python3 - "$IOC_CONF" "$T/ioc.toml" "$T/hook" <<'PY' || fail "cannot write the ports-mode configuration"
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r'^interface = .*$', 'mode = "ports"\nbridge = "br0"\nport_hook = "%s"' % sys.argv[3],
              text, count=1, flags=re.M)
# Two hosts: the other entries would be ports too.
entries = text.split("\n[[auth.hosts]]")
text = "\n[[auth.hosts]]".join(entries[:3]) + "\n"
open(sys.argv[2], "w").write(text)
PY
grep -q '^mode = "ports"' "$T/ioc.toml" || fail "no lan.mode in $T/ioc.toml"
IOC_CONF=$T/ioc.toml
topo_up 2
# The switch: br0 holds the NIC.
run ip -n sd-ioc link add br0 type bridge
run ip -n sd-ioc link set lan0 master br0
run ip -n sd-ioc link set lan0 up
run ip -n sd-ioc link set br0 up
start_ioc
port_carrier() { ip -n sd-ioc link show "$1" 2>/dev/null | grep -q LOWER_UP && echo up || echo down; }
for p in sdp-host1 sdp-host2; do
    ip -n sd-ioc link show "$p" >/dev/null 2>&1 || fail "port $p missing after the IOC started"
    assert_match "$(ip -n sd-ioc -o link show "$p")" "master br0" "$p in the bridge"
    assert_eq "$(link_mac sd-ioc "$p")" "fe:ff:ff:ff:ff:ff" "$p's own MAC"
    assert_eq "$(port_carrier "$p")" down "$p's carrier before its host connects"
done
assert_no_grep "$T/ioc.log" "cannot open LAN interface" "the IOC opened no NIC"
start_host 1; start_host 2
wait_carrier sd-host up 10; wait_carrier sd-host2 up 10
port_up() { [ "$(port_carrier "$1")" = up ]; }
eventually 5 port_up sdp-host1 || fail "sdp-host1 has no carrier with its host connected"
eventually 5 port_up sdp-host2 || fail "sdp-host2 has no carrier with its host connected"
host1=$(link_mac sd-host sd0); host2=$(link_mac sd-host2 sd0)
ports=$(ctl_json "$T/ioc.sock" hosts "sorted((h['name'], h['port']) for h in d['hosts']['hosts'])")
assert_eq "$ports" "[('host1', 'sdp-host1'), ('host2', 'sdp-host2')]" "splitnetctl hosts names the ports"
ping_ok sd-host 10.50.0.2
ping_ok sd-host2 10.50.0.2
ping_ok sd-host 10.50.0.3
ping_ok sd-host2 10.50.0.1
ping_ok sd-host fd50::2 -6
ping_ok sd-host2 fd50::1 -6
ping_ok sd-lan 10.50.0.3
up=$(iperf sd-host 10.50.0.2 5221 -t 2) || fail "host 1 -> LAN iperf3: $up"
assert_positive "$up" "host 1 -> LAN throughput"
down=$(iperf sd-host 10.50.0.2 5222 -t 2 -R) || fail "LAN -> host 1 iperf3: $down"
assert_positive "$down" "LAN -> host 1 throughput"
across=$(SERVER_NS=sd-host2 iperf sd-host 10.50.0.3 5223 -t 2) || fail "host 1 -> host 2 iperf3: $across"
assert_positive "$across" "host 1 -> host 2 throughput"
log "through the bridge: host 1 -> LAN $up Gb/s, LAN -> host 1 $down Gb/s, host 1 -> host 2 $across Gb/s"

# What host 2 receives: a capture without promiscuous mode, while the LAN peer pings host 1
# and a MAC no one has (static neighbours; the bridge floods frames for the unknown MAC to
# every port, and host 1's to every port until it learns it).
filtered() { ctl_json "$T/ioc.sock" stats "d['stats'].get('drops', {}).get('lan_no_host', 0)"; }
before=$(filtered)
run ip -n sd-ioc link set dev br0 type bridge ageing_time 0
ip netns exec sd-host2 dumpcap -p -q -i sd0 -a duration:10 -w "$T/host2.pcap" >"$T/dumpcap2.out" 2>&1 &
cap2=$!; PIDS+=("$cap2")
ip netns exec sd-host dumpcap -p -q -i sd0 -a duration:10 -w "$T/host1.pcap" >"$T/dumpcap1.out" 2>&1 &
cap1=$!; PIDS+=("$cap1")
sleep 1
run ip -n sd-lan neigh replace 10.50.0.203 lladdr "$NOBODY" dev lan1 nud permanent
ip netns exec sd-lan ping -q -c 20 -i 0.05 -W 1 10.50.0.203 >/dev/null 2>&1
PING_COUNT=20 ping_ok sd-lan 10.50.0.1
wait "$cap2" || fail "dumpcap on host 2's sd0: $(cat "$T/dumpcap2.out")"
wait "$cap1" || fail "dumpcap on host 1's sd0: $(cat "$T/dumpcap1.out")"
# received FILE DST SELF: frames of FILE for DST that its host (SELF) did not send.
received() { tshark -r "$1" -Y "eth.dst == $2 && eth.src != $3" 2>/dev/null | wc -l; }
assert_eq "$(received "$T/host2.pcap" "$NOBODY" "$host2")" 0 "frames for a MAC no one has at host 2"
assert_eq "$(received "$T/host2.pcap" "$host1" "$host2")" 0 "frames for host 1 at host 2"
assert_eq "$(received "$T/host1.pcap" "$NOBODY" "$host1")" 0 "frames for a MAC no one has at host 1"
assert_ge "$(received "$T/host1.pcap" "$host1" "$host1")" 20 "host 1's own frames at host 1"
after=$(filtered)
assert_ge "$((after - before))" 40 "frames the IOC filtered (20 floods to each host at least)"
log "floods for $NOBODY: none at either host; the IOC filtered $((after - before)) frames"

# The hook: add for both ports, up with each host's MAC (derived at connect), change with
# the MTU a host sets.
assert_grep "$T/hook.log" "^add sdp-host1 host1 mac= mtu= bridge=br0$" "the hook's add of sdp-host1"
assert_grep "$T/hook.log" "^add sdp-host2 host2 mac= mtu= bridge=br0$" "the hook's add of sdp-host2"
assert_grep "$T/hook.log" "^up sdp-host1 host1 mac=$host1 mtu=1500 " "the hook's up with host 1's MAC"
assert_grep "$T/hook.log" "^up sdp-host2 host2 mac=$host2 mtu=1500 " "the hook's up with host 2's MAC"
run ip -n sd-host link set dev sd0 mtu 1400
eventually 5 grep -q "^change sdp-host1 host1 mac=$host1 mtu=1400 " "$T/hook.log" ||
    fail "no change with host 1's MTU in the hook's log: $(cat "$T/hook.log")"
run ip -n sd-host link set dev sd0 mtu 1500
# The switch's side sets the port's MTU: the host follows it (LinkChange), down and up.
mtu_is() { [ "$(sd0_mtu sd-host)" = "$1" ]; }
eventually 5 mtu_is 1500 || fail "host 1's sd0 MTU back at 1500: $(sd0_mtu sd-host)"
run ip -n sd-ioc link set dev sdp-host1 mtu 1400
eventually 5 mtu_is 1400 || fail "host 1's sd0 MTU with its port at 1400: $(sd0_mtu sd-host)"
run ip -n sd-ioc link set dev sdp-host1 mtu 1500
eventually 5 mtu_is 1500 || fail "host 1's sd0 MTU with its port back at 1500: $(sd0_mtu sd-host)"
ping_ok sd-host 10.50.0.2 -s 1472 -M "do"

# An IOC restart: the ports stay (no carrier meanwhile), and serve the hosts after it.
stop_ioc
ip -n sd-ioc link show sdp-host1 >/dev/null 2>&1 || fail "sdp-host1 gone with the IOC"
port_down() { [ "$(port_carrier "$1")" = down ]; }
eventually 5 port_down sdp-host1 || fail "sdp-host1 kept its carrier with the IOC stopped"
eventually 5 grep -q "^down sdp-host1 host1 mac=$host1 " "$T/hook.log" || fail "no down of sdp-host1 in the hook's log"
start_ioc
wait_carrier sd-host up 20; wait_carrier sd-host2 up 20
eventually 10 port_up sdp-host1 || fail "sdp-host1 has no carrier after the restart"
ping_ok sd-host 10.50.0.2
ping_ok sd-host2 10.50.0.1

# A reload that removes host 2's entry: its session ends, its port goes.
python3 - "$IOC_CONF" <<'PY' || fail "cannot remove host 2's entry"
import sys
text = open(sys.argv[1]).read()
entries = text.split("\n[[auth.hosts]]")
open(sys.argv[1], "w").write("\n[[auth.hosts]]".join(e for e in entries if 'name = "host2"' not in e))
PY
"$CTL" -s "$T/ioc.sock" reload >"$T/reload.out" 2>&1 || fail "reload refused: $(cat "$T/reload.out")"
port_gone() { ! ip -n sd-ioc link show sdp-host2 >/dev/null 2>&1; }
eventually 10 port_gone || fail "sdp-host2 still there after its entry was removed: $(ip -n sd-ioc -o link show sdp-host2)"
assert_no_grep <(bridge -n sd-ioc link show) "sdp-host2" "host 2's port in the bridge"
# The hook runs on a thread of its own: it may finish after the port went.
eventually 5 grep -q "^remove sdp-host2 host2 " "$T/hook.log" || fail "no remove of sdp-host2 in the hook's log"
assert_eq "$(grep " sdp-host2 " "$T/hook.log" | tail -2 | cut -d' ' -f1 | tr '\n' ' ')" "down remove " \
    "the hook's last two calls for sdp-host2"
ip -n sd-ioc link show sdp-host1 >/dev/null 2>&1 || fail "sdp-host1 went with host 2's entry"
ping_ok sd-host 10.50.0.2

# A reload that renames host 1's port: its session ends and comes back on the new port.
sed -i 's/^name = "host1"$/name = "host1"\nport = "sdp-web1"/' "$IOC_CONF"
grep -q '^port = "sdp-web1"$' "$IOC_CONF" || fail "cannot name host 1's port"
"$CTL" -s "$T/ioc.sock" reload >"$T/reload.out" 2>&1 || fail "reload refused: $(cat "$T/reload.out")"
eventually 10 port_up sdp-web1 || fail "host 1 not back on sdp-web1: $(tail -n 5 "$T/ioc.log")"
port_gone1() { ! ip -n sd-ioc link show sdp-host1 >/dev/null 2>&1; }
eventually 10 port_gone1 || fail "sdp-host1 still there after host 1's port was renamed"
bridge -n sd-ioc link show | grep -q "sdp-web1.*master br0" || fail "sdp-web1 not in br0: $(bridge -n sd-ioc link show)"
grep -q "its port changed from sdp-host1 to sdp-web1" "$T/ioc.log" || fail "the IOC did not say why host 1's session ended"
eventually 5 grep -q "^up sdp-web1 host1 " "$T/hook.log" || fail "no up of sdp-web1 in the hook's log"
assert_eq "$(grep " sdp-host1 " "$T/hook.log" | tail -2 | cut -d' ' -f1 | tr '\n' ' ')" "down remove " \
    "the hook's last two calls for sdp-host1"
ping_ok sd-host 10.50.0.2
log "reload: host 1's port renamed to sdp-web1; its session moved there, sdp-host1 removed"
pass "ports on a Linux bridge"
