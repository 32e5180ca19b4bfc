#!/usr/bin/env bash
# Hosts on the IOC's machine connect over the IOC's local Unix socket (fabric.listen_local,
# fabric.ioc = "unix:PATH"): host 1 with its data channel in shared memory (the default),
# host 3 with it on the socket (fabric.shared_memory = false), host 2 over TCP beside them.
# All reach the LAN and each other; the IOC shows how each came; a rogue host that corrupts
# its ring is cut off alone; a killed IOC leaves a stale
# socket its successor replaces (the local hosts reconnect by themselves, shared memory
# again); a graceful stop removes the socket; a file in the way stops the start. The socket
# admits root, the IOC's user and fabric.listen_local_group's members only: by its mode
# (0660, that group) and, past a mode loosened by hand, by the peer's credentials.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3 ss setpriv; need_daemons; need_rogue
# The hostile peers speak the plain handshake of an admitted host (e2e 32 tests admission).
open_admission
[ -x /usr/bin/python3 ] || fail "missing /usr/bin/python3 (apt install python3): the unprivileged user of the local-socket checks runs it"
sock=$T/run/fabric.sock
# The IOC's workers poll before they sleep too, and count how their idle periods ended.
sed -e "s|^listen = .*|&\nlisten_local = \"$sock\"\nlisten_local_group = \"4242\"|" \
    -e "s|^spin_max_us = .*|spin_max_us = 100|" \
    -e 's/^# listen = "127.0.0.1:9702"/listen = "127.0.0.1:9702"/' "$IOC_CONF" >"$T/ioc.toml"
grep -q "^spin_max_us = 100" "$T/ioc.toml" || fail "could not set the IOC's spin_max_us"
grep -q '^listen = "127.0.0.1:9702"' "$T/ioc.toml" || fail "could not set the IOC's metrics listener"
# The shared-memory host polls before it sleeps (fabric.spin_max_us, off by default).
# Its metrics tell how many frames it read straight into the IOC's elements.
sed -e "s|^ioc = .*|ioc = \"unix:$sock\"|" -e "s|^spin_max_us = .*|spin_max_us = 100|" \
    -e 's/^# listen = "127.0.0.1:9701"/listen = "127.0.0.1:9701"/' "$HOST_CONF" >"$T/host-shm.toml"
grep -q "^spin_max_us = 100" "$T/host-shm.toml" || fail "could not set spin_max_us"
grep -q '^listen = "127.0.0.1:9701"' "$T/host-shm.toml" || fail "could not set the metrics listener"
# Host 3 polls too, its socket and the TAP with poll(2).
sed -e "s|^ioc = .*|ioc = \"unix:$sock\"|" -e "s|^shared_memory = .*|shared_memory = false|" \
    -e "s|^spin_max_us = .*|spin_max_us = 100|" \
    -e 's/^# listen = "127.0.0.1:9701"/listen = "127.0.0.1:9701"/' "$HOST_CONF" >"$T/host-unix.toml"
grep -q "^spin_max_us = 100" "$T/host-unix.toml" || fail "could not set host 3's spin_max_us"
grep -q "^listen_local = \"$sock\"" "$T/ioc.toml" || fail "could not set listen_local"
grep -q "^shared_memory = false" "$T/host-unix.toml" || fail "could not set shared_memory"
IOC_CONF=$T/ioc.toml
topo_up 3; start_ioc
[ -S "$sock" ] || fail "no socket at $sock"
HOST_CONF=$T/host-shm.toml start_host 1; start_host 2; HOST_CONF=$T/host-unix.toml start_host 3
wait_carrier sd-host up 10; wait_carrier sd-host2 up 10; wait_carrier sd-host3 up 10
json() { ctl_json "$T/ioc.sock" "$@"; }
# Each host's address, in any order (the sessions' order follows pids and ports).
addrs=$(json hosts "chr(10).join(h['address'] for h in d['hosts']['hosts'])")
log "the IOC's hosts: $(echo "$addrs" | paste -sd '|')"
assert_eq "$(echo "$addrs" | grep -c .)" 3 "hosts"
echo "$addrs" | grep -qxF "unix:$sock (pid ${HOST_PID[1]}), shared memory" || fail "host 1's address: $addrs"
echo "$addrs" | grep -qxF "unix:$sock (pid ${HOST_PID[3]})" || fail "host 3's address: $addrs"
echo "$addrs" | grep -qxE "10\.200\.0\.12:[0-9]+" || fail "host 2's address: $addrs"
# The rings and both pool arenas (the host's and the IOC's for it) are mapped in both daemons.
assert_eq "$(grep -c 'memfd:splitnet-' "/proc/${HOST_PID[1]}/maps")" 6 "host 1's rings (two per channel) and both pool arenas"
assert_eq "$(grep -c 'memfd:splitnet-' "/proc/$IOC_PID/maps")" 6 "the IOC's rings (two per channel) and both pool arenas"
ping_ok sd-host 10.50.0.2
ping_ok sd-host fd50::2 -6
# Who may connect: nobody (uid 65534) in no group is refused by the socket's mode; in group
# 4242 (fabric.listen_local_group) it is admitted to its handshake (the IOC waits for its
# Hello); with the mode loosened by hand, the IOC still closes its connection at once.
assert_eq "$(stat -c '%a %g' "$sock")" "660 4242" "the local socket's mode and group"
chmod 0711 "$T" "$T/run"
local_conn() {
    ip netns exec sd-host setpriv --reuid=65534 --regid=65534 "$@" /usr/bin/python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect('$sock')
except PermissionError:
    print('refused'); sys.exit()
s.settimeout(0.5)
try:
    print('closed' if s.recv(1) == b'' else 'open')
except socket.timeout:
    print('open')
except ConnectionResetError:
    print('closed')"
}
assert_eq "$(local_conn --clear-groups)" refused "a connection of a user in no admitted group"
assert_eq "$(local_conn --groups=4242)" open "a connection of a member of fabric.listen_local_group"
chmod 0666 "$sock"
assert_eq "$(local_conn --clear-groups)" closed "past a loosened mode, a user in no admitted group"
chmod 0660 "$sock"
assert_grep "$T/ioc.log" "local connection refused" "the IOC's line about the refused local peer"
ping_ok sd-host 10.50.0.3
ping_ok sd-host2 fd50::1 -6
ping_ok sd-host3 10.50.0.1
# metric NS PORT NAME: a counter of the daemon whose metrics listen on 127.0.0.1:PORT in NS.
metric() { ip netns exec "$1" python3 -c "import urllib.request as u
for l in u.urlopen('http://127.0.0.1:$2/metrics', timeout=3).read().decode().splitlines():
    if l.split(' ')[0] == '$3': print(l.split(' ')[1])"; }
caught0=$(metric sd-ioc 9702 splitnet_ioc_poll_caught_total)
slept0=$(metric sd-ioc 9702 splitnet_ioc_poll_slept_total)
for k in 1 3; do
    ns=$(host_ns $k)
    hcaught0=$(metric "$ns" 9701 splitnet_host_poll_caught_total)
    hslept0=$(metric "$ns" 9701 splitnet_host_poll_slept_total)
    up=$(iperf "$ns" 10.50.0.2 529$k -t 3) || fail "iperf3 from host $k: $up"
    down=$(iperf "$ns" 10.50.0.2 529$((k + 5)) -t 3 -R) || fail "iperf3 -R to host $k: $down"
    assert_positive "$up" "host $k's throughput to the LAN"
    assert_positive "$down" "host $k's throughput from the LAN"
    log "host $k: $up Gb/s to the LAN, $down Gb/s from it"
    # Its poll before sleep (host 1: the IOC's ring; host 3: its sockets) caught work in
    # some idle periods and slept in others.
    hcaught=$(($(metric "$ns" 9701 splitnet_host_poll_caught_total) - hcaught0))
    hslept=$(($(metric "$ns" 9701 splitnet_host_poll_slept_total) - hslept0))
    log "host $k's poll before sleep during its transfers: $hcaught idle periods caught work, $hslept slept"
    assert_positive "$hcaught" "idle periods host $k's poll caught work in"
    assert_positive "$hslept" "idle periods host $k slept in"
done
# Host 1's frames to the LAN were read straight into the IOC's pool elements.
# The IOC's workers polled before sleeping during the transfers: some idle periods caught
# work, some slept.
caught=$(($(metric sd-ioc 9702 splitnet_ioc_poll_caught_total) - caught0))
slept=$(($(metric sd-ioc 9702 splitnet_ioc_poll_slept_total) - slept0))
log "the IOC's poll before sleep during the transfers: $caught idle periods caught work, $slept slept"
assert_positive "$caught" "idle periods the IOC's poll caught work in"
assert_positive "$slept" "idle periods the IOC slept in"
in_place=$(metric sd-host 9701 splitnet_host_tx_in_place_total)
sent=$(metric sd-host 9701 splitnet_host_tx_frames_total)
log "host 1: $in_place of $sent frames read from the TAP straight into the IOC's elements"
assert_positive "$in_place" "frames read in place"
# And the LAN's frames to host 1 were read by the IOC, from host 1's own packet socket,
# straight into host 1's pool elements; the other hosts have no such socket.
placed=$(json hosts "' '.join(str(h['in_place']) for h in sorted(d['hosts']['hosts'], key=lambda h: 'shared memory' not in h['address']))")
log "LAN frames read straight into each host's pools (host 1 first): $placed"
assert_match "$placed" "^[1-9][0-9]* 0 0$" "frames read into host 1's pools alone"
packet_sockets() { ip netns exec sd-ioc ss -0 -a -H | grep -c .; }
# Host 1 stops reading (SIGSTOP, within its keepalive timeout) under a burst from the LAN:
# its own socket overflows and the drops are counted against it alone; host 3 is answered
# meanwhile and loses nothing, and host 1 works again afterwards.
shm_host() { json hosts "[h for h in d['hosts']['hosts'] if 'shared memory' in h['address']][0]$1"; }
others_drops() { json hosts "sum(sum(h.get('drops', {}).values()) for h in d['hosts']['hosts'] if 'shared memory' not in h['address'])"; }
others=$(others_drops)
ip netns exec sd-lan python3 -c "import os, signal, socket, subprocess
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
os.kill(${HOST_PID[1]}, signal.SIGSTOP)
try:
    for _ in range(12000): s.sendto(b'x' * 1400, ('10.50.0.1', 9))
    subprocess.run(['ping', '-c', '2', '-i', '0.05', '-W', '1', '10.50.0.3'], check=True, capture_output=True)
finally:
    os.kill(${HOST_PID[1]}, signal.SIGCONT)" || fail "burst at a stopped host 1, or host 3 unanswered meanwhile"
sleep 0.5
full=$(shm_host ".get('drops', {}).get('rx_ring_full', 0)")
log "a burst of 12000 frames at a stopped shared-memory host: $full dropped by its own socket"
[ "$full" -gt 0 ] || fail "no drops counted against the stopped host"
[ "$full" -lt 12000 ] || fail "every frame of the burst dropped: its socket held none"
assert_eq "$(others_drops)" "$others" "the other hosts' drops"
assert_no_grep "$T/host1.log" "fabric lost" "host 1's session through the burst"
ping_ok sd-host 10.50.0.2
# Rogue hosts over shared memory ask to be woken for every answer and never read their
# doorbell (3 s of GetStats, every one answered), publish a ring index their data ring or
# their control ring refuses, flood the IOC's data or control doorbell, publish a placed
# write into no pool they were granted: each bad session ends, its shared memory is
# unmapped, and the other hosts go on; host 3 (over TCP) pings the LAN every 50 ms all
# along and is answered every time.
ip netns exec sd-host3 ping -q -i 0.05 -W 1 -c 120 10.50.0.2 >"$T/ping3.out" 2>&1 & pinger=$!
ip netns exec sd-host "$ROGUE" shm "$sock" >"$T/rogue.out" 2>&1 || fail "rogue shm: $(tr '\n' ';' <"$T/rogue.out")"
log "rogue: $(tr '\n' ';' <"$T/rogue.out")"
wait "$pinger" || fail "host 3 lost pings during the rogue sessions: $(tail -2 "$T/ping3.out" | head -1)"
log "host 3 during the rogue sessions: $(grep -o '[0-9]* received' "$T/ping3.out") of 120 pings"
bad_rings=$(grep -c "shared-memory ring" "$T/ioc.log")
[ "$bad_rings" -ge 2 ] || fail "the IOC ended $bad_rings sessions for a bad ring index, not 2 (data and control)"
floods=$(grep -c "doorbell rung 64 times" "$T/ioc.log")
[ "$floods" -ge 2 ] || fail "the IOC ended $floods sessions for a doorbell flood, not 2 (data and control)"
assert_grep "$T/ioc.log" "host broke the protocol: .*(protection error|unknown memory handle)" "the IOC's reason for ending the placed-write session"
assert_eq "$(grep -c 'memfd:splitnet-' "/proc/$IOC_PID/maps")" 6 "the IOC's shared memory after the rogue sessions (host 1's only)"
assert_eq "$(grep -c 'memfd:rogue-' "/proc/$IOC_PID/maps")" 0 "the rogue sessions' rings and arenas, unmapped"
ping_ok sd-host 10.50.0.2
ping_ok sd-host3 10.50.0.2
assert_eq "$(json status "d['status']['fabric']['hosts']")" 3 "hosts after the rogue"
# kill -9: the socket file stays behind; the next IOC replaces it and the hosts come back.
hp=${HOST_PID[1]}
stop_ioc KILL
[ -S "$sock" ] || fail "the killed IOC's socket file is gone (nothing to replace)"
wait_carrier sd-host down 2
start_ioc
wait_carrier sd-host up 5; log "carrier back ${WAITED_MS} ms after the IOC's restart"
wait_carrier sd-host3 up 5
ping_ok sd-host 10.50.0.2
ping_ok sd-host3 10.50.0.1
assert_eq "${HOST_PID[1]}" "$hp" "host-driver's pid (never restarted)"
assert_match "$(json hosts "' '.join(h['address'] for h in d['hosts']['hosts'])")" "shared memory" "shared memory after the restart"
assert_eq "$(grep -c 'memfd:splitnet-' "/proc/${HOST_PID[1]}/maps")" 6 "host 1's shared memory after reconnecting (the old session's unmapped)"
# A graceful stop of a shared-memory host: the IOC sees it leave (Goodbye), nothing else.
with_host1=$(packet_sockets)
stop_host 1 TERM
assert_eq "$STOP_RC" 0 "host 1's exit status after SIGTERM"
hosts_listed() { [ "$(json status "d['status']['fabric']['hosts']")" = "$1" ]; }
eventually 5 hosts_listed 2 || fail "host 1 still listed"
assert_grep "$T/ioc.log" "host removed: host disconnected \(ShuttingDown\)" "the IOC's reason for host 1's leaving"
# Its pools were flushed first: the IOC's flush replies came back through the control ring.
assert_grep "$T/host1.log" "pools flushed" "host 1's flush with the IOC before leaving"
assert_eq "$(grep -c 'memfd:splitnet-' "/proc/$IOC_PID/maps")" 0 "the IOC's shared memory after host 1 left"
assert_eq "$(packet_sockets)" $((with_host1 - 1)) "the IOC's packet sockets after host 1 left (its own closed)"
ping_ok sd-host3 10.50.0.2
stop_ioc TERM
assert_eq "$STOP_RC" 0 "the IOC's exit status after SIGTERM"
[ -e "$sock" ] && fail "a graceful stop left $sock behind"
# Something that is not a socket in the way: the IOC refuses to start, and says why.
echo "not a socket" >"$sock"
ip netns exec sd-ioc "$BIN/ioc-driver" --config "$IOC_CONF" >"$T/blocked.log" 2>&1 && fail "the IOC started over a regular file"
assert_grep "$T/blocked.log" "cannot listen on $sock: .*not a socket" "the start-up error"
[ -f "$sock" ] || fail "the IOC removed a file that was not its socket"
pass "hosts on the IOC's machine over shared memory and the local socket, beside a host over TCP"
