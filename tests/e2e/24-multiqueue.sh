#!/usr/bin/env bash
# Multi-queue: a host with interface.queues = 3 next to a single-queue host on one IOC with
# two receive queues per worker (lan.rx_queues = 2). sd0
# has 3 queues; the IOC serves 3 sessions for it (queues 0/3, 1/3, 2/3, one MAC, one protection
# domain each); 32 parallel TCP flows each way spread over every queue; host to host and LAN
# traffic work; the host's own counters and the IOC's counters for it (GetStats) add up all
# its queues; an IOC
# restart brings every queue back; SIGTERM stops the host cleanly and the IOC removes all
# three sessions.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3 ss; need_daemons
CTL=$BIN/splitnetctl
sed 's/^queues = 1$/queues = 3/' "$HOST_CONF" >"$T/host-3q.toml"
grep -q '^queues = 3$' "$T/host-3q.toml" || fail "cannot make a 3-queue host configuration"
# The IOC reads the LAN from two receive queues per worker.
sed 's/^rx_queues = 1$/rx_queues = 2/' "$IOC_CONF" >"$T/ioc-2rq.toml"
grep -q '^rx_queues = 2$' "$T/ioc-2rq.toml" || fail "cannot give the IOC two receive queues"
sed -i 's/^# listen = "127.0.0.1:9702"/listen = "127.0.0.1:9702"/' "$T/ioc-2rq.toml"
# Every host's entry allows three queues (queues in [[auth.hosts]]).
sed -i 's/^queues = 1$/queues = 3/' "$T/ioc-2rq.toml"
grep -q '^queues = 3$' "$T/ioc-2rq.toml" || fail "cannot let the hosts' entries have three queues"
IOC_CONF=$T/ioc-2rq.toml
# crossed: frames the IOC's workers handed one another so far (its metrics endpoint).
crossed() {
    ip netns exec sd-ioc python3 -c "import urllib.request as u
m = u.urlopen('http://127.0.0.1:9702/metrics', timeout=3).read().decode()
print(next(l.split()[1] for l in m.splitlines() if l.startswith('splitnet_ioc_worker_crossed_total ')))"
}
topo_up 2; start_ioc
HOST_CONF=$T/host-3q.toml start_host 1
start_host 2
wait_carrier sd-host up 10
wait_carrier sd-host2 up 10

# json COMMAND PYTHON-EXPRESSION over the IOC's reply (as `d`; `mine` = host 1's sessions).
json() {
    ctl_json "$T/ioc.sock" "$1" "(lambda mine: $2)(sorted((h for h in d['hosts']['hosts'] if h['mac'] == '$(link_mac sd-host sd0)'), key=lambda h: h['queue']))"
}

# sessions: how many sessions the IOC serves for host 1.
sessions() { json hosts "len(mine)"; }
# host_sees_ioc_tx_at_least N: the host's copy of the IOC's counters (GetStats) shows at
# least N frames delivered to it.
host_sees_ioc_tx_at_least() {
    local n
    n=$(ctl_json "$T/host1.sock" stats "d['stats']['ioc']['tx']['frames'] if d['stats']['ioc'] else 0")
    [ "$n" -ge "$1" ]
}
three_sessions() { [ "$(sessions)" = 3 ]; }
# host_counts_all_queues: the host's own fabric counters (splitnetctl stats) cover all its
# queues: at least the frames the IOC received from its sessions, and at least 90% of the
# frames the IOC delivered to them.
host_counts_all_queues() {
    local ioc_rx ioc_tx host host_tx host_rx
    ioc_rx=$(json hosts "sum(h['counters']['rx']['frames'] for h in mine)")
    ioc_tx=$(json hosts "sum(h['counters']['tx']['frames'] for h in mine)")
    host=$(ctl_json "$T/host1.sock" stats "'%d %d' % (d['stats']['fabric']['tx']['frames'], d['stats']['fabric']['rx']['frames'])")
    read -r host_tx host_rx <<<"$host"
    [ "$host_tx" -ge "$ioc_rx" ] && [ $((host_rx * 10)) -ge $((ioc_tx * 9)) ]
}
no_sessions() { [ "$(sessions)" = 0 ]; }

# --- the interface and the sessions ---------------------------------------------------------
queues=$(ip netns exec sd-host ls /sys/class/net/sd0/queues | grep -c '^tx-')
assert_eq "$queues" 3 "TX queues of sd0"
"$CTL" -s "$T/ioc.sock" hosts | sed 's/^/    /'
assert_eq "$(json hosts "[(h['queue'], h['queues']) for h in mine]")" "[(0, 3), (1, 3), (2, 3)]" \
    "host 1's sessions (queue, queues)"
assert_eq "$(json hosts "len({h['domain'] for h in mine})")" 3 "a protection domain per queue"
assert_eq "$(json hosts "len(d['hosts']['hosts'])")" 4 "sessions on the IOC (3 + 1)"

# --- traffic: LAN both ways, host to host, IPv6 ----------------------------------------------
ping_ok sd-host 10.50.0.2
ping_ok sd-host "$(host_ip 2)"
ping_ok sd-host2 "$(host_ip 1)"
ip netns exec sd-host ping -6 -c 3 -i 0.2 -W 2 "$(host_ip6 2)" >/dev/null ||
    fail "IPv6 ping from the 3-queue host to host 2"
tx=$(iperf sd-host 10.50.0.2 5211 -t 2 -P 32) || fail "iperf3 -P 32 host -> LAN: $tx"
assert_positive "$tx" "host -> LAN throughput, 32 flows (Gb/s)"
# Back-pressure: with several queues host-driver leaves a frame its flow queue could not take
# without dropping in the TAP queue's ring, so its own queues drop nothing; what overflows a
# ring the kernel counts as sd0's tx drops.
flow_drops=$(ctl_json "$T/host1.sock" stats "sum(v for k, v in d['stats'].get('drops', {}).items() if k.startswith('tx_flow'))")
log "32 uploads: host 1's flow queues dropped $flow_drops frames; sd0's rings $(ip netns exec sd-host cat /sys/class/net/sd0/statistics/tx_dropped)"
assert_eq "$flow_drops" 0 "frames host 1's flow queues dropped during 32 uploads"
# The IOC reads the LAN from lan.rx_queues (2) packet sockets per worker in a fanout group,
# and the group's program sends host 1's and host 2's frames to their workers' queues.
workers=$(sed -n 's/.*IOC ready.* workers=\([0-9]*\).*/\1/p' "$T/ioc.log" | tail -n 1)
assert_eq "$(ip netns exec sd-ioc ss -0 -p | grep -c '"ioc-driver"')" "$((workers * 2))" \
    "the IOC's packet sockets ($workers workers, 2 receive queues each)"
before=$(crossed) || fail "no IOC metrics"
rx=$(iperf sd-host 10.50.0.2 5212 -t 2 -P 32 -R) || fail "iperf3 -P 32 LAN -> host: $rx"
assert_positive "$rx" "LAN -> host throughput, 32 flows (Gb/s)"
# The fanout group's program sent the download's frames to host 1's worker's queues.
download=$(json hosts "sum(h['counters']['tx']['frames'] for h in mine)")
log "32 downloads: $(($(crossed) - before)) of $download frames crossed from another worker"
assert_le "$(( ($(crossed) - before) * 100 ))" "$download" "frames of the download that crossed workers (x100)"
hh=$(SERVER_NS=sd-host2 iperf sd-host "$(host_ip 2)" 5213 -t 2 -P 8) || fail "iperf3 host 1 -> host 2: $hh"
assert_positive "$hh" "host 1 -> host 2 throughput (Gb/s)"
log "32 flows: host -> LAN ${tx} Gb/s, LAN -> host ${rx} Gb/s; host 1 -> host 2 ${hh} Gb/s"
# 32 flows each way over 3 queues: every queue carries some (a queue missing all 32 flows of
# a direction has probability 3 x (2/3)^32, below 1e-5).
"$CTL" -s "$T/ioc.sock" hosts | sed 's/^/    /'
for q in 0 1 2; do
    assert_ge "$(json hosts "mine[$q]['counters']['tx']['frames']")" 1000 "frames the IOC delivered on queue $q"
    assert_ge "$(json hosts "mine[$q]['counters']['rx']['frames']")" 1000 "frames host 1 sent on queue $q"
done
# Under 32 flows on 2 cores a queue's receive ring (its credits and a 4 MiB flow queue) can
# overflow, as a NIC's does; such drops are counted and TCP recovers. Beyond 1% of the frames
# moved, frames would be going astray.
moved=$(json hosts "sum(h['counters']['tx']['frames'] + h['counters']['rx']['frames'] for h in mine)")
dropped=$(json hosts "sum(h['counters']['tx']['dropped'] + h['counters']['rx']['dropped'] for h in mine)")
log "host 1's queues: $moved frames moved, $dropped dropped"
assert_le "$((dropped * 100))" "$moved" "frames dropped on host 1's queues (x100, at most the frames moved)"
eventually 5 host_counts_all_queues ||
    fail "the host's own counters do not cover all its queues: $("$CTL" -s "$T/host1.sock" stats | head -n 8)"
# The host's view of the IOC's counters (GetStats, once a second) adds up every queue.
want=$(json hosts "sum(h['counters']['tx']['frames'] for h in mine)")
eventually 5 host_sees_ioc_tx_at_least "$want" ||
    fail "the host's IOC counters do not add up its queues (want >= $want frames)"

# --- an IOC restart brings every queue back --------------------------------------------------
stop_ioc KILL
wait_carrier sd-host down 10
start_ioc
wait_carrier sd-host up 15
ping_ok sd-host 10.50.0.2
eventually 10 three_sessions || fail "host 1 did not reconnect its 3 queues: $(json hosts "[(h['queue'], h['queues']) for h in mine]")"
tx=$(iperf sd-host 10.50.0.2 5214 -t 1 -P 8) || fail "iperf3 after the IOC restart: $tx"
assert_positive "$tx" "host -> LAN after the IOC restart (Gb/s)"

# --- SIGTERM: the host flushes every queue and exits 0; the IOC removes all its sessions -----
stop_host 1 TERM
assert_eq "$STOP_RC" 0 "host-driver exit status on SIGTERM"
eventually 5 no_sessions || fail "the IOC kept sessions of the stopped host"
assert_eq "$(json hosts "len(d['hosts']['hosts'])")" 1 "sessions left on the IOC (host 2)"
ping_ok sd-host2 10.50.0.2
assert_no_grep "$T/host1.log" "panicked|ERROR" "host 1's log"
assert_no_grep "$T/ioc.log" "panicked|ERROR" "the IOC's log"
pass "multi-queue host: 3 queues, flows spread, reconnect and stop together"
