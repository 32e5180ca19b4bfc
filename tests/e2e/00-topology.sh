#!/usr/bin/env bash
# The harness itself, without the daemons: the reference topology of DESIGN.md for 1 and 3
# hosts (and a 9000-byte LAN) has the right namespaces, addresses, bridge and links; topo_down
# leaves nothing behind; and a test that fails or is killed still removes everything.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping pgrep

no_namespaces_left() {
    local ns
    for ns in "${ALL_NS[@]}"; do [ -e "/run/netns/$ns" ] && fail "$1: namespace $ns left behind"; done
    ip -br link show | grep -Eq '^(fab[0-9]+|fabbr|lan[01]|sd0)[@ ]' &&
        fail "$1: a test interface leaked into the root namespace: $(ip -br link show | grep -E '^(fab|lan|sd0)')"
    return 0
}
addr4() { ip -n "$1" -4 -br addr show "$2" | awk '{print $3}'; }

no_namespaces_left "before the test"
for n in 1 3; do
    topo_up "$n"
    want="sd-ioc sd-lan sd-host"
    for k in $(seq 2 "$n"); do want+=" sd-host$k"; done
    assert_eq "$(ip netns list | awk '{print $1}' | grep '^sd-' | sort | xargs)" "$(echo $want | tr ' ' '\n' | sort | xargs)" "namespaces for $n host(s)"
    assert_eq "$(addr4 sd-lan lan1)" 10.50.0.2/24 "LAN peer's IPv4"
    assert_match "$(ip -n sd-lan -6 -br addr show lan1)" 'fd50::2/64' "LAN peer's IPv6"
    assert_eq "$(addr4 sd-ioc lan0)" "" "lan0 has no address (ioc-driver owns it)"
    assert_eq "$(ip -n sd-ioc link show lan0 | grep -o 'mtu [0-9]*')" "mtu 1500" "lan0 MTU"
    if [ "$n" = 1 ]; then
        assert_eq "$(addr4 sd-ioc fab1)" 10.200.0.2/24 "IOC fabric address on fab1"
        ip -n sd-ioc link show fabbr >/dev/null 2>&1 && fail "a single host must not have a bridge"
    else
        assert_eq "$(addr4 sd-ioc fabbr)" 10.200.0.2/24 "IOC fabric address on the bridge"
        assert_eq "$(ip -n sd-ioc -br link show master fabbr | awk '{sub(/@.*/, "", $1); print $1}' | sort | xargs)" \
            "fab1 fab3 fab5" "bridge ports"
    fi
    for k in $(seq 1 "$n"); do
        ns=$(host_ns "$k")
        assert_eq "$(addr4 "$ns" fab0)" "$(host_fab_ip "$k")/24" "fabric address of host $k"
        ping_ok "$ns" 10.200.0.2
    done
    [ "$n" -gt 1 ] && ping_ok sd-host3 10.200.0.1
    # The LAN link works: with lan0 up (ioc-driver's job), an ARP broadcast from the LAN peer
    # arrives on it.
    run ip -n sd-ioc link set lan0 up
    eventually 3 bash -c 'ip -n sd-lan link show lan1 | grep -q LOWER_UP' || fail "lan1 has no carrier with lan0 up"
    ip netns exec sd-lan ping -c 1 -W 1 10.50.0.9 >/dev/null 2>&1
    assert_ge "$(ip -n sd-ioc -s link show lan0 | awk '/RX:/{getline; print $2}')" 1 "packets on lan0 from the LAN peer"
    topo_down || fail "topo_down for $n host(s)"
    no_namespaces_left "after topo_down of $n host(s)"
    log "$n host(s): namespaces, addresses, bridge and links as in DESIGN.md; removed cleanly"
done

topo_up 1 9000
assert_eq "$(ip -n sd-ioc link show lan0 | grep -o 'mtu [0-9]*')" "mtu 9000" "lan0 MTU of a jumbo LAN"
assert_eq "$(ip -n sd-lan link show lan1 | grep -o 'mtu [0-9]*')" "mtu 9000" "lan1 MTU of a jumbo LAN"
topo_down || fail "topo_down of the jumbo LAN"
no_namespaces_left "after the jumbo LAN"

# A failing test and a test killed by SIGTERM (as `timeout` does) still clean up, processes in
# the namespaces included.
child='. "$1/tests/lib.sh"; topo_up 3; ip netns exec sd-lan sleep 377 & PIDS+=($!); '
bash -c "$child"' fail "deliberate failure"' _ "$ROOT" >"$T/child.out" 2>&1 && fail "a failing child test exited 0"
grep -q "FAIL: deliberate failure" "$T/child.out" || fail "child's failure not reported: $(cat "$T/child.out")"
no_namespaces_left "after a failed test"
bash -c "$child"' ip netns exec sd-lan sleep 377; true' _ "$ROOT" >"$T/child.out" 2>&1 &
kid=$!
eventually 5 test -e /run/netns/sd-host3 || fail "child topology did not come up"
sleep 0.3
kill -TERM "$kid"; wait "$kid"
no_namespaces_left "after a test killed by SIGTERM"
pgrep -f 'sleep 377' >/dev/null && fail "a process of the killed test survived: $(pgrep -af 'sleep 377')"
log "failed and killed tests remove their namespaces and processes"
pass "reference topology up/down (1 and 3 hosts, jumbo LAN) leaves nothing behind"
