#!/usr/bin/env bash
# With lan0/lan1 at MTU 9000, sd0 takes MTU 9000 from the IOC and 9000-byte packets pass
# unfragmented both ways (ping -M 'do' -s 8972: 8972 + 8 ICMP + 20 IP = 9000).
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss; need_daemons
topo_up 1 9000; start_ioc; start_host 1
wait_carrier sd-host up 10
mtu_is() { [ "$(sd0_mtu "$1")" = "$2" ]; }
eventually 3 mtu_is sd-host 9000 || true
assert_eq "$(sd0_mtu sd-host)" 9000 "sd0's MTU with a 9000-byte LAN"
ping_ok sd-host 10.50.0.2 -M 'do' -s 8972
ping_ok sd-lan 10.50.0.1 -M 'do' -s 8972
ip netns exec sd-host ping -c 1 -W 1 -M 'do' -s 8973 10.50.0.2 >/dev/null 2>&1 &&
    fail "a 9001-byte packet left sd0 with DF set"
log "sd0 mtu $(sd0_mtu sd-host); 9000-byte pings pass both ways unfragmented"
pass "MTU 9000 end to end"
