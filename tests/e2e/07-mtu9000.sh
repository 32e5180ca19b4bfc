#!/usr/bin/env bash
# With a 9000-byte LAN, sd0 takes MTU 9000 from the IOC and jumbo frames pass unfragmented.
. "$(dirname "$0")/../lib.sh"
need_root; need_tools ip ping
topo_up 1 9000; start_ioc; start_host 1
wait_carrier sd-host up 10 >/dev/null
mtu=$(ip -n sd-host link show sd0 | grep -o 'mtu [0-9]*' | awk '{print $2}')
[ "$mtu" = 9000 ] || fail "sd0 MTU is $mtu, want 9000"
ping_ok sd-host 10.50.0.2 -M do -s 8972
ping_ok sd-lan 10.50.0.1 -M do -s 8972
pass "MTU 9000 end to end"
