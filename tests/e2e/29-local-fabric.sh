#!/usr/bin/env bash
# A host on the IOC's machine connects over the IOC's local Unix socket (fabric.listen_local,
# fabric.ioc = "unix:PATH") while another host uses TCP: both reach the LAN and each other,
# the IOC shows where each came from, a killed IOC leaves a stale socket its successor
# replaces (the local host reconnects by itself), and a graceful stop removes the socket.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3 ss; need_daemons
sock=$T/run/fabric.sock
sed "s|^listen = .*|&\nlisten_local = \"$sock\"|" "$IOC_CONF" >"$T/ioc.toml"
sed "s|^ioc = .*|ioc = \"unix:$sock\"|" "$HOST_CONF" >"$T/host-local.toml"
grep -q "^listen_local = \"$sock\"" "$T/ioc.toml" || fail "could not set listen_local"
grep -q "^ioc = \"unix:$sock\"" "$T/host-local.toml" || fail "could not set fabric.ioc"
IOC_CONF=$T/ioc.toml
topo_up 2; start_ioc
[ -S "$sock" ] || fail "no socket at $sock"
HOST_CONF=$T/host-local.toml start_host 1; start_host 2
wait_carrier sd-host up 10; wait_carrier sd-host2 up 10
json() { ctl_json "$T/ioc.sock" "$@"; }
addrs=$(json hosts "' '.join(sorted(h['address'] for h in d['hosts']['hosts']))")
log "the IOC's hosts: $addrs"
assert_match "$addrs" "^10\.200\.0\.12:[0-9]+ unix:$sock \(pid ${HOST_PID[1]}\)$" "hosts' addresses"
ping_ok sd-host 10.50.0.2
ping_ok sd-host fd50::2 -6
ping_ok sd-host 10.50.0.3
ping_ok sd-host2 fd50::1 -6
up=$(iperf sd-host 10.50.0.2 5291 -t 3) || fail "iperf3 over the local socket: $up"
down=$(iperf sd-host 10.50.0.2 5292 -t 3 -R) || fail "iperf3 -R over the local socket: $down"
assert_positive "$up" "throughput to the LAN over the local socket"
assert_positive "$down" "throughput from the LAN over the local socket"
log "over the local socket: $up Gb/s to the LAN, $down Gb/s from it"
# kill -9: the socket file stays behind; the next IOC replaces it and the host comes back.
hp=${HOST_PID[1]}
stop_ioc KILL
[ -S "$sock" ] || fail "the killed IOC's socket file is gone (nothing to replace)"
wait_carrier sd-host down 2
start_ioc
wait_carrier sd-host up 5; log "carrier back ${WAITED_MS} ms after the IOC's restart"
ping_ok sd-host 10.50.0.2
assert_eq "${HOST_PID[1]}" "$hp" "host-driver's pid (never restarted)"
# Something that is not a socket in the way: the IOC refuses to start, and says why.
stop_ioc TERM
assert_eq "$STOP_RC" 0 "the IOC's exit status after SIGTERM"
[ -e "$sock" ] && fail "a graceful stop left $sock behind"
echo "not a socket" >"$sock"
ip netns exec sd-ioc "$BIN/ioc-driver" --config "$IOC_CONF" >"$T/blocked.log" 2>&1 && fail "the IOC started over a regular file"
assert_grep "$T/blocked.log" "cannot listen on $sock: .*not a socket" "the start-up error"
[ -f "$sock" ] || fail "the IOC removed a file that was not its socket"
pass "a host on the IOC's machine over the local socket, beside a host over TCP"
