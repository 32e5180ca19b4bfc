#!/usr/bin/env bash
# A rogue host attacks ioc-driver while a well-behaved host runs iperf3 through the same IOC:
# every attack is refused with a counted, logged error and the rogue's connection closed; the
# good host's traffic is not interrupted; the IOC's memory stays bounded.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3; need_daemons
# Every attack, and frames from a source MAC that is not the host's (counted, not passed on).
need_rogue
# The hostile peer speaks the plain handshake of an admitted host (e2e 32 tests admission).
open_admission
topo_up 2; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
rss0=$(rss_kib "$IOC_PID")
iperf sd-host 10.50.0.2 5231 -t 25 >"$T/good.rate" & good=$!
sleep 1
ip netns exec sd-host2 "$ROGUE" host 10.200.0.2:7400 >"$T/rogue.out" 2>&1; rc=$?
sed 's/^/  rogue: /' "$T/rogue.out"
[ "$rc" = 0 ] || fail "some attack was not refused"
wait $good || fail "the good host's iperf3 was interrupted"
log "good host: $(cat "$T/good.rate") Gb/s during the attacks"
kill -0 "$IOC_PID" || fail "ioc-driver died"
n=$(grep -c "host broke the protocol" "$T/ioc.log")
[ "$n" -ge 10 ] || fail "only $n protocol/protection errors logged"
spoofed=$(ctl_json "$T/ioc.sock" stats "d['stats'].get('drops', {}).get('tx_spoofed_source', 0)")
assert_ge "$spoofed" 10 "frames from a spoofed source MAC dropped and counted"
rss1=$(rss_kib "$IOC_PID")
log "IOC resident memory ${rss0} KiB before, ${rss1} KiB after; $n errors logged"
[ "$rss1" -lt $((256 * 1024)) ] || fail "IOC resident memory grew to $rss1 KiB"
ping_ok sd-host 10.50.0.2
pass "rogue host refused; good host unaffected"
