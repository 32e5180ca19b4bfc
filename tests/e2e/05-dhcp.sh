#!/usr/bin/env bash
# dnsmasq on the LAN hands sd0 a lease; a real DHCP client (ISC dhclient) on the host.
. "$(dirname "$0")/../lib.sh"
need_root; need_tools ip dnsmasq dhclient
topo_up 1; start_ioc
NO_ADDR=1 start_host 1
wait_carrier sd-host up 10 >/dev/null
# Keep dhclient-script's resolv.conf changes inside the namespace (ip netns exec bind-mounts
# /etc/netns/NAME/* over /etc).
mkdir -p /etc/netns/sd-host && : >/etc/netns/sd-host/resolv.conf
ip netns exec sd-lan dnsmasq --no-daemon --port=0 --interface=lan1 --bind-interfaces \
    --dhcp-range=10.50.0.100,10.50.0.150,255.255.255.0,10m --dhcp-leasefile="$T/leases" \
    --pid-file="$T/dnsmasq.pid" >"$T/dnsmasq.log" 2>&1 &
PIDS+=($!)
sleep 0.5
timeout 20 ip netns exec sd-host dhclient -1 -v -pf "$T/dhclient.pid" -lf "$T/dhclient.leases" sd0 \
    >"$T/dhclient.log" 2>&1 || fail "dhclient got no lease: $(tail -n 3 "$T/dhclient.log" | tr '\n' ' ')"
[ -f "$T/dhclient.pid" ] && PIDS+=("$(cat "$T/dhclient.pid")")
addr=$(ip -n sd-host -4 -br addr show sd0 | awk '{print $3}')
case "$addr" in 10.50.0.1[0-4][0-9]/24|10.50.0.150/24) ;; *) fail "sd0 has '$addr', not a lease from 10.50.0.100-150";; esac
grep -q "${addr%/24}" "$T/leases" || fail "dnsmasq has no lease for $addr"
ping_ok sd-host 10.50.0.2
log "lease $addr"
pass "DHCP lease through sd0"
