#!/usr/bin/env bash
# Shared helpers of the end-to-end tests: the reference topology of DESIGN.md in network
# namespaces, the two daemons, and assertions. Every test sources this file, builds its own
# topology and removes it on exit, even on failure. Traffic only ever goes to addresses
# inside these namespaces.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SPLITNET_BIN:-$ROOT/target/release}
HOST_CONF=${HOST_CONF:-$ROOT/systemd/host.toml}
IOC_CONF=${IOC_CONF:-$ROOT/systemd/ioc.toml}
T=$(mktemp -d /tmp/splitnet-test.XXXXXX)
PIDS=()
NETNS=()

log() { printf '  %s\n' "$*"; }
fail() {
    printf 'FAIL: %s\n' "$*" >&2
    for f in "$T"/*.log; do [ -f "$f" ] && { echo "--- $f (last 15 lines)" >&2; tail -n 15 "$f" >&2; }; done
    exit 1
}

need_root() { [ "$(id -u)" = 0 ] || fail "needs root (network namespaces, TAP, AF_PACKET): run with sudo"; }

need_tools() {
    local t
    for t in "$@"; do
        command -v "$t" >/dev/null 2>&1 || fail "missing tool '$t' (apt install: see .ci/run)"
    done
    [ -x "$BIN/host-driver" ] && [ -x "$BIN/ioc-driver" ] || fail "daemons not built in $BIN: run cargo build --release"
}

cleanup() {
    local p n
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    for n in "${NETNS[@]}"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$n" 2>/dev/null
        rm -rf "/etc/netns/$n"
    done
    rm -rf "$T"
}
trap cleanup EXIT

# host_ns K: namespace of host K (1 is sd-host, K>1 is sd-hostK).
host_ns() { if [ "$1" = 1 ]; then echo sd-host; else echo "sd-host$1"; fi; }
# host_ip K: sd0's IPv4 address of host K (.1 for host 1, .K+1 otherwise; .2 is the LAN peer).
host_ip() { if [ "$1" = 1 ]; then echo 10.50.0.1; else echo "10.50.0.$(($1 + 1))"; fi; }
host_ip6() { if [ "$1" = 1 ]; then echo fd50::1; else echo "fd50::$(($1 + 1))"; fi; }

addns() { ip netns add "$1" || fail "ip netns add $1"; NETNS+=("$1"); ip -n "$1" link set lo up; }

# topo_up N [LAN_MTU]: the reference topology with N hosts (1..8).
topo_up() {
    local n=$1 mtu=${2:-1500} k ns
    for ns in sd-host sd-ioc sd-lan $(seq -f 'sd-host%g' 2 8); do
        ip netns list | grep -qw "^$ns" && fail "namespace $ns already exists (another test running?)"
    done
    addns sd-ioc; addns sd-lan
    ip link add lan0 netns sd-ioc type veth peer name lan1 netns sd-lan
    ip -n sd-ioc link set lan0 mtu "$mtu"; ip -n sd-lan link set lan1 mtu "$mtu"
    ip -n sd-lan addr add 10.50.0.2/24 dev lan1
    ip -n sd-lan addr add fd50::2/64 dev lan1 nodad
    ip -n sd-lan link set lan1 up
    if [ "$n" = 1 ]; then
        addns sd-host
        ip link add fab0 netns sd-host type veth peer name fab1 netns sd-ioc
        ip -n sd-host addr add 10.200.0.1/24 dev fab0; ip -n sd-host link set fab0 up
        ip -n sd-ioc addr add 10.200.0.2/24 dev fab1; ip -n sd-ioc link set fab1 up
        return
    fi
    ip -n sd-ioc link add fabbr type bridge
    ip -n sd-ioc addr add 10.200.0.2/24 dev fabbr; ip -n sd-ioc link set fabbr up
    for k in $(seq 1 "$n"); do
        ns=$(host_ns "$k"); addns "$ns"
        ip link add fab0 netns "$ns" type veth peer name "fab$((2 * k - 1))" netns sd-ioc
        if [ "$k" = 1 ]; then ip -n "$ns" addr add 10.200.0.1/24 dev fab0
        else ip -n "$ns" addr add "10.200.0.$((10 + k))/24" dev fab0; fi
        ip -n "$ns" link set fab0 up
        ip -n sd-ioc link set "fab$((2 * k - 1))" master fabbr
        ip -n sd-ioc link set "fab$((2 * k - 1))" up
    done
}

# start_ioc: ioc-driver in sd-ioc; IOC_PID is set.
start_ioc() {
    ip netns exec sd-ioc "$BIN/ioc-driver" --config "$IOC_CONF" >>"$T/ioc.log" 2>&1 &
    IOC_PID=$!; PIDS+=("$IOC_PID")
    local i
    for i in $(seq 50); do
        ip netns exec sd-ioc ss -ltn 2>/dev/null | grep -q '10.200.0.2:7400' && return 0
        kill -0 "$IOC_PID" 2>/dev/null || fail "ioc-driver exited at start"
        sleep 0.1
    done
    fail "ioc-driver is not listening on 10.200.0.2:7400"
}

# start_host K: host-driver in host K's namespace; HOST_PID[K] is set; sd0 gets its addresses.
declare -A HOST_PID
start_host() {
    local k=$1 ns; ns=$(host_ns "$1")
    ip netns exec "$ns" "$BIN/host-driver" --config "$HOST_CONF" >>"$T/host$k.log" 2>&1 &
    HOST_PID[$k]=$!; PIDS+=("${HOST_PID[$k]}")
    local i
    for i in $(seq 50); do ip -n "$ns" link show sd0 >/dev/null 2>&1 && break; sleep 0.1; done
    ip -n "$ns" link show sd0 >/dev/null 2>&1 || fail "host-driver did not create sd0 in $ns"
    [ "${NO_ADDR:-0}" = 1 ] || {
        ip -n "$ns" addr add "$(host_ip "$k")/24" dev sd0
        ip -n "$ns" addr add "$(host_ip6 "$k")/64" dev sd0 nodad
    }
    ip -n "$ns" link set sd0 up
}

# carrier NS: prints "up" or "down".
carrier() { if ip -n "$1" link show sd0 2>/dev/null | grep -q 'LOWER_UP'; then echo up; else echo down; fi; }

# wait_carrier NS up|down [SECONDS]: waits, prints the time it took in ms.
wait_carrier() {
    local ns=$1 want=$2 max=${3:-10} start now
    start=$(date +%s%N)
    while true; do
        [ "$(carrier "$ns")" = "$want" ] && { now=$(date +%s%N); echo $(((now - start) / 1000000)); return 0; }
        now=$(date +%s%N)
        [ $(((now - start) / 1000000000)) -ge "$max" ] && fail "sd0 in $ns not $want within ${max}s"
        sleep 0.02
    done
}

# ping_ok NS ADDR [ARGS...]
ping_ok() {
    local ns=$1 addr=$2; shift 2
    ip netns exec "$ns" ping -q -c 3 -i 0.2 -W 2 "$@" "$addr" >"$T/ping.out" 2>&1 ||
        fail "ping $addr from $ns failed: $(tail -n 2 "$T/ping.out" | tr '\n' ' ')"
}

# iperf NS SERVER_ADDR PORT [ARGS...]: runs a client against a one-shot server in sd-lan (or
# SERVER_NS) and prints the received rate in Gb/s.
iperf() {
    local ns=$1 addr=$2 port=$3; shift 3
    local sns=${SERVER_NS:-sd-lan}
    ip netns exec "$sns" timeout 30 iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    sleep 0.3
    timeout 30 ip netns exec "$ns" iperf3 -c "$addr" -p "$port" -J "$@" >"$T/iperf.$port.json" 2>&1 ||
        fail "iperf3 $* from $ns to $addr failed: $(grep -o '"error":.*' "$T/iperf.$port.json")"
    python3 - "$T/iperf.$port.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d: sys.exit("iperf3 error: " + d["error"])
s = d["end"].get("sum_received") or d["end"]["sum"]
print("%.2f" % (s["bits_per_second"] / 1e9))
PY
}

pass() { printf 'PASS: %s\n' "$1"; }

# fds PID / rss_kib PID: open descriptors and resident memory of a process.
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
rss_kib() { awk '/VmRSS/{print $2}' "/proc/$1/status" 2>/dev/null; }
