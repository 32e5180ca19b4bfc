#!/usr/bin/env bash
# One end-to-end run at a time on a machine: the tests, the demo and tests/run-all.sh share
# namespace and interface names (sd-host, sd-ioc, lan0, ...). Sourced by tests/lib.sh and
# tests/run-all.sh. A second run (a test started by hand during CI, CI during another CI) waits
# for the first instead of failing on its namespaces.
#
#   e2e_lock   takes /run/lock/splitnet-e2e.lock for the rest of the calling shell's life and
#              its children's (they inherit it; SPLITNET_E2E_LOCKED tells them they hold it).
#              Waits SPLITNET_LOCK_WAIT seconds at most (default 3600), then fails naming it.
e2e_lock() {
    local f=/run/lock/splitnet-e2e.lock wait=${SPLITNET_LOCK_WAIT:-3600}
    [ -n "${SPLITNET_E2E_LOCKED:-}" ] && return 0
    mkdir -p /run/lock && exec {SPLITNET_LOCK_FD}>>"$f" ||
        { echo "FAIL: cannot open the end-to-end lock $f" >&2; return 1; }
    if ! flock -n "$SPLITNET_LOCK_FD"; then
        echo "  another end-to-end run holds $f: waiting for it (at most $wait s)" >&2
        flock -w "$wait" "$SPLITNET_LOCK_FD" ||
            { echo "FAIL: another end-to-end run held $f for $wait s" >&2; return 1; }
    fi
    export SPLITNET_E2E_LOCKED=$$
}
