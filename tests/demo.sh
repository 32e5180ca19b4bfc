#!/usr/bin/env bash
# The demo: builds splitnet, brings up the reference topology (host, IOC and LAN namespaces),
# starts both daemons, pings and runs a short iperf3 through sd0, and tears it all down.
set -u
cd "$(dirname "$0")/.."
echo "== building (cargo build --release)"
cargo build --release --workspace -q || exit 1
. tests/lib.sh
need_root; need_tools ip ping iperf3 python3
echo "== topology: sd-host (fab0 10.200.0.1) <-> sd-ioc (fab1 10.200.0.2, lan0) <-> sd-lan (lan1 10.50.0.2)"
topo_up 1
echo "== starting ioc-driver in sd-ioc (owns lan0, listens on 10.200.0.2:7400)"
start_ioc
echo "== starting host-driver in sd-host (creates TAP sd0, 10.50.0.1/24 and fd50::1/64)"
start_host 1
ms=$(wait_carrier sd-host up 10)
echo "   sd0 carrier up after ${ms} ms: $(ip -n sd-host -br link show sd0)"
echo "== ping 10.50.0.2 (the LAN peer) through sd0"
ip netns exec sd-host ping -c 5 -i 0.2 10.50.0.2 | tail -n 2 | sed 's/^/   /'
echo "== ping -6 fd50::2 through sd0"
ip netns exec sd-host ping -6 -c 3 -i 0.2 fd50::2 | tail -n 1 | sed 's/^/   /'
echo "== iperf3 TCP, 3 s each way"
echo "   host -> LAN: $(iperf sd-host 10.50.0.2 5201 -t 3) Gb/s"
echo "   LAN -> host: $(iperf sd-host 10.50.0.2 5202 -t 3 -R) Gb/s"
echo "== stopping (SIGTERM: pools flushed on both sides)"
kill -TERM "${HOST_PID[1]}"; wait "${HOST_PID[1]}"
kill -TERM "$IOC_PID"; wait "$IOC_PID"
grep -h -E "pools flushed|host removed" "$T"/*.log | sed 's/^/   /'
echo "== topology down"
