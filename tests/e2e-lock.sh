#!/usr/bin/env bash
# One end-to-end run at a time on a machine: the tests, the demo and tests/run-all.sh share
# namespace and interface names (sd-host, sd-ioc, lan0, ...). Sourced by tests/lib.sh and
# tests/run-all.sh. A second run (a test started by hand during CI, CI during another CI) waits
# for the first instead of failing on its namespaces.
#
#   e2e_lock   as root, takes /run/splitnet-e2e.lock for the rest of the calling shell's life
#              and its children's (they inherit it; SPLITNET_E2E_LOCKED tells them they hold
#              it), and writes its pid there. Waits SPLITNET_LOCK_WAIT seconds at most
#              (default 3600), and fails at once when the run holding it is gone: its
#              processes (daemons of a killed test) keep the lock, and the namespaces, until
#              they are ended.
e2e_lock() {
    local f=/run/splitnet-e2e.lock wait=${SPLITNET_LOCK_WAIT:-3600} holder waited=0
    [ -n "${SPLITNET_E2E_LOCKED:-}" ] && return 0
    command -v flock >/dev/null || { echo "FAIL: flock is not installed (apt install util-linux)" >&2; return 1; }
    exec {SPLITNET_LOCK_FD}>>"$f" || { echo "FAIL: cannot open the end-to-end lock $f" >&2; return 1; }
    while ! flock -n "$SPLITNET_LOCK_FD"; do
        holder=$(cat "$f" 2>/dev/null)
        if [ -n "$holder" ] && ! kill -0 "$holder" 2>/dev/null; then
            exec {SPLITNET_LOCK_FD}>&-
            echo "FAIL: end-to-end run $holder is gone, and processes it left hold $f:" \
                "$(find /proc/[0-9]*/fd -lname "$f" 2>/dev/null | cut -d/ -f3 | sort -un | paste -sd ' ')" \
                "(end them, then ip netns del each sd-* namespace)" >&2
            return 1
        fi
        [ "$waited" = 0 ] && echo "  end-to-end run ${holder:-?} holds $f: waiting for it (at most $wait s)" >&2
        [ "$waited" -ge "$wait" ] && { echo "FAIL: end-to-end run ${holder:-?} held $f for $wait s" >&2; return 1; }
        sleep 1
        waited=$((waited + 1))
    done
    echo $$ >"$f"
    export SPLITNET_E2E_LOCKED=$$
}
