#!/usr/bin/env bash
# SIGTERM on either side flushes the pools and exits 0; the peer logs a clean disconnect.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
hp=${HOST_PID[1]}
kill -TERM "$hp"; wait "$hp"; rc=$?
[ "$rc" = 0 ] || fail "host-driver exited $rc on SIGTERM"
grep -q "pools flushed" "$T/host1.log" || fail "host-driver did not flush its pools"
sleep 0.3
grep -q "host removed: host disconnected (ShuttingDown)" "$T/ioc.log" || fail "IOC did not see a clean disconnect"
grep -qi "error" "$T/ioc.log" && fail "IOC logged an error on a clean disconnect"
start_host 1; wait_carrier sd-host up 10
kill -TERM "$IOC_PID"; wait "$IOC_PID"; rc=$?
[ "$rc" = 0 ] || fail "ioc-driver exited $rc on SIGTERM"
grep -q "IOC closed the connection (ShuttingDown)" "$T/host1.log" || fail "host did not see a clean IOC shutdown"
wait_carrier sd-host down 2
pass "graceful stop on both sides"
