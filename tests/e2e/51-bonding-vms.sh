#!/usr/bin/env bash
# The kernel's way to survive an IOC's loss (README, "Two IOCs with Linux bonding"), in the
# two QEMU/TCG VMs of tests/vm (this machine's kernel has no bonding): the ioc VM runs two
# ioc-drivers on the same LAN NIC (lan0), A on 10.201.0.1:7400 and B on :7401, each admitting
# the host with the same `mac`; the host VM runs two host-drivers, sd0 to A and sd1 to B (both
# fabric.restart_grace_ms = 0), enslaved to bond0 (active-backup, miimon 50, primary sd0)
# with 10.50.0.1. Across `kill -9` of A while the host pings the LAN peer every 100 ms and
# uploads 8 MiB to it: the upload arrives intact (SHA-256), no reply is duplicated, bond0's
# active slave is sd1 afterwards, and the replies lost are printed (TCG: not a timing).
#
# The same file runs inside each VM (tests/vm/guest.sh sources it):
#   51-bonding-vms.sh guest ioc|host CONF_DIR BIN_DIR
set -u

FILE_BYTES=$((8 * 1024 * 1024))

# ---------------------------------------------------------------------------------------------
# Inside the VMs

# guest_ioc CONF BIN: IOCs A and B on lan0; kills A when the host VM asks, then records the
# upload the LAN peer received.
guest_ioc() {
    local conf=$1 bin=$2 a b recv
    guest_fabric 10.201.0.1
    guest_lan
    vm_step "ioc-driver A on 10.201.0.1:7400 and B on :7401, both owning lan0"
    "$bin/ioc-driver" --config "$conf/ioc.toml" --control-socket /run/ioc-a.sock \
        >"$VM_OUT/ioc-a.log" 2>&1 &
    a=$!
    "$bin/ioc-driver" --config "$conf/ioc-b.toml" --control-socket /run/ioc-b.sock \
        >"$VM_OUT/ioc-b.log" 2>&1 &
    b=$!
    guest_wait_daemon "$a" "$VM_OUT/ioc-a.log" 60 guest_listening 7400
    guest_wait_daemon "$b" "$VM_OUT/ioc-b.log" 60 guest_listening 7401
    vm_step "LAN peer: one-shot receiver on 5001"
    ip netns exec lan python3 "$VM_ROOT/tests/vm/tcpfile.py" listen 5001 recv /run/up.bin 300 \
        >"$VM_OUT/lan-recv.txt" 2>&1 &
    recv=$!
    vm_until 60 guest_listening lan 5001 || vm_die "the LAN peer's receiver does not listen"
    vm_signal ioc-ready
    vm_step "waiting for the host VM to ask for A's end"
    vm_await kill-a 300 || vm_die "the host VM did not ask for A's end within 300 s"
    kill -9 "$a"
    wait "$a"
    vm_result ioc_a_exit "$?"
    vm_signal a-killed
    vm_step "waiting for the host VM to finish"
    vm_await_exit host 300 || vm_die "the host VM did not finish within 300 s"
    wait "$recv"
    vm_result lan_recv "rc=$? $(cat "$VM_OUT/lan-recv.txt")"
    guest_stop "$b" ioc_b
}

# guest_host CONF BIN: sd0 (to A) and sd1 (to B) in bond0; the ping and the upload across A's
# end.
guest_host() {
    local conf=$1 bin=$2 a b ping up out
    guest_fabric 10.201.0.2
    vm_run modprobe tun
    vm_run modprobe bonding max_bonds=0
    vm_step "host-drivers: sd0 to A, sd1 to B"
    "$bin/host-driver" --config "$conf/host.toml" --control-socket /run/host-a.sock \
        >"$VM_OUT/host-a.log" 2>&1 &
    a=$!
    "$bin/host-driver" --config "$conf/host-b.toml" --control-socket /run/host-b.sock \
        >"$VM_OUT/host-b.log" 2>&1 &
    b=$!
    guest_wait_daemon "$a" "$VM_OUT/host-a.log" 60 guest_has_link sd0
    guest_wait_daemon "$b" "$VM_OUT/host-b.log" 60 guest_has_link sd1
    vm_step "waiting for the ioc VM (both IOCs and the LAN peer ready)"
    vm_until 300 eval '[ -e "$VM_SHARED/ioc-ready" ] || [ -e "$VM_SHARED/ioc.status" ]' &&
        [ -e "$VM_SHARED/ioc-ready" ] || vm_die "the ioc VM ended or was not ready within 300 s"
    vm_step "both sd0 and sd1 connected (the MAC the IOCs assign)"
    vm_run ip link set sd0 up
    vm_run ip link set sd1 up
    vm_until 60 eval "ip link show sd0 | grep -q LOWER_UP && ip link show sd1 | grep -q LOWER_UP" ||
        vm_die "no carrier on sd0 and sd1 within 60 s"
    vm_result macs "$(cat /sys/class/net/sd0/address) $(cat /sys/class/net/sd1/address)"
    vm_step "bond0: active-backup over sd0 (primary) and sd1, 10.50.0.1/24"
    vm_run ip link add bond0 type bond mode active-backup miimon 50 primary sd0
    vm_run ip link set sd0 down
    vm_run ip link set sd0 master bond0
    vm_run ip link set sd1 down
    vm_run ip link set sd1 master bond0
    vm_run ip addr add 10.50.0.1/24 dev bond0
    vm_run ip link set bond0 up
    vm_until 30 eval 'grep -q "^sd0$" /sys/class/net/bond0/bonding/active_slave' ||
        vm_die "sd0 is not bond0's active slave: $(cat /sys/class/net/bond0/bonding/active_slave)"
    vm_result active_before "$(cat /sys/class/net/bond0/bonding/active_slave)"
    vm_step "ping 10.50.0.2 through bond0"
    out=$(ping -c 3 -i 0.5 -W 5 10.50.0.2 2>&1) || vm_die "ping 10.50.0.2 through bond0: $out"
    vm_step "A killed during a ping every 100 ms and an upload of $FILE_BYTES bytes"
    head -c "$FILE_BYTES" /dev/urandom >/run/up.bin
    ping -i 0.1 -c 150 -W 2 10.50.0.2 >"$VM_OUT/ping.txt" 2>&1 &
    ping=$!
    python3 "$VM_ROOT/tests/vm/tcpfile.py" connect 10.50.0.2 5001 send /run/up.bin 240 \
        >"$VM_OUT/upload.txt" 2>&1 &
    up=$!
    sleep 3
    vm_signal kill-a
    vm_await a-killed 60 || vm_die "the ioc VM did not end A within 60 s"
    wait "$up"
    vm_result upload "rc=$? $(cat "$VM_OUT/upload.txt")"
    wait "$ping"
    vm_result ping "$(grep 'packets transmitted' "$VM_OUT/ping.txt")"
    vm_result ping_dups "$(grep -c 'DUP!' "$VM_OUT/ping.txt")"
    vm_result active_after "$(cat /sys/class/net/bond0/bonding/active_slave)"
    vm_result sd0_carrier "$(cat /sys/class/net/sd0/carrier 2>/dev/null)"
    guest_stop "$b" host_b
    guest_stop "$a" host_a
}

if [ "${1:-}" = guest ]; then
    # shellcheck source=../vm/splitnet.sh
    . "$VM_ROOT/tests/vm/splitnet.sh"
    guest_main "$@"
fi

# ---------------------------------------------------------------------------------------------
# On this machine

. "$(dirname "$0")/../lib.sh"
# shellcheck source=../vm/lib.sh
. "$ROOT/tests/vm/lib.sh"
# shellcheck source=../vm/splitnet.sh
. "$ROOT/tests/vm/splitnet.sh"

need_root; need_tool python3 ss; need_daemons
SELF=$(realpath "$0")
vm_prepare
vm_configs "$T/conf"
# The host's entry on both IOCs names its MAC (README: a derived MAC depends on what else is
# in use on each IOC); the second IOC listens on 7401; both hosts drop sd0's carrier at
# once when their IOC goes (bonding must see it).
MAC=02:5d:00:00:51:01
sed -i "/^name = \"host1\"$/a mac = \"$MAC\"" "$T/conf/ioc.toml"
grep -q "^mac = \"$MAC\"$" "$T/conf/ioc.toml" || fail "cannot name host1's MAC in the IOC's configuration"
sed 's/^listen = "10\.201\.0\.1:7400"$/listen = "10.201.0.1:7401"/' "$T/conf/ioc.toml" >"$T/conf/ioc-b.toml"
grep -q '^listen = "10.201.0.1:7401"$' "$T/conf/ioc-b.toml" || fail "cannot make IOC B's configuration"
sed -i 's/^restart_grace_ms = .*/restart_grace_ms = 0/' "$T/conf/host.toml"
sed -e 's/^ioc = "10\.201\.0\.1:7400"$/ioc = "10.201.0.1:7401"/' -e 's/^name = "sd0"$/name = "sd1"/' \
    "$T/conf/host.toml" >"$T/conf/host-b.toml"
grep -q '^ioc = "10.201.0.1:7401"$' "$T/conf/host-b.toml" && grep -q '^name = "sd1"$' "$T/conf/host-b.toml" &&
    grep -q '^restart_grace_ms = 0$' "$T/conf/host-b.toml" || fail "cannot make sd1's host configuration"
for f in ioc-a ioc-b; do ln -s "vm-ioc/out/$f.log" "$T/$f.log"; done
for f in host-a host-b; do ln -s "vm-host/out/$f.log" "$T/$f.log"; done

vm_run_pair "$SELF" "$T/conf"

assert_eq "$(vm_result_get host macs)" "$MAC $MAC" "sd0's and sd1's MACs (from the IOCs' entries)"
assert_eq "$(vm_result_get host active_before)" sd0 "bond0's active slave before A's end"
assert_eq "$(vm_result_get ioc ioc_a_exit)" 137 "IOC A's end (kill -9)"
assert_eq "$(vm_result_get host active_after)" sd1 "bond0's active slave after A's end"
assert_eq "$(vm_result_get host sd0_carrier)" 0 "sd0's carrier after A's end"
up=$(vm_result_get host upload)
recv=$(vm_result_get ioc lan_recv)
assert_eq "$(field rc "$up")" 0 "the host's upload across A's end ($up)"
assert_eq "$(field rc "$recv")" 0 "the LAN peer's receiver ($recv)"
assert_transfer "upload host VM -> LAN peer across A's end" "$up" "$recv"
ping=$(vm_result_get host ping)
assert_match "$ping" '^150 packets transmitted, [0-9]+ received' "the host's ping across A's end"
assert_eq "$(vm_result_get host ping_dups)" 0 "duplicated ping replies"
got=$(sed 's/^150 packets transmitted, \([0-9]*\) received.*/\1/' <<<"$ping")
# Most replies come back: only those while bonding moves to sd1 may be lost.
assert_ge "$got" 100 "ping replies received (of 150)"
for d in host:host_a host:host_b ioc:ioc_b; do
    assert_eq "$(vm_result_get "${d%%:*}" "${d#*:}")" running "${d#*:} alive until the end"
    assert_eq "$(vm_result_get "${d%%:*}" "${d#*:}_exit")" 0 "${d#*:} exit status on SIGTERM"
done
log "across kill -9 of IOC A: $ping; bond0 moved sd0 -> sd1; upload intact ($up)"
pass "two IOCs under Linux bonding in two VMs: kill -9 of the active one, bond0 on the other, upload intact, no duplicate reply"
