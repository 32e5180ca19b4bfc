#!/usr/bin/env bash
# Killing ioc-driver turns sd0 NO-CARRIER; restarting it brings carrier and traffic back
# without touching host-driver.
. "$(dirname "$0")/../lib.sh"
need_root; need_tools ip ping
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10 >/dev/null
ping_ok sd-host 10.50.0.2
hp=${HOST_PID[1]}
kill -9 "$IOC_PID"
ms=$(wait_carrier sd-host down 2); log "NO-CARRIER ${ms} ms after kill -9 of ioc-driver"
start_ioc
ms=$(wait_carrier sd-host up 5); log "carrier back ${ms} ms after the restart"
ping_ok sd-host 10.50.0.2
kill -0 "$hp" || fail "host-driver died"
pass "IOC restart: carrier follows, traffic back, host-driver untouched"
