#!/usr/bin/env bash
# Latency under load, both ways: a ping every 10 ms while an iperf3 upload (then a download)
# runs through sd0 is answered, and the sender's byte limit on what is in flight (the host's
# towards the IOC, then the IOC's towards the host) held the sender back and shrank under the
# standing queue. Counters from splitnetctl, never timings (bench/run.py measures those). The
# fabric is made the bottleneck (a token bucket of 400 Mbit/s on the sending side's fabric
# link), as a link slower than the daemons is between two machines, so that a queue stands
# behind the limit whatever this machine's CPUs do.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 ping python3 ss tc; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2

# under_load WHAT PORT NS DEV SOCKET COMMAND LIMIT [IPERF-ARGS...]: with a token bucket of
# 400 Mbit/s on DEV (the sender's fabric link, in NS), a ping every 10 ms during a 6 s iperf3
# run; 285 of 300 answered at least; the sender's byte limit (LIMIT, a Python expression on
# SOCKET's reply to COMMAND) held it back and shrank.
under_load() {
    local what=$1 port=$2 ns=$3 dev=$4 sock=$5 cmd=$6 limit=$7
    shift 7
    local start received bytes shrunk held
    start=$(ctl_json "$sock" "$cmd" "${limit}['limit_bytes']")
    assert_positive "$start" "$what: byte limit at start"
    run ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate 400mbit burst 256kb latency 50ms
    iperf sd-host 10.50.0.2 "$port" -t 6 "$@" >"$T/$what.out" &
    local load=$!
    sleep 1.5
    ip netns exec sd-host ping -i 0.01 -c 300 -W 1 -q 10.50.0.2 >"$T/ping-$what.out" 2>&1
    wait "$load" || fail "iperf3 $what: $(cat "$T/$what.out")"
    run ip netns exec "$ns" tc qdisc del dev "$dev" root
    received=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$T/ping-$what.out")
    log "$what $(cat "$T/$what.out") Gb/s; ping: $(tail -n 1 "$T/ping-$what.out")"
    assert_ge "${received:-0}" 285 "pings answered during the $what (of 300)"
    read -r bytes shrunk held < <(ctl_json "$sock" "$cmd" \
        "${limit}['limit_bytes'], ${limit}['shrunk'], ${limit}['held_back']" | tr -d '(),')
    log "$what: byte limit $start at start, $bytes after; shrunk $shrunk times, held the sender back $held times"
    assert_ge "$held" 1 "$what: times the byte limit held the sender back"
    assert_ge "$shrunk" 1 "$what: times the byte limit shrank under the standing queue"
}

# Upload: the host's limit towards the IOC; download: the IOC's towards the host.
under_load upload 5301 sd-host fab0 "$T/host1.sock" stats "d['stats']['tx_limit']"
"$BIN/splitnetctl" -s "$T/host1.sock" stats | grep -q "in flight to the IOC at most" ||
    fail "splitnetctl stats does not show the host's byte limit"
under_load download 5302 sd-ioc fab1 "$T/ioc.sock" hosts "d['hosts']['hosts'][0]['tx_limit']" -R
pass "pings during an upload and a download are answered; both byte limits held back and shrank"
