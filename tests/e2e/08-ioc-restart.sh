#!/usr/bin/env bash
# kill -9 of ioc-driver turns sd0 NO-CARRIER within 2 s; a new ioc-driver brings carrier and
# traffic back without touching host-driver (it reconnects by itself).
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
hp=${HOST_PID[1]}
stop_ioc KILL
wait_carrier sd-host down 2; log "NO-CARRIER ${WAITED_MS} ms after kill -9 of ioc-driver"
ip netns exec sd-host ping -c 1 -W 1 10.50.0.2 >/dev/null 2>&1 && fail "a ping went through without an IOC"
sleep 1
assert_eq "$(carrier sd-host)" down "sd0's carrier while the IOC is away"
start_ioc
wait_carrier sd-host up 5; log "carrier back ${WAITED_MS} ms after the restart"
ping_ok sd-host 10.50.0.2
ping_ok sd-host fd50::2 -6
assert_alive "$hp" "host-driver across the IOC restart"
assert_eq "${HOST_PID[1]}" "$hp" "host-driver's pid (never restarted)"
pass "IOC killed and restarted: carrier follows, traffic back, host-driver untouched"
