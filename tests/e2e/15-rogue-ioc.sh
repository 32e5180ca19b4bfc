#!/usr/bin/env bash
# The mirror: a rogue IOC attacks host-driver. host-driver refuses each attack (closes the
# connection, logs why), reconnects, and never crashes.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip; need_daemons
need_rogue
topo_up 1
ip netns exec sd-ioc "$ROGUE" ioc 10.200.0.2:7400 >"$T/rogue.out" 2>&1 & rogue=$!
PIDS+=("$rogue")
sleep 0.3
start_host 1
wait $rogue; rc=$?
sed 's/^/  rogue: /' "$T/rogue.out"
[ "$rc" = 0 ] || fail "some attack was not refused by host-driver"
kill -0 "${HOST_PID[1]}" || fail "host-driver died"
n=$(grep -c "fabric lost" "$T/host1.log")
[ "$n" -ge 4 ] || fail "host-driver logged $n lost connections, want 4"
[ "$(carrier sd-host)" = down ] || fail "sd0 has carrier without an IOC"
pass "rogue IOC refused; host-driver survives"
