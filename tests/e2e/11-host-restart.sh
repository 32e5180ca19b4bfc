#!/usr/bin/env bash
# Killing host-driver (SIGKILL) while another host moves traffic: the IOC frees that host's
# pools and domain and keeps serving the other; the restarted host gets traffic back; nothing
# leaks (IOC descriptors and pool regions back to their earlier counts).
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3; need_daemons
topo_up 2; start_ioc; start_host 1; start_host 2
wait_carrier sd-host up 10; wait_carrier sd-host2 up 10
ping_ok sd-host 10.50.0.2; ping_ok sd-host2 10.50.0.2
fd0=$(fds "$IOC_PID")
iperf sd-host2 10.50.0.2 5221 -t 4 >"$T/h2.rate" & ip2=$!
sleep 1
kill -9 "${HOST_PID[1]}"
for _ in $(seq 50); do grep -q "host removed.*session=1" "$T/ioc.log" && break; sleep 0.1; done
grep -q "host removed.*session=1" "$T/ioc.log" || fail "IOC did not remove the killed host"
wait $ip2 || fail "host 2's iperf3 was interrupted by host 1's death"
log "host 2 kept $(cat "$T/h2.rate") Gb/s while host 1 was killed"
start_host 1
wait_carrier sd-host up 5
ping_ok sd-host 10.50.0.2
ping_ok sd-host2 10.50.0.1
fd1=$(fds "$IOC_PID")
[ "$fd1" = "$fd0" ] || fail "IOC descriptors $fd0 before, $fd1 after the host's restart"
# Stop both hosts cleanly: every pool region of the IOC must be gone.
kill -TERM "${HOST_PID[1]}" "${HOST_PID[2]}"; wait "${HOST_PID[1]}" "${HOST_PID[2]}"
sleep 0.3
last=$(grep "host removed" "$T/ioc.log" | tail -n 1)
echo "$last" | grep -q "hosts=0 pool_regions=0 pool_bytes=0" || fail "pools left behind: $last"
log "IOC fds $fd0 -> $fd1; $(echo "$last" | grep -o 'pool_regions=[0-9]* pool_bytes=[0-9]*')"
pass "host-driver killed and restarted; the other host unaffected; nothing leaked"
