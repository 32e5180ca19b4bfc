#!/usr/bin/env bash
# An IOC upgraded in place, as the package does it (splitnetctl upgrade): the running IOC
# starts the binary that is now at its path with its listening sockets, the new process says
# it is ready, becomes the service's main process (MAINPID=, here to tests/fdstore.py standing
# in for systemd; e2e 22 does it with systemd and the package), and the old one tells its
# host it is restarting and ends. Across it, a paced TCP transfer from the host completes
# intact, no ping reply from the LAN is duplicated, sd0 keeps its carrier, and the longest
# gap between the replies to a ping every 10 ms is printed (never bounded). A binary that
# fails to start is refused (exit 3) with the old process serving on, its host untouched;
# after it, a good binary takes over as before, and a stop then ends the new process.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss python3; need_daemons

# The IOC runs from a copy that the test replaces as dpkg does: a new file renamed over it.
mkdir -p "$T/bin"
IOC_BIN=$T/bin/ioc-driver
install_binary() { cp "$1" "$IOC_BIN.new" && chmod 755 "$IOC_BIN.new" && mv -f "$IOC_BIN.new" "$IOC_BIN"; }
install_binary "$BIN/ioc-driver"
main_pid() { ctl_json "$T/ioc.sock" status "d['status']['pid']"; }

# upgrade_ok: installs a fresh copy of the binary and asks for the upgrade; sets OLD and NEW.
upgrade_ok() {
    OLD=$(main_pid)
    OLD_FDS=$(fds "$OLD")
    install_binary "$BIN/ioc-driver"
    "$BIN/splitnetctl" -s "$T/ioc.sock" upgrade >"$T/upgrade.out" 2>&1 ||
        fail "splitnetctl upgrade: exit $?: $(cat "$T/upgrade.out")"
    NEW=$(sed -n 's/^upgraded: process \([0-9]*\) serves now.*/\1/p' "$T/upgrade.out")
    [ -n "$NEW" ] || fail "no new process in the answer: $(cat "$T/upgrade.out")"
    PIDS+=("$NEW")
}

topo_up 1
start_ioc_kept "$IOC_BIN"; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
( while sleep 0.01; do carrier sd-host; done ) >"$T/carrier.out" & sampler=$!
PIDS+=("$sampler")
mark=$(wc -l <"$T/host1.log")
across "upgrade" upgrade_ok
kill "$sampler"
log "$(cat "$T/upgrade.out")"
assert_grep "$T/store/events" "^mainpid $NEW$" "the new process named the main one"
assert_no_grep "$T/store/events" "^refused" "messages the stand-in refused as systemd would (from a process not the main one)"
eventually 5 grep -q "^reaped $OLD 0$" "$T/store/events" || fail "the old process $OLD did not end with status 0: $(cat "$T/store/events")"
assert_eq "$(main_pid)" "$NEW" "the process answering on the control socket"
assert_grep "$T/ioc.log" "fabric socket kept across the restart" "the new IOC taking the fabric socket up"
tail -n +"$mark" "$T/host1.log" >"$T/host1.after"
assert_grep "$T/host1.after" "the IOC is restarting; carrier kept" "the host told the IOC is restarting"
assert_no_grep "$T/host1.after" "carrier off|fabric lost" "the host across the upgrade"
assert_eq "$(grep -c down "$T/carrier.out")" 0 "samples of sd0 without carrier during the upgrade"
assert_eq "$(ctl_json "$T/ioc.sock" hosts "len(d['hosts']['hosts'])")" 1 "the host's sessions on the new process"
upgrade_gap=$GAP_MS
# The new process serving the same host holds what the old one held: nothing of the old
# one's leaked into it beyond the sockets handed over.
log "descriptors: $OLD_FDS in the old process, $(fds "$NEW") in the new one"
assert_le "$(fds "$NEW")" "$((OLD_FDS + 2))" "the new process's descriptors"
ping_ok sd-host 10.50.0.2
ping_ok sd-host fd50::2 -6

# A binary that fails to start: refused, the running process serves on, its host untouched.
printf '#!/bin/sh\necho "this build is broken" >&2\nexit 1\n' >"$T/broken"
install_binary "$T/broken"
mark=$(wc -l <"$T/host1.log")
rc=0; "$BIN/splitnetctl" -s "$T/ioc.sock" upgrade >"$T/upgrade.out" 2>&1 || rc=$?
assert_eq "$rc" 3 "splitnetctl upgrade's exit status with a binary that does not start"
assert_grep "$T/upgrade.out" "not upgraded, the running process serves on: the new process ended before it was ready" "the refusal"
assert_grep "$T/ioc.log" "this build is broken" "the broken binary's own word in the log"
assert_eq "$(main_pid)" "$NEW" "the process serving after the failed upgrade"
assert_alive "$NEW" "the IOC after the failed upgrade"
ping_ok sd-host 10.50.0.2
tail -n +"$mark" "$T/host1.log" >"$T/host1.after"
assert_no_grep "$T/host1.after" "restarting|carrier off|fabric lost" "the host across the failed upgrade"

# Then a good binary takes over again, and a stop ends the process that serves.
across "upgrade after a failed one" upgrade_ok
assert_grep "$T/store/events" "^mainpid $NEW$" "the second new process named the main one"
kill -TERM "$KEEPER"; wait "$KEEPER"
assert_grep "$T/store/events" "^exited $NEW 0$" "the stop ending the process that serves"
assert_no_grep "$T/store/events" "^refused" "messages from a process not the main one"
pass "an IOC upgraded in place: carrier kept, transfer intact, no duplicates (gaps ${upgrade_gap} and ${GAP_MS} ms); a broken binary refused with the old one serving"
