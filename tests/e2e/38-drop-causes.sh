#!/usr/bin/env bash
# Drops the host driver counts by cause, end to end (the other causes have unit tests; e2e 15
# has rx_bad_header, 14 tx_spoofed_source, 20 the NIC's ring, 29 rx_ring_full):
# - sd0 down: the LAN's broadcast frames reach host-driver and the TAP refuses to take them
#   (EIO): rx_tap_write, one per frame, the session kept;
# - the IOC stopped (SIGSTOP) while the host sends UDP: the frames waiting for credit, or
#   posted and not yet written, when the host gives the silent IOC up are counted as
#   tx_lost_at_close (with those the flow queue dropped meanwhile, tx_flow_queue); the host
#   reconnects once the IOC runs again, and the counts survive the reconnection.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip python3 ping; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2

# drops CAUSE: host 1's count of CAUSE (0 when none).
drops() { ctl_json "$T/host1.sock" stats "d['stats'].get('drops', {}).get('$1', 0)"; }

# 1. The TAP refuses frames while sd0 is down.
FRAMES=5
run ip -n sd-host link set sd0 down
before=$(drops rx_tap_write)
frame=ffffffffffff021122334455$(printf '88b5%092d' 0)
# shellcheck disable=SC2046 # one word per frame
ip netns exec sd-lan python3 "$ROOT/tests/rawframes.py" send lan1 $(printf "$frame %.0s" $(seq $FRAMES)) ||
    fail "cannot send the broadcast frames"
eventually 3 [ "$(drops rx_tap_write)" -ge $((before + FRAMES)) ]
after=$(drops rx_tap_write)
log "sd0 down: $((after - before)) of the LAN's $FRAMES broadcast frames refused by the TAP and counted"
assert_ge "$((after - before))" "$FRAMES" "frames the TAP refused while sd0 was down (rx_tap_write)"
run ip -n sd-host link set sd0 up
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
connects=$(ctl_json "$T/host1.sock" status "d['status']['fabric']['connects']")
assert_eq "$connects" 1 "connections made: refused writes are no reason to reconnect"

# 2. Frames on their way to a stopped IOC when the host gives it up.
kill -STOP "$IOC_PID"
ip netns exec sd-host python3 "$ROOT/tests/udp_flood.py" 10.50.0.2 9 800 2 >"$T/flood.out" 2>&1 ||
    fail "the flood failed: $(cat "$T/flood.out")"
eventually 5 grep -q 'fabric lost' "$T/host1.log" || fail "the host did not give the stopped IOC up"
kill -CONT "$IOC_PID"
wait_carrier sd-host up 15
ping_ok sd-host 10.50.0.2
lost=$(drops tx_lost_at_close)
queue=$(drops tx_flow_queue)
log "IOC stopped during a flood ($(cat "$T/flood.out")): $lost frames lost with the connection, $queue dropped by the flow queue"
assert_ge "$lost" 1 "frames lost with the connection, counted after the reconnection (tx_lost_at_close)"
total=$(ctl_json "$T/host1.sock" stats "d['stats']['fabric']['tx']['dropped']")
assert_ge "$total" "$((lost + queue))" "the host's tx drops hold every cause"
pass "host drops counted by cause: TAP refusals, frames lost with the connection"
