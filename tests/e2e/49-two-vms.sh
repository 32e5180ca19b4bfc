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
# Inside the VMs (helpers vm_step, vm_run, vm_result, ... from tests/vm/guest.sh)

# guest_common ADDR: eth0 up with ADDR/24; fq_codel, 802.1Q and bonding exist; Soft-RoCE rxe0
# on eth0. Records what it found, for the host's assertions.
guest_common() {
    vm_step "eth0 up with $1/24"
    vm_run ip addr add "$1/24" dev eth0
    vm_run ip link set eth0 up
    vm_step "fq_codel as eth0's root qdisc"
    vm_run tc qdisc replace dev eth0 root handle 1: fq_codel
    vm_result fq_codel "$(tc qdisc show dev eth0 root)"
    vm_result default_qdisc "$(cat /proc/sys/net/core/default_qdisc)"
    vm_step "802.1Q: modprobe 8021q, VLAN eth0.100"
    vm_run modprobe 8021q
    vm_run ip link add link eth0 name eth0.100 type vlan id 100
    vm_result vlan "$(ip -d link show eth0.100 | grep -o 'vlan protocol [^ ]* id [0-9]*')"
    vm_run ip link del eth0.100
    vm_step "bonding: modprobe bonding, bond0"
    vm_run modprobe bonding max_bonds=0
    vm_run ip link add bond0 type bond mode active-backup
    vm_result bond "$(cat /sys/class/net/bond0/bonding/mode)"
    vm_run ip link del bond0
    vm_step "Soft-RoCE: rdma_rxe, rdma_ucm, rxe0 on eth0"
    vm_run modprobe rdma_rxe
    vm_run modprobe rdma_ucm
    vm_run rdma link add rxe0 type rxe netdev eth0
    vm_until 30 eval "rdma link show rxe0/1 | grep -q 'state ACTIVE'"
    vm_result rxe "$(rdma link show rxe0/1 2>&1)"
}

# guest_listening [NETNS] PORT: something listens on TCP PORT (in NETNS, if given).
guest_listening() {
    if [ $# = 2 ]; then
        ip netns exec "$1" ss -Hltn "sport = :$2" | grep -q .
    else
        ss -Hltn "sport = :$1" | grep -q .
    fi
}

# guest_has_link DEV: network interface DEV exists.
guest_has_link() { ip link show "$1" >/dev/null 2>&1; }

# guest_wait_daemon PID LOG SECONDS CMD...: waits until CMD succeeds while the daemon PID runs;
# ends the script (with the log's tail) when the daemon exits or SECONDS pass.
guest_wait_daemon() {
    local pid=$1 log=$2 secs=$3 end=$(($(date +%s) + $3))
    shift 3
    until "$@"; do
        kill -0 "$pid" 2>/dev/null || vm_die "$(basename "$log" .log) exited: $(tail -n 5 "$log" | tr '\n' ' ')"
        [ "$(date +%s)" -lt "$end" ] || vm_die "$(basename "$log" .log): '$*' not true after $secs s"
        sleep 0.2
    done
}

# guest_stop PID KEY: SIGTERM to a daemon; records KEY=running|gone before, KEY_exit after.
guest_stop() {
    if kill -0 "$1" 2>/dev/null; then vm_result "$2" running; else vm_result "$2" gone; fi
    kill -TERM "$1" 2>/dev/null
    wait "$1"
    vm_result "$2_exit" "$?"
}

# guest_ioc CONF BIN: the IOC with the LAN peer in namespace "lan"; stays up until the host VM
# is done, then records the transfers and rxe0's counters.
guest_ioc() {
    local conf=$1 bin=$2 ioc up down
    guest_common 10.201.0.1
    vm_step "LAN: veth lan0, peer lan1 (10.50.0.2/24) in namespace lan"
    vm_run modprobe veth
    vm_run ip netns add lan
    vm_run ip link add lan0 type veth peer name lan1 netns lan
    vm_run ip -n lan addr add 10.50.0.2/24 dev lan1
    vm_run ip -n lan link set lo up
    vm_run ip -n lan link set lan1 up
    vm_run ip link set lan0 up
    vm_step "ioc-driver on 10.201.0.1:7400, owning lan0"
    "$bin/ioc-driver" --config "$conf/ioc.toml" --control-socket /run/ioc.sock \
        >"$VM_OUT/ioc-driver.log" 2>&1 &
    ioc=$!
    guest_wait_daemon "$ioc" "$VM_OUT/ioc-driver.log" 60 guest_listening 7400
    vm_step "LAN peer: one-shot receiver on 5001, sender on 5002 ($FILE_BYTES random bytes)"
    mkdir -p /run/xfer
    head -c "$FILE_BYTES" /dev/urandom >/run/xfer/down.bin
    ip netns exec lan python3 "$VM_ROOT/tests/vm/tcpfile.py" listen 5001 recv /run/xfer/up.bin 300 \
        >"$VM_OUT/lan-recv.txt" 2>&1 &
    up=$!
    ip netns exec lan python3 "$VM_ROOT/tests/vm/tcpfile.py" listen 5002 send /run/xfer/down.bin 300 \
        >"$VM_OUT/lan-send.txt" 2>&1 &
    down=$!
    vm_until 60 guest_listening lan 5001 && vm_until 60 guest_listening lan 5002 ||
        vm_die "the LAN peer's transfer ends do not listen after 60 s"
    vm_signal ioc-ready
    vm_step "waiting for the host VM to finish"
    vm_await_exit host 480 || vm_die "the host VM did not finish within 480 s"
    vm_step "LAN peer: transfer results"
    wait "$up"
    vm_result lan_recv "rc=$? $(cat "$VM_OUT/lan-recv.txt")"
    wait "$down"
    vm_result lan_send "rc=$? $(cat "$VM_OUT/lan-send.txt")"
    "$bin/splitnetctl" -s /run/ioc.sock --json stats >"$VM_OUT/ioc-stats.json" ||
        vm_die "splitnetctl stats (ioc-driver) failed"
    guest_stop "$ioc" ioc_driver
    vm_step "rxe counters"
    for f in /sys/class/infiniband/*/ports/1/hw_counters/*; do
        printf '%s=%s\n' "$(basename "$f")" "$(cat "$f")"
    done | tee "$VM_OUT/rxe-counters"
}

# guest_host CONF BIN: host-driver with sd0 10.50.0.1/24; once the IOC is ready: ping the LAN
# peer, send it a file, fetch one from it.
guest_host() {
    local conf=$1 bin=$2 host out
    guest_common 10.201.0.2
    vm_step "fabric: ping the ioc VM over eth0"
    out=$(ping -c 3 -i 0.5 -W 5 10.201.0.1 2>&1) || vm_die "ping 10.201.0.1 over eth0: $out"
    vm_result fabric_ping "$(echo "$out" | grep 'packets transmitted')"
    vm_step "host-driver: sd0 10.50.0.1/24"
    vm_run modprobe tun
    "$bin/host-driver" --config "$conf/host.toml" --control-socket /run/host.sock \
        >"$VM_OUT/host-driver.log" 2>&1 &
    host=$!
    guest_wait_daemon "$host" "$VM_OUT/host-driver.log" 60 guest_has_link sd0
    vm_run ip addr add 10.50.0.1/24 dev sd0
    vm_run ip link set sd0 up
    vm_step "waiting for the ioc VM (ioc-driver and the LAN peer ready)"
    vm_until 300 eval '[ -e "$VM_SHARED/ioc-ready" ] || [ -e "$VM_SHARED/ioc.status" ]' &&
        [ -e "$VM_SHARED/ioc-ready" ] || vm_die "the ioc VM ended or was not ready within 300 s"
    vm_step "carrier on sd0"
    vm_until 60 eval "ip link show sd0 | grep -q LOWER_UP" || vm_die "no carrier on sd0 within 60 s"
    vm_step "ping 10.50.0.2 through sd0"
    out=$(ping -c 5 -i 0.5 -W 5 10.50.0.2 2>&1) || vm_die "ping 10.50.0.2: $out"
    vm_result lan_ping "$(echo "$out" | grep 'packets transmitted')"
    vm_step "upload: $FILE_BYTES random bytes to 10.50.0.2:5001"
    mkdir -p /run/xfer
    head -c "$FILE_BYTES" /dev/urandom >/run/xfer/up.bin
    out=$(python3 "$VM_ROOT/tests/vm/tcpfile.py" connect 10.50.0.2 5001 send /run/xfer/up.bin 120 2>&1) ||
        vm_die "upload: $out"
    vm_result upload "$out"
    vm_step "download: from 10.50.0.2:5002"
    out=$(python3 "$VM_ROOT/tests/vm/tcpfile.py" connect 10.50.0.2 5002 recv /run/xfer/down.bin 120 2>&1) ||
        vm_die "download: $out"
    vm_result download "$out"
    "$bin/splitnetctl" -s /run/host.sock --json stats >"$VM_OUT/host-stats.json" ||
        vm_die "splitnetctl stats (host-driver) failed"
    guest_stop "$host" host_driver
}

if [ "${1:-}" = guest ]; then
    case ${2:-} in
        ioc) guest_ioc "$3" "$4" ;;
        host) guest_host "$3" "$4" ;;
        *) vm_die "unknown VM role '${2:-}'" ;;
    esac
    exit
fi

# ---------------------------------------------------------------------------------------------
# On this machine

. "$(dirname "$0")/../lib.sh"
# shellcheck source=../vm/lib.sh
. "$ROOT/tests/vm/lib.sh"

# vm_configs DIR: the daemons' configurations for the VMs, DIR/ioc.toml and DIR/host.toml:
# tests/lib.sh's IOC_CONF and HOST_CONF (systemd/ioc.toml and systemd/host.toml, with the keys
# of its keys_up where it has one) with the VMs' fabric addresses, and host 1's key named as a
# file (the VM has no systemd credential). Every configuration the VMs use is made here (the
# one place to adapt when the configurations change). The VMs see $T as it is on this machine.
vm_configs() {
    local dir=$1 key=$T/cred/host1/splitnet.key
    mkdir -p "$dir"
    sed 's/^listen = "10\.200\.0\.2:7400"$/listen = "10.201.0.1:7400"/' "$IOC_CONF" >"$dir/ioc.toml"
    sed 's/^ioc = "10\.200\.0\.2:7400"$/ioc = "10.201.0.1:7400"/' "$HOST_CONF" >"$dir/host.toml"
    grep -q '^listen = "10.201.0.1:7400"$' "$dir/ioc.toml" ||
        fail "vm_configs: $IOC_CONF has no fabric.listen = \"10.200.0.2:7400\" to rewrite"
    grep -q '^ioc = "10.201.0.1:7400"$' "$dir/host.toml" ||
        fail "vm_configs: $HOST_CONF has no fabric.ioc = \"10.200.0.2:7400\" to rewrite"
    if [ -e "$key" ]; then
        sed -i "s|^# private_key_file = .*|private_key_file = \"$key\"|" "$dir/host.toml"
        grep -q "^private_key_file = \"$key\"" "$dir/host.toml" ||
            fail "vm_configs: no '# private_key_file =' line in $HOST_CONF to name host 1's key"
    fi
}

# field KEY LINE: the value of KEY=VALUE in a line of such words.
field() { sed -n "s/.*\<$1=\([^ ]*\).*/\1/p" <<<"$2"; }

# assert_transfer WHAT SENT RECEIVED: both tcpfile.py lines report FILE_BYTES and one SHA-256.
assert_transfer() {
    assert_eq "$(field bytes "$2")" "$FILE_BYTES" "$1: bytes sent"
    assert_eq "$(field bytes "$3")" "$FILE_BYTES" "$1: bytes received"
    assert_match "$(field sha256 "$2")" '^[0-9a-f]{64}$' "$1: SHA-256 of what was sent"
    assert_eq "$(field sha256 "$3")" "$(field sha256 "$2")" "$1: SHA-256 of what was received"
}

# fabric_counters FILE: "TX_BYTES RX_BYTES ERRORS" of a daemon's `splitnetctl --json stats`.
fabric_counters() {
    python3 -c "import json, sys
f = json.load(open(sys.argv[1]))['stats']['fabric']
print(f['tx']['bytes'], f['rx']['bytes'], f['protocol_errors'] + f['protection_errors'])" "$1"
}

need_root; need_tool python3 ss; need_daemons
SELF=$(realpath "$0")
start=$SECONDS
vm_setup || fail "VM set-up: $VM_ERROR"
log "VMs: kernel $VM_KVER, set-up $((SECONDS - start)) s (cache: $VM_CACHE)"
# The daemons as they are now: a rebuild during the run does not change them.
mkdir -p "$T/bin"
cp "$BIN/ioc-driver" "$BIN/host-driver" "$BIN/splitnetctl" "$T/bin/" || fail "cannot copy the daemons from $BIN"
vm_configs "$T/conf"
# tests/lib.sh's fail shows the tail of every $T/*.log: the daemons' logs in the VMs too.
ln -s vm-ioc/out/ioc-driver.log "$T/ioc.log"
ln -s vm-host/out/host-driver.log "$T/host.log"

vm_pair ioc host || fail "$VM_ERROR"
start=$SECONDS
vm_start ioc "$SELF" guest ioc "$T/conf" "$T/bin" || fail "$VM_ERROR"
vm_start host "$SELF" guest host "$T/conf" "$T/bin" || fail "$VM_ERROR"
vm_wait_all ioc host || fail "$VM_ERROR"
log "both VMs done in $((SECONDS - start)) s (ioc ${VM_ELAPSED[ioc]} s, host ${VM_ELAPSED[host]} s)"

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

up=$(vm_result_get host upload)
down=$(vm_result_get host download)
lan_recv=$(vm_result_get ioc lan_recv)
lan_send=$(vm_result_get ioc lan_send)
assert_eq "$(field rc "$lan_recv")" 0 "LAN peer's receiver exit status ($lan_recv)"
assert_eq "$(field rc "$lan_send")" 0 "LAN peer's sender exit status ($lan_send)"
assert_transfer "upload host VM -> LAN peer" "$up" "$lan_recv"
assert_transfer "download LAN peer -> host VM" "$lan_send" "$down"
log "upload: $up; download: $down (TCG: not a throughput figure)"

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
for d in ioc:ioc_driver host:host_driver; do
    assert_eq "$(vm_result_get "${d%%:*}" "${d#*:}")" running "${d#*:} alive until the end"
    assert_eq "$(vm_result_get "${d%%:*}" "${d#*:}_exit")" 0 "${d#*:} exit status on SIGTERM"
done

counters=$(vm_out ioc)/rxe-counters
assert_ge "$(grep -c . "$counters")" 1 "rxe0 counters in the ioc VM"
assert_no_grep "$counters" '^([^=]*$|[^=]*=.*[^0-9].*|[^=]*=$)' "rxe0 counters are name=number"
log "ioc VM rxe0 counters ($(grep -c . "$counters")):"
sed 's/^/    /' "$counters"
pass "two VMs: fq_codel, 802.1Q, bonding, Soft-RoCE ACTIVE; splitnet over TCP: ping and 20 MiB each way intact"
