#!/usr/bin/env bash
# Runs a test's script inside a harness VM: `guest.sh SCRIPT [ARG...]` (tests/vm/init.sh starts
# it through /vm/out/run.sh, written by vm_start) defines the helpers below, then sources
# SCRIPT with ARGs as its positional parameters. The script's exit status is the VM's status.
#
# In the VM: the host's filesystem is visible read-only (writes land in the VM's memory),
# VM_OUT (/vm/out) is the VM's results directory on the host, VM_SHARED (/vm/shared) a
# directory every VM of the test shares, VM_NAME the VM's name. The host's tools are on PATH;
# modprobe, insmod, rmmod, lsmod and modinfo are busybox's (see init.sh).
set -u
VM_T0=$(date +%s)

# vm_step TEXT: says what the VM does now: on stderr (timestamped) and in VM_OUT/step, which
# the host quotes when the VM times out.
vm_step() {
    printf '== %s +%ss: %s\n' "$VM_NAME" $(($(date +%s) - VM_T0)) "$*" >&2
    printf '%s\n' "$*" >"$VM_OUT/step"
}

# vm_die MESSAGE: ends the script with status 1, saying why (and what it was doing).
vm_die() {
    printf 'FAIL in VM %s (%s): %s\n' "$VM_NAME" "$(cat "$VM_OUT/step" 2>/dev/null)" "$*" >&2
    exit 1
}

# vm_run CMD...: runs a set-up command; on error ends the script with the command and its output.
vm_run() {
    local out
    out=$("$@" 2>&1) || vm_die "command failed: $* => ${out:-no output}"
}

# vm_result KEY VALUE...: records KEY=VALUE (one line) in VM_OUT/results for the host's
# assertions (vm_result_get there).
vm_result() {
    local key=$1
    shift
    printf '%s=%s\n' "$key" "$(printf '%s' "$*" | tr '\n' ' ')" >>"$VM_OUT/results"
}

# vm_signal WORD: tells the other VMs of the test that WORD happened.
vm_signal() { : >"$VM_SHARED/$1"; }

# vm_await WORD SECONDS: waits until some VM signalled WORD; false after SECONDS.
vm_await() {
    local end=$(($(date +%s) + $2))
    while [ ! -e "$VM_SHARED/$1" ]; do
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.2
    done
}

# vm_await_exit PEER SECONDS: waits until VM PEER's script has ended (its status, written by
# its init); false after SECONDS.
vm_await_exit() { vm_await "$1.status" "$2"; }

# vm_until SECONDS CMD...: retries CMD every 0.2 s until it succeeds; false after SECONDS.
vm_until() {
    local end=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.2
    done
}

[ $# -ge 1 ] || vm_die "guest.sh: no script given"
vm_script=$1
shift
# shellcheck disable=SC1090  # the test's script, named by the host
. "$vm_script"
