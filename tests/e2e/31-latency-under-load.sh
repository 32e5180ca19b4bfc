#!/usr/bin/env bash
# Latency under load: a ping every 10 ms during an iperf3 upload, then a download, through sd0
# is answered, through the express lane both ways (docs/protocol.md 6.6: the host's counts of
# frames sent and received in it grow by at least the pings answered); during the upload the host's byte limit on what it has in flight to the IOC
# held it back and shrank under the standing queue, and its flow queue dropped nothing of the
# upload. Both ends speak ECN (the queues' marks are logged: here the standing queue is the
# fabric's token bucket, not splitnet's). Counters from splitnetctl, never timings
# (bench/run.py measures those). The fabric is made the bottleneck (a token bucket of
# 400 Mbit/s on the sending side's fabric link), as a link slower than the daemons is between
# two machines, so that a queue stands behind the limit whatever this machine's CPUs do.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 ping python3 ss tc; need_daemons
# The IOC returns credits one at a time, so that what completes at once is small beside the
# host's limit and a standing queue shows (a batch of 16 elements of 64 KiB would be the
# limit itself).
sed 's/^credit_batch = 16$/credit_batch = 1/' "$IOC_CONF" >"$T/ioc.toml"
grep -q '^credit_batch = 1$' "$T/ioc.toml" || fail "no credit_batch line to change in $IOC_CONF"
# Host 2 connects over the IOC's local socket, its data channel in shared memory.
sock=$T/fabric.sock
sed -i "s|^listen = .*|&\nlisten_local = \"$sock\"|" "$T/ioc.toml"
grep -q "^listen_local = \"$sock\"" "$T/ioc.toml" || fail "could not set listen_local"
IOC_CONF=$T/ioc.toml
# The express lane is off by default (README, "The express lane"): asked for here.
sed 's/^express = false$/express = true/' "$HOST_CONF" >"$T/host.toml"
grep -q '^express = true$' "$T/host.toml" || fail "no 'express = false' line in $HOST_CONF"
sed "s|^ioc = .*|ioc = \"unix:$sock\"|" "$T/host.toml" >"$T/host-shm.toml"
grep -q "^ioc = \"unix:$sock\"" "$T/host-shm.toml" || fail "could not set host 2's fabric address"
HOST_CONF=$T/host.toml
topo_up 2
# ECN-capable TCP on both ends: a queue that must shed marks these flows instead.
for ns in sd-host sd-lan; do run ip netns exec "$ns" sysctl -qw net.ipv4.tcp_ecn=1; done
start_ioc; start_host 1; HOST_CONF=$T/host-shm.toml start_host 2
wait_carrier sd-host up 10; wait_carrier sd-host2 up 10
ping_ok sd-host 10.50.0.2
LIMIT="d['stats']['tx_limit']"

# under_load WHAT PORT NS DEV [IPERF-ARGS...]: with a token bucket of 400 Mbit/s on DEV (the
# sender's fabric link, in NS), a ping every 10 ms during a 6 s iperf3 run. Returns 1 when
# fewer than 285 of the 300 pings were answered.
under_load() {
    local what=$1 port=$2 ns=$3 dev=$4
    shift 4
    run ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate 400mbit burst 256kb latency 50ms
    iperf sd-host 10.50.0.2 "$port" -t 6 "$@" >"$T/$what.out" &
    local load=$! received
    sleep 1.5
    ip netns exec sd-host ping -i 0.01 -c 300 -W 1 -q 10.50.0.2 >"$T/ping-$what.out" 2>&1
    wait "$load" || fail "iperf3 $what: $(cat "$T/$what.out")"
    run ip netns exec "$ns" tc qdisc del dev "$dev" root
    received=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$T/ping-$what.out")
    log "$what $(cat "$T/$what.out") Gb/s; ping: $(tail -n 1 "$T/ping-$what.out")"
    [ "${received:-0}" -ge 285 ]
}

# again WHAT ARGS...: under_load, and once more after a host restart when the pings fell
# short. The flow keys are random per connection: about one run in 500 the ping shares the
# bulk flow's bucket (1024 of them) and is dropped with its backlog; new keys part them.
again() {
    under_load "$@" && return
    log "$1: pings fell short; once more with new flow keys (a host restart)"
    stop_host 1; start_host 1; wait_carrier sd-host up 10
    under_load "$@" || fail "$1: fewer than 285 of 300 pings answered, twice"
}

# express FIELD: the host's count of frames it sent (tx_express) or received (rx_express) in
# the express lane.
express() { ctl_json "$T/host${2:-1}.sock" stats "d['stats']['$1']"; }

# check_express WHAT TX0 RX0: the pings of WHAT took the express lane both ways: at least as
# many frames each way as pings were answered since the counts were TX0 and RX0.
check_express() {
    local what=$1 tx rx received
    tx=$(( $(express tx_express) - $2 )); rx=$(( $(express rx_express) - $3 ))
    received=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$T/ping-$what.out")
    log "$what: $tx frames to the IOC and $rx from it in the express lane; $received pings answered"
    assert_ge "$tx" "$received" "frames the host sent in the express lane during the $what"
    assert_ge "$rx" "$received" "frames the host received in the express lane during the $what"
}

tx0=$(express tx_express); rx0=$(express rx_express)
again upload 5301 sd-host fab0
check_express upload "$tx0" "$rx0"
read -r bytes shrunk held < <(ctl_json "$T/host1.sock" stats \
    "${LIMIT}['limit_bytes'], ${LIMIT}['shrunk'], ${LIMIT}['held_back']" | tr -d '(),')
log "upload: byte limit $bytes bytes after (128 KiB at start over TCP); shrunk $shrunk times, held the sender back $held times"
assert_ge "$held" 1 "times the host's byte limit held it back"
assert_ge "$shrunk" 1 "times the host's byte limit shrank under the standing queue"
"$BIN/splitnetctl" -s "$T/host1.sock" stats | grep -q "in flight to the IOC at most" ||
    fail "splitnetctl stats does not show the host's byte limit"
# Nothing of the upload was dropped by the host's flow queue (marked, if it stood that long).
read -r marked dropped < <(ctl_json "$T/host1.sock" stats \
    "${LIMIT}['ce_marked'], ${LIMIT}['queue_drops']" | tr -d '(),')
log "upload: $marked frames marked CE by the host's flow queue, $dropped dropped"
assert_eq "$dropped" 0 "frames of the upload dropped by the host's flow queue"
tx0=$(express tx_express); rx0=$(express rx_express)
again download 5302 sd-ioc fab1 -R
check_express download "$tx0" "$rx0"
marked=$(ctl_json "$T/ioc.sock" hosts "sum(h['ce_marked'] for h in d['hosts']['hosts'])")
log "download: $marked frames marked CE in the host's receive ring on the IOC"

# Over shared memory: host 2's LAN frames come from its own queue on the IOC, read straight
# into its pools; the replies to its pings during a download (400 Mbit/s, iperf3's own
# pacing) take the express lane from there, its requests from its TAP read in place.
placed() { ctl_json "$T/ioc.sock" hosts "next(h['in_place'] for h in d['hosts']['hosts'] if 'shared memory' in h['address'])"; }
tx0=$(express tx_express 2); rx0=$(express rx_express 2); placed0=$(placed)
iperf sd-host2 10.50.0.2 5303 -t 6 -R -b 400M >"$T/shm.out" &
load=$!
sleep 1.5
ip netns exec sd-host2 ping -i 0.01 -c 300 -W 1 -q 10.50.0.2 >"$T/ping-shm.out" 2>&1
wait "$load" || fail "iperf3 download over shared memory: $(cat "$T/shm.out")"
received=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$T/ping-shm.out")
tx=$(( $(express tx_express 2) - tx0 )); rx=$(( $(express rx_express 2) - rx0 ))
placed=$(( $(placed) - placed0 ))
log "shared memory: download $(cat "$T/shm.out") Gb/s, $placed frames read in place from the host's own queue; $tx frames to the IOC and $rx from it in the express lane; $received pings answered"
assert_ge "${received:-0}" 285 "pings answered during the download over shared memory"
assert_ge "$placed" 1000 "frames of the download read from the host's own queue into its pools"
assert_ge "$tx" "$received" "frames host 2 sent in the express lane"
assert_ge "$rx" "$received" "frames host 2 received in the express lane (from its own queue)"
pass "pings during an upload and a download are answered and took the express lane both ways, over TCP and over shared memory (from the host's own queue); the host's byte limit held back and shrank; its flow queue dropped nothing"
