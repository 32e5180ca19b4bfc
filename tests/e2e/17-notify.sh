#!/usr/bin/env bash
# systemd notification protocol, against a NOTIFY_SOCKET listener: READY once the data path
# is up, STATUS lines, WATCHDOG=1 fed while running, STOPPING on SIGTERM.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip python3; need_daemons
topo_up 1
for who in ioc host; do
    python3 "$ROOT/tests/notify_listener.py" "$T/$who.sock" >"$T/$who.notify" 2>&1 & PIDS+=($!)
done
# A message sent before the listener binds is lost: wait for both sockets.
for who in ioc host; do eventually 10 test -S "$T/$who.sock" || fail "the $who notify listener did not bind"; done
# As systemd does: WATCHDOG_PID names the daemon's own pid (exec keeps the shell's).
ip netns exec sd-ioc env NOTIFY_SOCKET="$T/ioc.sock" WATCHDOG_USEC=1000000 \
    sh -c 'WATCHDOG_PID=$$ exec "$0" --config "$1" --control-socket "$2"' "$BIN/ioc-driver" "$IOC_CONF" "$T/ioc.ctl" >>"$T/ioc.log" 2>&1 &
IOC_PID=$!; PIDS+=("$IOC_PID")
sleep 0.5
ip netns exec sd-host env NOTIFY_SOCKET="$T/host.sock" WATCHDOG_USEC=1000000 \
    CREDENTIALS_DIRECTORY=$T/cred/host1 sh -c 'WATCHDOG_PID=$$ exec "$0" --config "$1" --control-socket "$2"' "$BIN/host-driver" "$HOST_CONF" "$T/host1.ctl" >>"$T/host1.log" 2>&1 &
HP=$!; PIDS+=("$HP")
sleep 0.5
# READY=1 comes once the listeners and the control socket are up: on a loaded machine that
# can take longer than the host's start above.
eventually 10 grep -q "^READY=1" "$T/ioc.notify" || fail "ioc-driver sent no READY=1: $(head -n 3 "$T/ioc.notify")"
for _ in $(seq 50); do ip -n sd-host link show sd0 >/dev/null 2>&1 && break; sleep 0.1; done
ip -n sd-host link set sd0 up
wait_carrier sd-host up 10
grep -q "^READY=1|STATUS=fabric up" "$T/host.notify" || fail "host-driver sent no READY=1 with the data path up: $(head -n 3 "$T/host.notify")"
sleep 6
for who in ioc host; do
    n=$(grep -c "^WATCHDOG=1" "$T/$who.notify")
    [ "$n" -ge 8 ] || fail "$who sent $n WATCHDOG=1 in ~6 s with WATCHDOG_USEC=1s"
    grep -q "^STATUS=" "$T/$who.notify" || fail "$who sent no STATUS"
    log "$who: $(grep '^STATUS=' "$T/$who.notify" | tail -n 1)"
done
kill -TERM "$HP" "$IOC_PID"; wait "$HP" "$IOC_PID"
for who in ioc host; do grep -q "^STOPPING=1" "$T/$who.notify" || fail "$who sent no STOPPING=1"; done
pass "READY, STATUS, WATCHDOG and STOPPING"
