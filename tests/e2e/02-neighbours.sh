#!/usr/bin/env bash
# ARP and IPv6 neighbour discovery resolve on both sides: after traffic, each side has a
# REACHABLE or STALE neighbour entry for the other, with the other's real MAC address.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ip -n sd-host neigh flush dev sd0; ip -n sd-lan neigh flush dev lan1
# Each side starts a resolution of its own (a ping from either end).
ping_ok sd-host 10.50.0.2
ping_ok sd-host fd50::2 -6
ping_ok sd-lan 10.50.0.1
ping_ok sd-lan fd50::1 -6
sd0_mac=$(link_mac sd-host sd0)
lan_mac=$(link_mac sd-lan lan1)
assert_match "$sd0_mac" '^[0-9a-f]{2}(:[0-9a-f]{2}){5}$' "sd0's MAC"
assert_ne "$sd0_mac" "00:00:00:00:00:00" "sd0's MAC"
# The IOC assigns the host's MAC from lan.mac_base (unless host.toml overrides it).
base=$(sed -n 's/^mac_base *= *"\([0-9a-fA-F:]*\)".*/\1/p' "$IOC_CONF")
if [ -n "$base" ] && ! grep -q '^mac *=' "$HOST_CONF"; then
    assert_eq "${sd0_mac:0:8}" "$(echo "${base:0:8}" | tr A-F a-f)" "sd0's MAC prefix (lan.mac_base of ioc.toml)"
fi
resolved() { # NS ADDR DEV MAC
    local e
    e=$(neigh "$1" "$2" "$3")
    [[ $e == "$4 REACHABLE" || $e == "$4 STALE" ]]
}
check() { # NS ADDR DEV MAC
    eventually 8 resolved "$@" ||
        fail "$1: neighbour $2 on $3 is '$(neigh "$1" "$2" "$3")', want '$4 REACHABLE' or '$4 STALE'"
    log "$1: $2 -> $(neigh "$1" "$2" "$3")"
}
check sd-host 10.50.0.2 sd0 "$lan_mac"
check sd-host fd50::2 sd0 "$lan_mac"
check sd-lan 10.50.0.1 lan1 "$sd0_mac"
check sd-lan fd50::1 lan1 "$sd0_mac"
pass "ARP and neighbour discovery resolve both ways"
