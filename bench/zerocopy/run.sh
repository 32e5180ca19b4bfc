#!/usr/bin/env bash
# MSG_ZEROCOPY against plain send() for a TCP stream between two namespaces over veth (the
# way the daemons' fabric runs on one machine): throughput, CPU per GB, and how many
# zerocopy sends the kernel reported as copied anyway (SO_EE_CODE_ZEROCOPY_COPIED).
#   sudo bench/zerocopy/run.sh [ROUNDS] [SECONDS]      (needs gcc, iproute2)
# Traffic only between 10.213.0.1 and 10.213.0.2 inside the two namespaces it creates.
set -u
ROUNDS=${1:-3}; SECS=${2:-5}
DIR=$(mktemp -d)
cleanup() { ip netns del zc-a 2>/dev/null; ip netns del zc-b 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT INT TERM
gcc -O2 -Wall -o "$DIR/zc" "$(dirname "$0")/zc.c" || exit 1
ip netns add zc-a && ip netns add zc-b || exit 1
ip link add zca netns zc-a type veth peer name zcb netns zc-b
ip -n zc-a addr add 10.213.0.1/24 dev zca; ip -n zc-b addr add 10.213.0.2/24 dev zcb
for n in a b; do ip -n zc-$n link set lo up; ip -n zc-$n link set zc$n up; done
port=5200
for r in $(seq "$ROUNDS"); do
    for size in 65536 1500; do
        for mode in plain zc; do
            port=$((port + 1))
            ip netns exec zc-b "$DIR/zc" recv 10.213.0.2 "$port" >"$DIR/recv.out" &
            rpid=$!
            sleep 0.2
            s=$(ip netns exec zc-a "$DIR/zc" send 10.213.0.2 "$port" "$size" "$mode" "$SECS")
            wait "$rpid"
            echo "round=$r $s | $(cat "$DIR/recv.out")"
        done
    done
done
