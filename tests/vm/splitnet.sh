# splitnet's daemons in the harness VMs (tests/vm/lib.sh): what the two-VM tests share.
# Sourced by a test both inside its VMs (the guest_* helpers, which use tests/vm/guest.sh's)
# and on this machine (vm_configs and the assertions, which use tests/lib.sh's).
# shellcheck shell=bash

# ---------------------------------------------------------------------------------------------
# Inside the VMs

# guest_main guest ioc|host CONF BIN: runs the test's guest_ioc or guest_host with CONF and BIN
# (a test's arguments in its VMs), and ends the script.
guest_main() {
    case ${2:-} in
        ioc) guest_ioc "$3" "$4" ;;
        host) guest_host "$3" "$4" ;;
        *) vm_die "unknown VM role '${2:-}'" ;;
    esac
    exit
}

# guest_fabric ADDR: eth0, the wire between the VMs, up with ADDR/24.
guest_fabric() {
    vm_step "eth0 up with $1/24"
    vm_run ip addr add "$1/24" dev eth0
    vm_run ip link set eth0 up
}

# guest_common ADDR: eth0 up with ADDR/24 (guest_fabric); fq_codel, 802.1Q and bonding exist;
# Soft-RoCE rxe0 on eth0. Records what it found, for the host's assertions.
guest_common() {
    guest_fabric "$1"
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

# guest_host_driver CONF BIN [fd50::1/64]: host-driver with sd0 10.50.0.1/24 (and the IPv6
# address if given) up; returns once the ioc VM said it is ready and sd0 has its carrier. Its
# pid in HOST.
guest_host_driver() {
    vm_step "host-driver: sd0 10.50.0.1/24${3:+, $3}"
    vm_run modprobe tun
    "$2/host-driver" --config "$1/host.toml" --control-socket /run/host.sock \
        >"$VM_OUT/host-driver.log" 2>&1 &
    HOST=$!
    guest_wait_daemon "$HOST" "$VM_OUT/host-driver.log" 60 guest_has_link sd0
    vm_run ip addr add 10.50.0.1/24 dev sd0
    [ -z "${3:-}" ] || vm_run ip addr add "$3" dev sd0 nodad
    vm_run ip link set sd0 up
    vm_step "waiting for the ioc VM (ioc-driver and the LAN peer ready)"
    vm_until 300 eval '[ -e "$VM_SHARED/ioc-ready" ] || [ -e "$VM_SHARED/ioc.status" ]' &&
        [ -e "$VM_SHARED/ioc-ready" ] || vm_die "the ioc VM ended or was not ready within 300 s"
    vm_step "carrier on sd0"
    vm_until 60 eval "ip link show sd0 | grep -q LOWER_UP" || vm_die "no carrier on sd0 within 60 s"
}

# guest_lan [fd50::2/64]: the LAN: veth lan0, its peer lan1 (10.50.0.2/24, and the IPv6
# address if given) in namespace "lan".
guest_lan() {
    vm_step "LAN: veth lan0, peer lan1 (10.50.0.2/24${1:+, $1}) in namespace lan"
    vm_run modprobe veth
    vm_run ip netns add lan
    vm_run ip link add lan0 type veth peer name lan1 netns lan
    vm_run ip -n lan addr add 10.50.0.2/24 dev lan1
    [ -z "${1:-}" ] || vm_run ip -n lan addr add "$1" dev lan1 nodad
    vm_run ip -n lan link set lo up
    vm_run ip -n lan link set lan1 up
    vm_run ip link set lan0 up
}

# guest_lan_files: the LAN peer's one-shot file receiver on 5001 and sender on 5002
# (FILE_BYTES random bytes), listening when it returns; their pids in LAN_FILES.
guest_lan_files() {
    vm_step "LAN peer: one-shot receiver on 5001, sender on 5002 ($FILE_BYTES random bytes)"
    mkdir -p /run/xfer
    head -c "$FILE_BYTES" /dev/urandom >/run/xfer/down.bin
    ip netns exec lan python3 "$VM_ROOT/tests/vm/tcpfile.py" listen 5001 recv /run/xfer/up.bin 300 \
        >"$VM_OUT/lan-recv.txt" 2>&1 &
    LAN_FILES=$!
    ip netns exec lan python3 "$VM_ROOT/tests/vm/tcpfile.py" listen 5002 send /run/xfer/down.bin 300 \
        >"$VM_OUT/lan-send.txt" 2>&1 &
    LAN_FILES="$LAN_FILES $!"
    vm_until 60 guest_listening lan 5001 && vm_until 60 guest_listening lan 5002 ||
        vm_die "the LAN peer's transfer ends do not listen after 60 s"
}

# guest_lan_files_done: records what the LAN peer's file ends saw (lan_recv, lan_send).
guest_lan_files_done() {
    local recv send
    read -r recv send <<<"$LAN_FILES"
    vm_step "LAN peer: transfer results"
    wait "$recv"
    vm_result lan_recv "rc=$? $(cat "$VM_OUT/lan-recv.txt")"
    wait "$send"
    vm_result lan_send "rc=$? $(cat "$VM_OUT/lan-send.txt")"
}

# guest_host_files: the host sends the LAN peer FILE_BYTES random bytes and fetches its file
# (results upload, download).
guest_host_files() {
    local out
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
}

# guest_rxe_counters: every counter of the VM's rxe device, name=value, in VM_OUT/rxe-counters.
guest_rxe_counters() {
    vm_step "rxe counters"
    for f in /sys/class/infiniband/*/ports/1/hw_counters/*; do
        printf '%s=%s\n' "$(basename "$f")" "$(cat "$f")"
    done | tee "$VM_OUT/rxe-counters"
}

# ---------------------------------------------------------------------------------------------
# On this machine

# vm_prepare [PACKAGE...]: the harness set up (tests/vm/lib.sh's vm_setup, with PACKAGEs of
# this machine's the VMs need), said with the kernel and the time it took; then the daemons
# as they are now, copied into $T/bin for the VMs (a rebuild during the run does not change
# them).
vm_prepare() {
    local start=$SECONDS
    vm_setup "$@" || fail "VM set-up: $VM_ERROR"
    log "VMs: kernel $VM_KVER, set-up $((SECONDS - start)) s (cache: $VM_CACHE)"
    mkdir -p "$T/bin"
    cp "$BIN/ioc-driver" "$BIN/host-driver" "$BIN/splitnetctl" "$T/bin/" ||
        fail "cannot copy the daemons from $BIN"
}

# vm_run_pair SCRIPT CONF: the VMs "ioc" and "host" joined by a wire, each running SCRIPT's
# guest part of its role with the configurations in CONF and the daemons of vm_prepare;
# returns once both are done, and says how long they took.
vm_run_pair() {
    local start=$SECONDS
    vm_pair ioc host || fail "$VM_ERROR"
    vm_start ioc "$1" guest ioc "$2" "$T/bin" || fail "$VM_ERROR"
    vm_start host "$1" guest host "$2" "$T/bin" || fail "$VM_ERROR"
    vm_wait_all ioc host || fail "$VM_ERROR"
    log "both VMs done in $((SECONDS - start)) s (ioc ${VM_ELAPSED[ioc]} s, host ${VM_ELAPSED[host]} s)"
}

# vm_configs DIR: the daemons' configurations for the VMs, DIR/ioc.toml and DIR/host.toml:
# tests/lib.sh's IOC_CONF and HOST_CONF (systemd/ioc.toml and systemd/host.toml, with the keys
# of its keys_up where it has one) with the VMs' fabric addresses, and host 1's key named as a
# file (the VM has no systemd credential). Every configuration the VMs use is made here (the
# one place to adapt when the configurations change). The VMs see $T as it is on this machine.
# The IOC's handshake timeout is 10 s (TCG). With a second argument "rdma": the host's data channel over RDMA verbs (fabric.ioc =
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
    # TCG runs CPU work about 10x slower than this machine: a host's data channel (a Noise
    # handshake, over RDMA an 8 MiB registration and a connection manager's exchange) can
    # come more than the default 2 s after its control channel, and the IOC would drop the
    # session waiting for it (the rogue's "UnknownSession" in e2e 50, once in CI).
    sed -i 's/^handshake_timeout_ms = 2000$/handshake_timeout_ms = 10000/' "$dir/ioc.toml"
    grep -q '^handshake_timeout_ms = 10000$' "$dir/ioc.toml" ||
        fail "vm_configs: $IOC_CONF has no handshake_timeout_ms = 2000 to rewrite"
    # For the same reason a 750 ms keepalive timeout is 75 ms of this machine's time: a
    # TCG stall (the rogue's registrations in e2e 50, once in CI) ended host 1's session.
    # Both daemons wait 5 s; no VM test waits on a keepalive to see a peer go (a killed
    # daemon's sockets close, a killed IOC's queue pairs disconnect).
    sed -i 's/^keepalive_timeout_ms = 750$/keepalive_timeout_ms = 5000/' "$dir/ioc.toml" "$dir/host.toml"
    grep -q '^keepalive_timeout_ms = 5000$' "$dir/ioc.toml" && grep -q '^keepalive_timeout_ms = 5000$' "$dir/host.toml" ||
        fail "vm_configs: $IOC_CONF or $HOST_CONF has no keepalive_timeout_ms = 750 to rewrite"
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

# assert_files: both files went through intact (host VM's upload and download against the
# LAN peer's ends), and says so.
assert_files() {
    local up down lan_recv lan_send
    up=$(vm_result_get host upload)
    down=$(vm_result_get host download)
    lan_recv=$(vm_result_get ioc lan_recv)
    lan_send=$(vm_result_get ioc lan_send)
    assert_eq "$(field rc "$lan_recv")" 0 "LAN peer's receiver exit status ($lan_recv)"
    assert_eq "$(field rc "$lan_send")" 0 "LAN peer's sender exit status ($lan_send)"
    assert_transfer "upload host VM -> LAN peer" "$up" "$lan_recv"
    assert_transfer "download LAN peer -> host VM" "$lan_send" "$down"
    log "upload: $up; download: $down (TCG: not a throughput figure)"
}

# assert_daemons_stopped: both daemons ran until the end and exited 0 on SIGTERM.
assert_daemons_stopped() {
    local d
    for d in ioc:ioc_driver host:host_driver; do
        assert_eq "$(vm_result_get "${d%%:*}" "${d#*:}")" running "${d#*:} alive until the end"
        assert_eq "$(vm_result_get "${d%%:*}" "${d#*:}_exit")" 0 "${d#*:} exit status on SIGTERM"
    done
}

# assert_rxe_counters: the ioc VM's rxe counters were read, each name=number; prints them.
assert_rxe_counters() {
    local counters
    counters=$(vm_out ioc)/rxe-counters
    assert_ge "$(grep -c . "$counters")" 1 "rxe0 counters in the ioc VM"
    assert_no_grep "$counters" '^([^=]*$|[^=]*=.*[^0-9].*|[^=]*=$)' "rxe0 counters are name=number"
    log "ioc VM rxe0 counters ($(grep -c . "$counters")):"
    sed 's/^/    /' "$counters"
}
