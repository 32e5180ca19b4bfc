#!/usr/bin/env bash
# Linux tools on sd0 reach the IOC over CfgUtil: an MTU beyond what the IOC allows is refused
# with a logged reason and reverted (never a silent black hole), an allowed one is agreed and
# used; promiscuous mode is passed on.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
mtu() { ip -n sd-host link show sd0 | grep -o 'mtu [0-9]*' | awk '{print $2}'; }
ip -n sd-host link set sd0 mtu 9000
for _ in $(seq 30); do [ "$(mtu)" = 1500 ] && grep -q "MTU 9000 on sd0 refused" "$T/host1.log" && break; sleep 0.1; done
[ "$(mtu)" = 1500 ] || fail "MTU 9000 beyond the IOC's 1500 was not reverted (sd0 mtu $(mtu))"
log "$(grep -o 'MTU 9000 on sd0 refused.*' "$T/host1.log" | head -n 1)"
ip -n sd-host link set sd0 mtu 1400
for _ in $(seq 30); do grep -q "MTU accepted by the IOC mtu=1400" "$T/host1.log" && break; sleep 0.1; done
grep -q "MTU accepted by the IOC mtu=1400" "$T/host1.log" || fail "MTU 1400 not agreed with the IOC"
[ "$(mtu)" = 1400 ] || fail "sd0 MTU is $(mtu), want 1400"
ping_ok sd-host 10.50.0.2 -M 'do' -s 1372
ip netns exec sd-host ping -c 1 -W 1 -M 'do' -s 1373 10.50.0.2 >/dev/null 2>&1 && fail "a 1401-byte packet left a 1400-byte interface"
ip -n sd-host link set sd0 promisc on
for _ in $(seq 30); do grep -q "promiscuous mode changed.*promisc=true" "$T/host1.log" && break; sleep 0.1; done
grep -q "promiscuous mode changed.*promisc=true" "$T/host1.log" || fail "promiscuous mode not passed on"
grep -q "refused a configuration request.*SetPromisc" "$T/host1.log" && fail "IOC refused SetPromisc"
pass "MTU and promiscuous mode follow Linux tools, within the IOC's limits"
