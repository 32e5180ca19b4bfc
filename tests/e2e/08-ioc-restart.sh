#!/usr/bin/env bash
# kill -9 of ioc-driver turns sd0 NO-CARRIER within 2 s; a new ioc-driver brings carrier and
# traffic back without touching host-driver (it reconnects by itself). An ioc-driver started
# while its fabric address is still held (as by an instance killed a moment ago) waits for it,
# saying so once, instead of exiting.
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
# The address still held for 1.5 s (a listener of another process stands for the exiting
# instance): the new IOC waits, then listens; the host comes back.
stop_ioc KILL
ip netns exec sd-ioc python3 -c "import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('10.200.0.2', 7400)); s.listen(); time.sleep(1.5)" & holder=$!
PIDS+=("$holder")
# Held before the IOC starts (a fixed wait lost the race on a loaded machine).
wait_listen sd-ioc 7400
start_ioc
wait "$holder"
sleep 0.5
assert_alive "$IOC_PID" "ioc-driver started while its address was held"
assert_eq "$(grep -c 'fabric.listen is still in use' "$T/ioc.log")" 1 "the IOC's one line about the held address"
wait_carrier sd-host up 5; log "carrier back ${WAITED_MS} ms after the address came free"
ping_ok sd-host 10.50.0.2
pass "IOC killed and restarted: carrier follows, traffic back, host-driver untouched"
