#!/usr/bin/env bash
# The data channel over RDMA verbs, between two QEMU/TCG virtual machines on Debian's stock
# kernel (tests/vm/), "ioc" and "host", joined by a virtio-net wire (UDP on 127.0.0.1), each
# with Soft-RoCE (rdma_rxe) on eth0. The IOC takes RDMA data channels (fabric.rdma = true) and
# owns lan0, a veth whose peer lan1 (10.50.0.2, fd50::2) is in namespace "lan"; host-driver
# connects with fabric.ioc = "rdma:10.201.0.1:7400" and makes sd0 (10.50.0.1, fd50::1).
# Through sd0: ping over IPv4 and IPv6, 20 MiB each way with SHA-256 checks, iperf3 each way;
# a rogue host (an admitted key) writes where no credit of its covers, past the end of the pool its key
# registers, with a key that is no pool's, with its previous session's key, into the next element
# with an element's window key, with a window key it used once already (seed 004) and with the
# key of a pool it flushed, each refused (the IOC's checks, its adapter)
# while host 1 pings on; then the IOC is killed and started again and the host reconnects by
# itself (ping again); the host stops gracefully, then runs again with two queues (a queue pair
# each: ping, iperf3 -P 4). Both daemons say what their queue pairs carried (the frames as RDMA
# WRITE WITH IMMEDIATE); the ioc VM's rxe counters are printed. Functional checks only: TCG is
# ~10x slower, nothing here is timed.
#
# The same file runs inside each VM (tests/vm/guest.sh sources it):
#   50-rdma-vms.sh guest ioc|host CONF_DIR BIN_DIR
# In the ioc VM first: the verbs transport's integration test (fabric/tests/tcp_loopback.rs,
# `frames_each_way_over_rdma_verbs`: two queue pairs of rxe0 looped back, frames of every size
# each way checked byte for byte, the largest as RDMA WRITE with a BufferRDMAIndicate), with
# element windows and again with each pool's key, and the set-up's unit tests
# (fabric/src/verbs/setup.rs: a connection request needs the token the IOC sent, from the
# address it sent it to, once, 10.201.0.3 being the other address; a peer that takes no SEND
# breaks the queue pair after the stall time; a listener on [::] takes an IPv4 host).
set -u

FILE_BYTES=$((20 * 1024 * 1024))
# Frames each way in the integration test (100,000 on a real machine; TCG is ~10x slower).
VERBS_FRAMES=20000
# And with each pool's key instead of element windows (SPLITNET_VERBS_WINDOWS=off).
VERBS_FRAMES_NO_WINDOWS=5000

# ---------------------------------------------------------------------------------------------
# Inside the VMs (helpers vm_step, vm_run, vm_result, ... from tests/vm/guest.sh; guest_* from
# tests/vm/splitnet.sh)

# ioc_start CONF BIN: ioc-driver, its log appended to; waits until it listens. Sets IOC.
ioc_start() {
    "$2/ioc-driver" --config "$1/ioc.toml" --control-socket /run/ioc.sock \
        >>"$VM_OUT/ioc-driver.log" 2>&1 &
    IOC=$!
    guest_wait_daemon "$IOC" "$VM_OUT/ioc-driver.log" 60 guest_listening 7400
}

# guest_ioc CONF BIN: the IOC with the LAN peer in namespace "lan"; restarts when the host
# asks; stays up until the host VM is done, then records the transfers and rxe0's counters.
guest_ioc() {
    local conf=$1 bin=$2 iperf
    guest_common 10.201.0.1
    guest_lan fd50::2/64
    vm_step "the verbs transport's integration test: $VERBS_FRAMES frames each way over rxe0"
    SPLITNET_VERBS_ADDR=10.201.0.1 SPLITNET_VERBS_FRAMES=$VERBS_FRAMES "$bin/tcp_loopback" \
        --ignored --exact frames_each_way_over_rdma_verbs >"$VM_OUT/verbs-test.txt" 2>&1 ||
        vm_die "frames_each_way_over_rdma_verbs: $(tail -n 20 "$VM_OUT/verbs-test.txt" | tr '\n' ' ')"
    vm_result verbs_test "$(grep '^test result' "$VM_OUT/verbs-test.txt")"
    vm_step "the same without element windows (each pool's key): $VERBS_FRAMES_NO_WINDOWS frames each way"
    SPLITNET_VERBS_ADDR=10.201.0.1 SPLITNET_VERBS_FRAMES=$VERBS_FRAMES_NO_WINDOWS SPLITNET_VERBS_WINDOWS=off \
        "$bin/tcp_loopback" --ignored --exact frames_each_way_over_rdma_verbs >"$VM_OUT/verbs-test-keys.txt" 2>&1 ||
        vm_die "frames_each_way_over_rdma_verbs without windows: $(tail -n 20 "$VM_OUT/verbs-test-keys.txt" | tr '\n' ' ')"
    vm_result verbs_test_keys "$(grep '^test result' "$VM_OUT/verbs-test-keys.txt")"
    vm_step "the set-up's tests: tokens, addresses, once; a peer that takes no SEND"
    vm_run ip addr add 10.201.0.3/24 dev eth0
    SPLITNET_VERBS_ADDR=10.201.0.1 SPLITNET_VERBS_ALIAS=10.201.0.3 "$bin/fabric_unit" --ignored \
        --test-threads=1 --skip dual_stack verbs::setup::tests:: >"$VM_OUT/cm-test.txt" 2>&1 ||
        vm_die "the set-up's tests: $(tail -n 20 "$VM_OUT/cm-test.txt" | tr '\n' ' ')"
    vm_run ip addr del 10.201.0.3/24 dev eth0
    vm_result cm_test "$(grep '^test result' "$VM_OUT/cm-test.txt")"
    vm_step "a listener on [::] takes an IPv4 host's connection request"
    SPLITNET_VERBS_ADDR=10.201.0.1 "$bin/fabric_unit" --ignored --exact \
        verbs::setup::tests::a_dual_stack_listener_takes_an_ipv4_host >"$VM_OUT/dual-stack-test.txt" 2>&1 ||
        vm_die "the dual-stack listener's test: $(tail -n 20 "$VM_OUT/dual-stack-test.txt" | tr '\n' ' ')"
    vm_result dual_stack_test "$(grep '^test result' "$VM_OUT/dual-stack-test.txt")"
    vm_step "ioc-driver on 10.201.0.1:7400 taking RDMA data channels, owning lan0"
    ioc_start "$conf" "$bin"
    guest_lan_files
    vm_step "LAN peer: iperf3 server on 5201"
    ip netns exec lan iperf3 -s -p 5201 >"$VM_OUT/iperf3-server.txt" 2>&1 &
    iperf=$!
    vm_until 60 guest_listening lan 5201 || vm_die "the LAN peer's iperf3 does not listen after 60 s"
    vm_signal ioc-ready
    vm_step "waiting for the host to ask for an IOC restart"
    vm_await kill-ioc 420 || vm_die "the host VM did not get to the IOC restart within 420 s"
    vm_step "SIGKILL ioc-driver, then start it again"
    kill -KILL "$IOC"
    wait "$IOC" 2>/dev/null
    echo "=== ioc-driver killed, started again" >>"$VM_OUT/ioc-driver.log"
    ioc_start "$conf" "$bin"
    vm_signal ioc-restarted
    vm_step "waiting for the host VM to finish"
    vm_await_exit host 300 || vm_die "the host VM did not finish within 300 s"
    guest_lan_files_done
    kill "$iperf" 2>/dev/null
    guest_stop "$IOC" ioc_driver
    guest_rxe_counters
}

# guest_iperf NAME ARGS...: a 3 s iperf3 run to the LAN peer; records NAME=BYTES RETRANSMITS
# (bytes the receiver got) from its JSON.
guest_iperf() {
    local name=$1 out
    shift
    out=$(iperf3 -c 10.50.0.2 -p 5201 -t 3 -J "$@" 2>&1) || vm_die "iperf3 $*: $(echo "$out" | tail -n 5)"
    vm_result "$name" "$(echo "$out" | python3 -c 'import json, sys
e = json.load(sys.stdin)["end"]
print(int(e["sum_received"]["bytes"]), e["sum_sent"].get("retransmits", 0))')"
}

# guest_host CONF BIN: host-driver over RDMA with sd0; once the IOC is ready: pings, files,
# iperf3, the IOC's restart, a graceful stop.
guest_host() {
    local conf=$1 bin=$2 host out
    guest_common 10.201.0.2
    guest_host_driver "$conf" "$bin" fd50::1/64
    host=$HOST
    vm_step "ping 10.50.0.2 and fd50::2 through sd0"
    out=$(ping -c 5 -i 0.5 -W 5 10.50.0.2 2>&1) || vm_die "ping 10.50.0.2: $out"
    vm_result ping4 "$(echo "$out" | grep 'packets transmitted')"
    out=$(ping -6 -c 5 -i 0.5 -W 5 fd50::2 2>&1) || vm_die "ping fd50::2: $out"
    vm_result ping6 "$(echo "$out" | grep 'packets transmitted')"
    guest_host_files
    vm_step "iperf3 to and from 10.50.0.2"
    guest_iperf iperf_up
    guest_iperf iperf_down -R
    "$bin/splitnetctl" -s /run/host.sock --json stats >"$VM_OUT/host-stats.json" ||
        vm_die "splitnetctl stats (host-driver) failed"
    vm_step "a rogue host (host 2's key) writes without a credit, past its pool, with wrong and stale keys; host 1 pings meanwhile"
    # Every reply must come, however late: TCG stalls a VM for seconds at times (one run lost
    # 19 of 100 to a 2 s wait), and a timing decides nothing here. The slowest is recorded.
    ping -c 100 -i 0.1 -W 10 -w 60 10.50.0.2 >"$VM_OUT/ping-during-rogue.txt" 2>&1 &
    out=$!
    "$bin/rogue" rdma 10.201.0.1:7400 "$conf/host2.key" "$(cat "$conf/ioc.pub")" 2 \
        >"$VM_OUT/rogue.txt" 2>&1
    vm_result rogue_rc "$?"
    wait "$out"
    vm_result ping_during_rogue "$(grep -E 'packets transmitted|^rtt' "$VM_OUT/ping-during-rogue.txt")"
    vm_step "the IOC is killed and started again"
    vm_signal kill-ioc
    vm_await ioc-restarted 120 || vm_die "the IOC did not come back within 120 s"
    vm_step "host-driver reconnects by itself: ping 10.50.0.2"
    vm_until 90 ping -c 1 -W 2 10.50.0.2 || vm_die "no ping through sd0 within 90 s of the IOC's restart"
    # 1,000 bytes: more than SendData carries, so these cross as RDMA writes.
    out=$(ping -c 3 -s 1000 -i 0.5 -W 5 10.50.0.2 2>&1) || vm_die "ping after the IOC's restart: $out"
    vm_result ping_after_restart "$(echo "$out" | grep 'packets transmitted')"
    vm_step "graceful stop of host-driver"
    guest_stop "$host" host_driver
    vm_step "host-driver again with two queues: a queue pair each"
    sed 's/^queues = 1$/queues = 2/' "$conf/host.toml" >/run/host-2q.toml
    grep -q '^queues = 2$' /run/host-2q.toml || vm_die "no 'queues = 1' line in $conf/host.toml"
    # sd0 outlived the driver (a persistent TAP) with one queue: made again with two.
    vm_run ip link del sd0
    "$bin/host-driver" --config /run/host-2q.toml --control-socket /run/host.sock \
        >"$VM_OUT/host-driver-2q.log" 2>&1 &
    host=$!
    guest_wait_daemon "$host" "$VM_OUT/host-driver-2q.log" 60 guest_has_link sd0
    vm_run ip addr add 10.50.0.1/24 dev sd0
    vm_run ip link set sd0 up
    vm_until 60 eval "ip link show sd0 | grep -q LOWER_UP" || vm_die "no carrier on sd0 with two queues"
    out=$(ping -c 3 -s 1000 -i 0.5 -W 5 10.50.0.2 2>&1) || vm_die "ping with two queues: $out"
    vm_result ping_2q "$(echo "$out" | grep 'packets transmitted')"
    guest_iperf iperf_2q -P 4
    guest_stop "$host" host_driver_2q
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

# qp_stats LOG KEY [CHANNEL]: KEY's values in LOG's "RDMA queue pair closed" lines of CHANNEL's
# queue pairs (data or control; data if not given), one per line.
qp_stats() {
    grep 'RDMA queue pair closed' "$1" | grep -E "channel=\"?${3:-data}" | grep -o "\<$2=[0-9]*" |
        cut -d= -f2
}

# qp_total LOG KEY: their sum.
qp_total() { qp_stats "$1" "$2" "${3:-data}" | awk '{ s += $1 } END { print s + 0 }'; }

need_root; need_tool python3 ss iperf3; need_daemons
SELF=$(realpath "$0")
# rdma-core from this machine's / (the VMs see it): librdmacm1 (the connection manager) and
# ibverbs-providers (librxe, Soft-RoCE's user-space driver: without it libibverbs finds no
# device and librdmacm no connection manager), installed like QEMU when missing.
vm_prepare librdmacm1 ibverbs-providers
compgen -G '/usr/lib/*/librdmacm.so.1' >/dev/null ||
    fail "no RDMA connection manager library (/usr/lib/*/librdmacm.so.1): install librdmacm1"
compgen -G '/usr/lib/*/libibverbs/librxe-rdmav*.so' >/dev/null ||
    fail "no Soft-RoCE provider for libibverbs (/usr/lib/*/libibverbs/librxe-rdmav*.so): install ibverbs-providers"
# The integration test's binary, as `cargo test` built it (built now if it is not).
. "$ROOT/tests/cargo.sh"
need_cargo || fail "cargo is needed to find the verbs integration test"
# test_binary NAME ARGS...: the executable `cargo test --no-run ARGS` builds for target NAME.
test_binary() {
    local name=$1
    shift
    (cd "$ROOT" && as_user cargo test -q -p splitnet-fabric "$@" --no-run --message-format=json \
        2>/dev/null) | python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$name"
}
testbin=$(test_binary tcp_loopback --test tcp_loopback)
[ -x "$testbin" ] || fail "cannot build or find fabric's tcp_loopback test binary"
cp "$testbin" "$T/bin/tcp_loopback"
unitbin=$(test_binary splitnet_fabric --lib)
[ -x "$unitbin" ] || fail "cannot build or find fabric's unit test binary"
cp "$unitbin" "$T/bin/fabric_unit"
# The rogue host, with host 2's key and the IOC's public key.
need_rogue
cp "$ROGUE" "$T/bin/rogue" || fail "cannot copy $ROGUE"
vm_configs "$T/conf" rdma
# Host 1's entry allows the two queues of its second run (queues in [[auth.hosts]]).
sed -i 's/^queues = 1$/queues = 2/' "$T/conf/ioc.toml"
grep -q '^queues = 2$' "$T/conf/ioc.toml" || fail "cannot let host 1's entry have two queues"
cp "$T/cred/host2/splitnet.key" "$T/conf/host2.key" && printf '%s\n' "$IOC_PUB" >"$T/conf/ioc.pub" ||
    fail "cannot give the VMs host 2's key and the IOC's public key"
ln -s vm-ioc/out/ioc-driver.log "$T/ioc.log"
ln -s vm-host/out/host-driver.log "$T/host.log"

vm_run_pair "$SELF" "$T/conf"

for vm in ioc host; do
    assert_match "$(vm_result_get $vm rxe)" '^link rxe0/1 state ACTIVE .*netdev eth0' "$vm VM: rxe0"
done
ioc_log=$(vm_out ioc)/ioc-driver.log
host_log=$(vm_out host)/host-driver.log
assert_grep "$ioc_log" 'data channels over RDMA: connection requests on 10.201.0.1:7400 on rxe0' \
    "the IOC takes RDMA connection requests on rxe0"
assert_grep "$ioc_log" 'host connected peer=[^ ]*, RDMA' "the IOC took the host's data channel over RDMA"
assert_match "$(vm_result_get ioc verbs_test)" '^test result: ok\. 1 passed' "the verbs integration test in the ioc VM"
log "verbs integration test ($VERBS_FRAMES frames each way over rxe0): $(vm_result_get ioc verbs_test)"
assert_match "$(vm_result_get ioc verbs_test_keys)" '^test result: ok\. 1 passed' "the verbs integration test without element windows"
log "without element windows ($VERBS_FRAMES_NO_WINDOWS frames each way): $(vm_result_get ioc verbs_test_keys)"
assert_match "$(vm_result_get ioc cm_test)" '^test result: ok\. 2 passed' "the set-up's tests in the ioc VM (connection requests, a stalled peer)"
assert_match "$(vm_result_get ioc dual_stack_test)" '^test result: ok\. 1 passed' "a listener on [::] took an IPv4 host's connection request"

assert_match "$(vm_result_get host ping4)" '^5 packets transmitted, 5 received' "ping 10.50.0.2 through sd0"
assert_match "$(vm_result_get host ping6)" '^5 packets transmitted, 5 received' "ping fd50::2 through sd0"
log "ping through sd0: $(vm_result_get host ping4); IPv6: $(vm_result_get host ping6)"

assert_files
for dir in up down; do
    read -r bytes retr <<<"$(vm_result_get host "iperf_$dir")"
    assert_ge "${bytes:-0}" 1000000 "iperf3 $dir: bytes the receiver got in 3 s"
    log "iperf3 $dir: ${bytes:-0} bytes in 3 s, ${retr:-?} retransmits (TCG: not a throughput figure)"
done

read -r tx rx errors < <(fabric_counters "$(vm_out host)/host-stats.json") ||
    fail "cannot read the host VM's daemon stats"
assert_eq "$errors" 0 "protocol and protection errors host-driver saw"
log "host-driver, fabric before the IOC's restart: tx $tx bytes, rx $rx bytes, 0 errors"

# The frames crossed as RDMA WRITE WITH IMMEDIATE: the queue pairs' own counts, as both
# daemons logged them when their queue pairs closed (the IOC's first instance was killed and
# logged nothing: the host's first queue pair and the IOC's second say it all).
assert_ge "$(qp_stats "$host_log" write_imm_tx | wc -l)" 2 "host-driver's queue pairs closed (before and after the IOC's restart)"
host_imm=$(qp_total "$host_log" write_imm_tx)
host_imm_rx=$(qp_total "$host_log" write_imm_rx)
# Each file alone is at least this many writes of at most 64 KiB.
assert_ge "$host_imm" $((FILE_BYTES / 65536)) "RDMA WRITE WITH IMMEDIATE host-driver posted"
assert_ge "$host_imm_rx" $((FILE_BYTES / 65536)) "RDMA WRITE WITH IMMEDIATE host-driver received"
# The restarted IOC's part of its log; there the first data queue pair to close is the
# pings' session's (the two-queue run's come after it, in either order).
restarted=$T/ioc-restarted.log
sed -n '/^=== ioc-driver killed, started again$/,$p' "$ioc_log" >"$restarted"
assert_grep "$restarted" 'RDMA queue pair closed' "the restarted IOC's queue pairs closed"
assert_ge "$(qp_stats "$restarted" write_imm_rx | head -n 1)" 3 "RDMA WRITE WITH IMMEDIATE the restarted IOC received from host 1 (the pings)"
# One-touch element windows (seed 004): each side bound a window over every element it granted
# and closed it once the write into it was read.
for side in "$ioc_log:IOC" "$host_log:host-driver"; do
    writes=$(($(qp_total "${side%%:*}" write_imm_rx) + $(qp_total "${side%%:*}" write_rx)))
    assert_ge "$(qp_total "${side%%:*}" close)" "$writes" "windows the ${side#*:} closed (one per write it received: $writes)"
    assert_ge "$(qp_total "${side%%:*}" bind)" "$(qp_total "${side%%:*}" close)" "windows the ${side#*:} bound"
done
# The control channels on queue pairs of their own: messages only (keepalives, credits,
# CfgUtil), sealed, never a write.
assert_ge "$(qp_stats "$host_log" send_tx control | wc -l)" 2 "host-driver's control queue pairs closed (before and after the IOC's restart)"
assert_ge "$(qp_stats "$host_log" send_tx control | sort -n | tail -n 1)" 3 "messages host-driver sent on a control queue pair"
assert_eq "$(qp_total "$host_log" write_imm_tx control)$(qp_total "$host_log" write_tx control)" 00 "writes on host-driver's control queue pairs"
log "host-driver's queue pairs:"
grep 'RDMA queue pair closed' "$host_log" | sed 's/.*closed: /    /'
log "the IOC's queue pairs (the rogue's seven sessions, then host 1's after the restart):"
grep 'RDMA queue pair closed' "$ioc_log" | sed 's/.*closed: /    /'

# The rogue: each write refused (the first by the IOC's checks, the others by its adapter),
# and host 1 never noticed.
rogue=$(vm_out host)/rogue.txt
assert_eq "$(vm_result_get host rogue_rc)" 0 "rogue rdma exit status ($(tr '\n' ';' <"$rogue"))"
assert_grep "$rogue" '^rdma write naming no pool of its session: .*session ended' "a write its credits cannot cover ends the rogue's session"
assert_grep "$ioc_log" 'protection error: immediate data names pool reference 200, which this side never advertised' \
    "the IOC refused it as a protection error"
for what in "past its pool's end" 'with a wrong key' "with the previous session's key" \
    "into the next element with an element's window key" "with an element's window key used once already" \
    'into a pool it flushed, with its old key'; do
    assert_grep "$rogue" "^rdma write $what: .*refused by the adapter" "a write $what is refused by the IOC's adapter"
done
log "the IOC's reasons for ending sessions:"
grep -o 'host removed: .*' "$ioc_log" | sed 's/^/    /'
assert_ge "$(grep -c 'host removed: .*RDMA receive failed: remote access error' "$ioc_log")" 6 "the IOC ended the sessions its adapter refused writes of"
assert_match "$(vm_result_get host ping_during_rogue)" '^100 packets transmitted, 100 received' "host 1's pings during the rogue's attacks"
assert_eq "$(grep -c 'fabric lost' "$host_log")" 1 "host 1's session ended only when the IOC was killed"
assert_grep "$host_log" 'fabric lost: .*the peer disconnected \(RDMA_CM_EVENT_DISCONNECTED\)' \
    "host-driver saw the killed IOC's queue pairs go (the connection manager's disconnect)"
log "rogue over RDMA:"
sed 's/^/    /' "$rogue"
log "host 1 meanwhile: $(vm_result_get host ping_during_rogue)"

# Two queues: two sessions, each with its data channel on a queue pair of its own.
assert_match "$(vm_result_get host ping_2q)" '^3 packets transmitted, 3 received' "ping through sd0 with two queues"
read -r bytes _ <<<"$(vm_result_get host iperf_2q)"
assert_ge "${bytes:-0}" 1000000 "iperf3 -P 4 with two queues: bytes the receiver got in 3 s"
assert_eq "$(vm_result_get host host_driver_2q_exit)" 0 "host-driver with two queues: exit status on SIGTERM"
assert_eq "$(qp_stats "$(vm_out host)/host-driver-2q.log" send_tx | wc -l)" 2 "host-driver with two queues closed two data queue pairs"
assert_eq "$(qp_stats "$(vm_out host)/host-driver-2q.log" send_tx control | wc -l)" 2 "host-driver with two queues closed two control queue pairs"
assert_grep "$ioc_log" 'host connected peer=[^ ]*, RDMA .* queue=1 queues=2' "the IOC took the second queue's data channel over RDMA"
log "two queues over RDMA: $(vm_result_get host ping_2q); iperf3 -P 4 ${bytes:-0} bytes in 3 s;" \
    "RDMA WRITE WITH IMMEDIATE posted per queue pair: $(qp_stats "$(vm_out host)/host-driver-2q.log" write_imm_tx | tr '\n' ' ')"

assert_match "$(vm_result_get host ping_after_restart)" '^3 packets transmitted, 3 received' "ping after the IOC's restart"
assert_ge "$(grep -c 'host connected peer=[^ ]*, RDMA' "$ioc_log")" 2 "the host reconnected to the restarted IOC over RDMA"
assert_grep "$host_log" 'pools flushed' "host-driver's graceful stop flushed its pools with the IOC over RDMA"
assert_daemons_stopped
assert_rxe_counters
pass "RDMA verbs between two VMs: ping v4/v6, 20 MiB each way intact, iperf3 both ways, frames as RDMA WRITE WITH IMMEDIATE, reconnect after an IOC restart"
