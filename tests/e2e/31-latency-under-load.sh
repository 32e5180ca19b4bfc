#!/usr/bin/env bash
# Latency under load: a ping every 10 ms while an iperf3 upload runs through sd0 is answered,
# and the host's byte limit on what is in flight to the IOC held the sender back and shrank
# under the standing queue (counters from splitnetctl, never timings: bench/run.py measures
# those). The fabric is made the bottleneck (a token bucket of 400 Mbit/s on the host's
# fabric link), as a link slower than the host is between two machines, so that a queue
# stands behind the limit whatever this machine's CPUs do.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 ping python3 ss; need_daemons
CTL=$BIN/splitnetctl
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2

# json COMMAND EXPRESSION: evaluates EXPRESSION on the host's reply (as `d`).
json() {
    "$CTL" -s "$T/host1.sock" --json "$1" | python3 -c "import json, sys; d = json.load(sys.stdin); print($2)"
}
start=$(json stats "d['stats']['tx_limit']['limit_bytes']")
assert_positive "$start" "byte limit at start"

run ip netns exec sd-host tc qdisc add dev fab0 root tbf rate 400mbit burst 256kb latency 50ms
iperf sd-host 10.50.0.2 5301 -t 6 >"$T/upload.out" &
upload=$!
sleep 1.5
ip netns exec sd-host ping -i 0.01 -c 300 -W 1 -q 10.50.0.2 >"$T/ping.out" 2>&1
wait "$upload" || fail "iperf3 upload: $(cat "$T/upload.out")"
received=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$T/ping.out")
log "upload $(cat "$T/upload.out") Gb/s; ping: $(tail -n 1 "$T/ping.out")"
assert_ge "${received:-0}" 285 "pings answered during the upload (of 300)"

shrunk=$(json stats "d['stats']['tx_limit']['shrunk']")
held=$(json stats "d['stats']['tx_limit']['held_back']")
limit=$(json stats "d['stats']['tx_limit']['limit_bytes']")
log "byte limit: $start at start, $limit after; shrunk $shrunk times, held the sender back $held times"
assert_ge "$held" 1 "times the byte limit held the sender back"
assert_ge "$shrunk" 1 "times the byte limit shrank under the standing queue"
"$CTL" -s "$T/host1.sock" stats | grep -q "in flight to the IOC at most" ||
    fail "splitnetctl stats does not show the byte limit"
pass "a ping during an upload is answered; the byte limit held the sender back and shrank"
