# splitnet's daemons in the harness VMs (tests/vm/lib.sh): what the two-VM tests share.
# Sourced by a test both inside its VMs (the guest_* helpers, which use tests/vm/guest.sh's)
# and on this machine (vm_configs and the assertions, which use tests/lib.sh's).
# shellcheck shell=bash

# ---------------------------------------------------------------------------------------------
# Inside the VMs

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

# ---------------------------------------------------------------------------------------------
# On this machine

# vm_configs DIR: the daemons' configurations for the VMs, DIR/ioc.toml and DIR/host.toml:
# tests/lib.sh's IOC_CONF and HOST_CONF (systemd/ioc.toml and systemd/host.toml, with the keys
# of its keys_up where it has one) with the VMs' fabric addresses, and host 1's key named as a
# file (the VM has no systemd credential). Every configuration the VMs use is made here (the
# one place to adapt when the configurations change). The VMs see $T as it is on this machine.
# With a second argument "rdma": the host's data channel over RDMA verbs (fabric.ioc =
# "rdma:10.201.0.1:7400") and the IOC taking such channels (fabric.rdma = true for the
# configuration's rdma = false).
vm_configs() {
    local dir=$1 mode=${2:-tcp} key=$T/cred/host1/splitnet.key
    mkdir -p "$dir"
    sed 's/^listen = "10\.200\.0\.2:7400"$/listen = "10.201.0.1:7400"/' "$IOC_CONF" >"$dir/ioc.toml"
    sed 's/^ioc = "10\.200\.0\.2:7400"$/ioc = "10.201.0.1:7400"/' "$HOST_CONF" >"$dir/host.toml"
    grep -q '^listen = "10.201.0.1:7400"$' "$dir/ioc.toml" ||
        fail "vm_configs: $IOC_CONF has no fabric.listen = \"10.200.0.2:7400\" to rewrite"
    grep -q '^ioc = "10.201.0.1:7400"$' "$dir/host.toml" ||
        fail "vm_configs: $HOST_CONF has no fabric.ioc = \"10.200.0.2:7400\" to rewrite"
    if [ "$mode" = rdma ]; then
        sed -i 's/^rdma = false$/rdma = true/' "$dir/ioc.toml"
        sed -i 's/^ioc = "10\.201\.0\.1:7400"$/ioc = "rdma:10.201.0.1:7400"/' "$dir/host.toml"
        grep -q '^rdma = true$' "$dir/ioc.toml" && grep -q '^ioc = "rdma:' "$dir/host.toml" ||
            fail "vm_configs: cannot set the RDMA addresses"
    fi
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

