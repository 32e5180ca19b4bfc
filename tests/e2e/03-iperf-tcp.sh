#!/usr/bin/env bash
# iperf3 TCP through sd0 in both directions.
. "$(dirname "$0")/../lib.sh"
need_root; need_tools ip iperf3 python3
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10 >/dev/null
tx=$(iperf sd-host 10.50.0.2 5201 -t 3) || fail "tx: $tx"
rx=$(iperf sd-host 10.50.0.2 5202 -t 3 -R) || fail "rx: $rx"
python3 -c "import sys; sys.exit(0 if float('$tx') > 0 and float('$rx') > 0 else 1)" || fail "no throughput: tx $tx rx $rx"
log "tx ${tx} Gb/s, rx ${rx} Gb/s"
pass "iperf3 TCP both directions"
