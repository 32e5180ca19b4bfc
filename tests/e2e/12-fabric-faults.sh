#!/usr/bin/env bash
# Fabric faults while iperf3 runs through sd0: the link down for 5 s, then the TCP
# connections reset. sd0 loses carrier within the keepalive timeout and gets it back by
# itself; iperf3's connection survives; nothing restarted; no descriptor or memory leaked.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss iperf3 python3; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
# Warm up (pool pages become resident under traffic) before taking the baseline.
iperf sd-host 10.50.0.2 5250 -t 2 >/dev/null || fail "warm-up iperf3"
hfd0=$(fds "${HOST_PID[1]}"); ifd0=$(fds "$IOC_PID")
hrss0=$(rss_kib "${HOST_PID[1]}"); irss0=$(rss_kib "$IOC_PID")
iperf sd-host 10.50.0.2 5251 -t 14 >"$T/fault.rate" & load=$!
sleep 1
ip -n sd-host link set fab0 down
wait_carrier sd-host down 3; ms=$WAITED_MS; log "fabric down: NO-CARRIER after ${ms} ms"
sleep 5
ip -n sd-host link set fab0 up
wait_carrier sd-host up 5; ms=$WAITED_MS; log "fabric up: carrier back after ${ms} ms"
ping_ok sd-host 10.50.0.2
# Reset the fabric connections from the host's side (SOCK_DESTROY: the sockets get ECONNRESET).
lost0=$(grep -c "fabric lost" "$T/host1.log")
ip netns exec sd-host ss -K dst 10.200.0.2 >/dev/null 2>&1 || fail "ss -K failed (kernel without CONFIG_INET_DIAG_DESTROY?)"
for _ in $(seq 40); do [ "$(grep -c "fabric lost" "$T/host1.log")" -gt "$lost0" ] && break; sleep 0.05; done
[ "$(grep -c "fabric lost" "$T/host1.log")" -gt "$lost0" ] || fail "host did not notice the reset"
log "TCP reset: $(grep "fabric lost" "$T/host1.log" | tail -n 1 | sed 's/.*fabric lost: //')"
wait_carrier sd-host up 5; ms=$WAITED_MS; log "after the reset: carrier up, ${ms} ms after the check"
wait $load || fail "iperf3 did not survive the fabric faults"
log "iperf3 through the faults: $(cat "$T/fault.rate") Gb/s average"
grep -q "fabric lost" "$T/host1.log" || fail "host did not notice the fabric loss"
ping_ok sd-host 10.50.0.2
kill -0 "${HOST_PID[1]}" || fail "host-driver died"
hfd1=$(fds "${HOST_PID[1]}")
[ "$hfd1" = "$hfd0" ] || fail "host-driver descriptors $hfd0 before, $hfd1 after"
ifd1=$(fds "$IOC_PID")
[ "$ifd1" = "$ifd0" ] || fail "ioc-driver descriptors $ifd0 before, $ifd1 after"
hrss1=$(rss_kib "${HOST_PID[1]}"); irss1=$(rss_kib "$IOC_PID")
[ "$hrss1" -le $((hrss0 + 8192)) ] && [ "$irss1" -le $((irss0 + 8192)) ] ||
    fail "memory grew: host $hrss0 -> $hrss1 KiB, IOC $irss0 -> $irss1 KiB"
log "host-driver fds $hfd0 -> $hfd1, rss $hrss0 -> $hrss1 KiB; IOC fds $ifd0 -> $ifd1, rss $irss0 -> $irss1 KiB"
pass "fabric down/up and reset: carrier follows, traffic back, no restart by hand"
