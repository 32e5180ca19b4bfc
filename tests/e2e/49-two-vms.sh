#!/usr/bin/env bash
# Two QEMU/TCG virtual machines on Debian's stock kernel (tests/vm/), "ioc" and "host", joined by
# a virtio-net wire (UDP on 127.0.0.1): groundwork for the RDMA verbs transport. In both VMs
# fq_codel, 802.1Q and bonding work and Soft-RoCE (rdma_rxe) on eth0 is ACTIVE. Over TCP between
# the VMs (eth0, 10.201.0.1 and 10.201.0.2), ioc-driver owns lan0 (a veth whose peer lan1,
# 10.50.0.2, is in namespace "lan") and host-driver makes sd0 (10.50.0.1): ping through sd0, and
# 20 MiB each way between the host VM and the LAN peer with SHA-256 checks. Prints the ioc VM's
# rxe counters. Functional checks only: TCG is ~10x slower, nothing here is timed.
#
# The same file runs inside each VM (tests/vm/guest.sh sources it):
#   49-two-vms.sh guest ioc|host CONF_DIR BIN_DIR
set -u

FILE_BYTES=$((20 * 1024 * 1024))

# ---------------------------------------------------------------------------------------------
# Inside the VMs (helpers vm_step, vm_run, vm_result, ... from tests/vm/guest.sh; guest_* from
# tests/vm/splitnet.sh)

# guest_ioc CONF BIN: the IOC with the LAN peer in namespace "lan"; stays up until the host VM
# is done, then records the transfers and rxe0's counters.
guest_ioc() {
    local conf=$1 bin=$2 ioc
    guest_common 10.201.0.1
    guest_lan
    vm_step "ioc-driver on 10.201.0.1:7400, owning lan0"
    "$bin/ioc-driver" --config "$conf/ioc.toml" --control-socket /run/ioc.sock \
        >"$VM_OUT/ioc-driver.log" 2>&1 &
    ioc=$!
    guest_wait_daemon "$ioc" "$VM_OUT/ioc-driver.log" 60 guest_listening 7400
    guest_lan_files
    vm_signal ioc-ready
    vm_step "waiting for the host VM to finish"
    vm_await_exit host 480 || vm_die "the host VM did not finish within 480 s"
    guest_lan_files_done
    "$bin/splitnetctl" -s /run/ioc.sock --json stats >"$VM_OUT/ioc-stats.json" ||
        vm_die "splitnetctl stats (ioc-driver) failed"
    guest_stop "$ioc" ioc_driver
    guest_rxe_counters
}

# guest_host CONF BIN: host-driver with sd0 10.50.0.1/24; once the IOC is ready: ping the LAN
# peer, send it a file, fetch one from it.
guest_host() {
    local conf=$1 bin=$2 host out
    guest_common 10.201.0.2
    vm_step "fabric: ping the ioc VM over eth0"
    out=$(ping -c 3 -i 0.5 -W 5 10.201.0.1 2>&1) || vm_die "ping 10.201.0.1 over eth0: $out"
    vm_result fabric_ping "$(echo "$out" | grep 'packets transmitted')"
    guest_host_driver "$conf" "$bin"
    host=$HOST
    vm_step "ping 10.50.0.2 through sd0"
    out=$(ping -c 5 -i 0.5 -W 5 10.50.0.2 2>&1) || vm_die "ping 10.50.0.2: $out"
    vm_result lan_ping "$(echo "$out" | grep 'packets transmitted')"
    guest_host_files
    "$bin/splitnetctl" -s /run/host.sock --json stats >"$VM_OUT/host-stats.json" ||
        vm_die "splitnetctl stats (host-driver) failed"
    guest_stop "$host" host_driver
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
# tests/lib.sh's fail shows the tail of every $T/*.log: the daemons' logs in the VMs too.
ln -s vm-ioc/out/ioc-driver.log "$T/ioc.log"
ln -s vm-host/out/host-driver.log "$T/host.log"

vm_run_pair "$SELF" "$T/conf"

for vm in ioc host; do
    assert_match "$(vm_result_get $vm fq_codel)" '^qdisc fq_codel 1: root ' "$vm VM: eth0's root qdisc"
    assert_match "$(vm_result_get $vm vlan)" '^vlan protocol 802\.1Q id 100$' "$vm VM: VLAN eth0.100"
    assert_match "$(vm_result_get $vm bond)" '^active-backup 1 *$' "$vm VM: bond0's mode"
    assert_match "$(vm_result_get $vm rxe)" '^link rxe0/1 state ACTIVE .*netdev eth0' "$vm VM: rxe0"
    log "$vm VM: eth0 root qdisc $(vm_result_get $vm fq_codel | cut -d' ' -f2) (default_qdisc" \
        "$(vm_result_get $vm default_qdisc)); $(vm_result_get $vm vlan); bond0 $(vm_result_get $vm bond);" \
        "$(vm_result_get $vm rxe)"
done
assert_match "$(vm_result_get host fabric_ping)" '^3 packets transmitted, 3 received' "ping ioc VM over eth0"
assert_match "$(vm_result_get host lan_ping)" '^5 packets transmitted, 5 received' "ping 10.50.0.2 through sd0"
log "ping through sd0: $(vm_result_get host lan_ping)"

assert_files

# What each daemon counted on the fabric: both files went through them, without errors.
for d in host ioc; do
    read -r tx rx errors < <(fabric_counters "$(vm_out $d)/$d-stats.json") ||
        fail "cannot read the $d VM's daemon stats ($(vm_out $d)/$d-stats.json)"
    assert_ge "$tx" "$FILE_BYTES" "bytes the $d VM's daemon sent over the fabric"
    assert_ge "$rx" "$FILE_BYTES" "bytes the $d VM's daemon received over the fabric"
    assert_eq "$errors" 0 "protocol and protection errors the $d VM's daemon saw"
    log "$d VM daemon, fabric: tx $tx bytes, rx $rx bytes, 0 errors"
done
log "fabric sessions the IOC accepted: $(grep -c 'host connected' "$(vm_out ioc)/ioc-driver.log") (1 unless TCG stalls tripped a keepalive)"
assert_daemons_stopped
assert_rxe_counters
pass "two VMs: fq_codel, 802.1Q, bonding, Soft-RoCE ACTIVE; splitnet over TCP: ping and 20 MiB each way intact"
