#!/usr/bin/env bash
# An IOC restarted the way systemd restarts it (SIGTERM, wait for the exit, start again) with
# its listening sockets in the service manager's descriptor store: tests/fdstore.py stands in
# for systemd here (e2e 22 does it with systemd itself). The new process takes the sockets up
# and accepts the connection the host made meanwhile; the old one told the host it was
# restarting, so sd0 keeps its carrier throughout. Across the restart, a paced TCP transfer
# from the host completes with its bytes intact, no ping reply is duplicated, and the longest
# gap between the replies to a ping every 10 ms from the LAN is printed (never bounded: a
# timing decides no test), beside the gap of the same restart without the store; again with a
# host of three queues (each of its sessions hears Restarting). A stop
# releases the store: the host holds its carrier for fabric.restart_grace_ms, then drops it.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss python3; need_daemons

# readies_beyond N: the store's events say READY more than N times.
readies_beyond() { [ "$(grep -c "^ready" "$T/store/events")" -gt "$1" ]; }

# restart_kept: what systemctl restart does, with the store.
restart_kept() {
    local before
    before=$(grep -c "^ready" "$T/store/events")
    kill -USR1 "$KEEPER"
    eventually 10 readies_beyond "$before" ||
        fail "the restarted ioc-driver is not ready: $(cat "$T/store/events")"
}

# restart_plain: the same without a store (the unit of before).
restart_plain() { stop_ioc TERM; start_ioc; }

# Every entry allows three queues; the 3-queue host's configuration.
sed 's/^queues = 1$/queues = 3/' "$IOC_CONF" >"$T/ioc-3q.toml"
grep -q '^queues = 3$' "$T/ioc-3q.toml" || fail "cannot let the hosts' entries have three queues"
IOC_CONF=$T/ioc-3q.toml
sed 's/^queues = 1$/queues = 3/' "$HOST_CONF" >"$T/host-3q.toml"
grep -q '^queues = 3$' "$T/host-3q.toml" || fail "cannot make a 3-queue host configuration"
topo_up 1
start_ioc_kept; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
assert_grep "$T/store/events" "^stored fabric$" "the IOC's fabric socket in the store"
( while sleep 0.01; do carrier sd-host; done ) >"$T/carrier.out" & sampler=$!
PIDS+=("$sampler")
across "systemctl restart, sockets kept" restart_kept
kept_gap=$GAP_MS
kill "$sampler"
assert_grep "$T/store/events" "^started .* fds=fabric$" "the new process given the kept socket"
assert_grep "$T/ioc.log" "fabric socket kept across the restart" "the new IOC taking the kept socket up"
assert_grep "$T/host1.log" "the IOC is restarting; carrier kept" "the host told the IOC is restarting"
sed -n '/the IOC is restarting/,$p' "$T/host1.log" >"$T/host1.after"
assert_no_grep "$T/host1.after" "carrier off|fabric lost" "the host, after it was told of the restart"
assert_eq "$(grep -c down "$T/carrier.out")" 0 "samples of sd0 without carrier during the restart"
ping_ok sd-host 10.50.0.2
ping_ok sd-host fd50::2 -6

# A host of three queues: the IOC says Restarting on each of its sessions, so whichever
# queue hears it first, sd0 keeps its carrier.
stop_host 1 TERM
run ip -n sd-host link del sd0
HOST_CONF=$T/host-3q.toml start_host 1
wait_carrier sd-host up 10
mark=$(wc -l <"$T/host1.log")
( while sleep 0.01; do carrier sd-host; done ) >"$T/carrier.out" & sampler=$!
PIDS+=("$sampler")
across "systemctl restart, sockets kept, 3 queues" restart_kept
kill "$sampler"
tail -n +"$mark" "$T/host1.log" >"$T/host1.after"
assert_grep "$T/host1.after" "the IOC is restarting; carrier kept" "the 3-queue host told the IOC is restarting"
assert_no_grep "$T/host1.after" "carrier off|fabric lost" "the 3-queue host across the restart"
assert_eq "$(grep -c down "$T/carrier.out")" 0 "samples of the 3-queue sd0 without carrier"
assert_eq "$(ctl_json "$T/ioc.sock" hosts "len(d['hosts']['hosts'])")" 3 "the 3-queue host's sessions after the restart"

# A stop releases the store: the host keeps trying for restart_grace_ms (2 s), then drops
# its carrier and backs off.
kill -TERM "$KEEPER"; wait "$KEEPER"
wait_carrier sd-host down 5
log "carrier off ${WAITED_MS} ms after the stop (restart_grace_ms = 2000)"
assert_grep "$T/host1.log" "did not come back within fabric.restart_grace_ms; carrier off" "the host giving up its hold"

# The restart of before: no store, the host told ShuttingDown, carrier off, backoff.
start_ioc
wait_carrier sd-host up 10
across "SIGTERM and start, no store" restart_plain
log "longest gap: ${kept_gap} ms with the sockets kept, ${GAP_MS} ms without"
pass "an IOC restarted with its sockets kept: carrier kept, transfer intact, no duplicates (gap ${kept_gap} ms; ${GAP_MS} ms without)"
