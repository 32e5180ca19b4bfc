#!/usr/bin/env bash
# Hundreds of host connections that vanish without a word while a good host moves traffic
# through the IOC both ways: every session's send buffers and pools come back (the pool is
# whole afterwards), the IOC's descriptors and memory stay flat, and the good host is never
# disturbed.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3 ping; need_daemons
need_rogue
# The hostile peer speaks the plain handshake of an admitted host (e2e 32 tests admission).
open_admission
json() { ctl_json "$T/ioc.sock" "$@"; }
topo_up 2; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
# A first round, with traffic both ways, so that lazily made buffers (every worker's LAN
# batch, the good host's quota and pools) and allocator arenas exist before measuring.
iperf sd-host 10.50.0.2 5310 -t 2 --bidir >/dev/null & warm=$!
ip netns exec sd-host2 "$ROGUE" churn 10.200.0.2:7400 20 >/dev/null 2>&1
wait $warm || fail "the warm-up iperf3 failed"
fds0=$(fds "$IOC_PID"); rss0=$(rss_kib "$IOC_PID")
iperf sd-host 10.50.0.2 5311 -t 20 --bidir >"$T/good.rate" & good=$!
sleep 1
ip netns exec sd-host2 "$ROGUE" churn 10.200.0.2:7400 300 >"$T/churn.out" 2>&1 || fail "churn: $(cat "$T/churn.out")"
log "$(cat "$T/churn.out")"
wait $good || fail "the good host's iperf3 was interrupted"
log "good host during the churn: $(cat "$T/good.rate") Gb/s"
assert_no_grep "$T/host1.log" "fabric lost|connection lost" "the good host reconnected"
# Sessions whose data channel never came are dropped after the handshake timeout.
hosts_listed() { [ "$(json status "d['status']['fabric']['hosts']")" = "$1" ]; }
eventually 5 hosts_listed 1 || fail "sessions left behind"
in_use=$(json stats "d['stats']['send_buffer_bytes'][0]")
quota=$(json hosts "d['hosts']['hosts'][0]['buffer_quota_bytes']")
log "send buffers in use: $in_use bytes (the good host's quota: $quota bytes)"
assert_le "$in_use" "$quota" "send buffers still held by departed sessions"
connects=$(json status "d['status']['fabric']['connects']")
assert_ge "$connects" 300 "sessions admitted"
fds1=$(fds "$IOC_PID"); rss1=$(rss_kib "$IOC_PID")
log "IOC: $fds0 -> $fds1 descriptors, $rss0 -> $rss1 KiB resident"
assert_le "$fds1" "$fds0" "the IOC's descriptors grew"
assert_le "$rss1" $((rss0 + 16384)) "the IOC's resident memory grew by more than 16 MiB"
assert_le "$rss1" 65536 "the IOC's resident memory (KiB) is above 64 MiB"
ping_ok sd-host 10.50.0.2
pass "churn leaves the IOC as it was"
