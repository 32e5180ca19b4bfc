#!/usr/bin/env bash
# DHCP through the split NIC: dnsmasq on the LAN peer hands sd0 a lease; a real DHCP client on
# the host (ISC dhclient from isc-dhcp-client, or busybox udhcpc when only that is installed;
# DHCP_CLIENT=dhclient|udhcpc chooses). The address must come from dnsmasq's range, and traffic
# must flow with it.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss dnsmasq; need_daemons
client=${DHCP_CLIENT:-}
if [ -z "$client" ]; then
    if command -v dhclient >/dev/null; then client=dhclient
    elif command -v udhcpc >/dev/null; then client=udhcpc
    else fail "missing DHCP client: dhclient (apt install isc-dhcp-client) or udhcpc (apt install udhcpc)"; fi
fi
need_tool "$client"
topo_up 1; start_ioc
NO_ADDR=1 start_host 1
wait_carrier sd-host up 10
# The client's hook scripts rewrite /etc/resolv.conf: keep that inside the namespace (ip netns
# exec bind-mounts /etc/netns/NAME/* over /etc/*; topo_down removes the directory).
mkdir -p /etc/netns/sd-host && : >/etc/netns/sd-host/resolv.conf
ip netns exec sd-lan dnsmasq --no-daemon --conf-file=/dev/null --port=0 --interface=lan1 \
    --bind-interfaces --dhcp-range=10.50.0.100,10.50.0.150,255.255.255.0,10m \
    --dhcp-leasefile="$T/leases" --pid-file="$T/dnsmasq.pid" --log-dhcp >"$T/dnsmasq.log" 2>&1 &
PIDS+=($!)
wait_listen sd-lan 67 udp
case $client in
    dhclient)
        timeout 30 ip netns exec sd-host dhclient -1 -v -pf "$T/dhclient.pid" -lf "$T/dhclient.leases" sd0 \
            >"$T/dhclient.log" 2>&1 || fail "dhclient got no lease: $(tail -n 3 "$T/dhclient.log" | tr '\n' ' ')"
        [ -f "$T/dhclient.pid" ] && PIDS+=("$(cat "$T/dhclient.pid")")
        ;;
    udhcpc)
        script=$(ls /etc/udhcpc/default.script /usr/share/udhcpc/default.script 2>/dev/null | head -n 1)
        [ -n "$script" ] || fail "udhcpc's default.script not found (apt install udhcpc)"
        timeout 30 ip netns exec sd-host udhcpc -f -q -n -t 5 -T 2 -i sd0 -s "$script" \
            >"$T/udhcpc.log" 2>&1 || fail "udhcpc got no lease: $(tail -n 3 "$T/udhcpc.log" | tr '\n' ' ')"
        ;;
    *) fail "DHCP_CLIENT=$client: dhclient or udhcpc" ;;
esac
addr=$(ip -n sd-host -4 -br addr show sd0 | awk '{print $3}')
assert_match "$addr" '^10\.50\.0\.(1[0-4][0-9]|150)/24$' "sd0's address from $client (dnsmasq range 10.50.0.100-150)"
assert_grep "$T/leases" " ${addr%/24} " "dnsmasq's lease for ${addr%/24}"
assert_grep "$T/leases" " $(link_mac sd-host sd0) " "dnsmasq's lease for sd0's MAC"
ping_ok sd-host 10.50.0.2
ping_ok sd-lan "${addr%/24}"
log "$client on sd0 got $addr from dnsmasq on the LAN peer"
pass "DHCP lease through sd0 ($client)"
