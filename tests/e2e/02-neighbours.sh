#!/usr/bin/env bash
# ARP and IPv6 neighbour discovery resolve on both sides to the right MAC addresses.
. "$(dirname "$0")/../lib.sh"
need_root; need_tools ip ping
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10 >/dev/null
ping_ok sd-host 10.50.0.2
ping_ok sd-host fd50::2 -6
sd0_mac=$(ip -n sd-host -br link show sd0 | awk '{print $3}')
lan_mac=$(ip -n sd-lan -br link show lan1 | awk '{print $3}')
case "$sd0_mac" in 02:5d:*) ;; *) fail "sd0 MAC $sd0_mac is not assigned by the IOC (02:5d prefix)";; esac
for addr in 10.50.0.2 fd50::2; do
    got=$(ip -n sd-host neigh show "$addr" dev sd0 | awk '{print $3}')
    [ "$got" = "$lan_mac" ] || fail "host neighbour $addr resolved to '$got', want $lan_mac"
done
for addr in 10.50.0.1 fd50::1; do
    got=$(ip -n sd-lan neigh show "$addr" dev lan1 | awk '{print $3}')
    [ "$got" = "$sd0_mac" ] || fail "LAN neighbour $addr resolved to '$got', want $sd0_mac"
done
log "sd0 $sd0_mac <-> lan1 $lan_mac"
pass "ARP and neighbour discovery resolve"
