#!/usr/bin/env bash
# The NIC's link state reaches sd0's carrier through CfgUtil (LinkChange), while iperf3
# runs through sd0; its connection survives the outage.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
iperf sd-host 10.50.0.2 5261 -t 6 >"$T/lan.rate" & load=$!
sleep 1
ip -n sd-lan link set lan1 down
wait_carrier sd-host down 3; ms=$WAITED_MS; log "LAN link down: sd0 NO-CARRIER after ${ms} ms"
ip -n sd-lan link set lan1 up
wait_carrier sd-host up 3; ms=$WAITED_MS; log "LAN link up: carrier back after ${ms} ms"
ping_ok sd-host 10.50.0.2
wait $load || fail "iperf3 did not survive the LAN link outage"
log "iperf3 through the outage: $(cat "$T/lan.rate") Gb/s average"
pass "NIC link state follows to sd0"
