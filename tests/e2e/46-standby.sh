#!/usr/bin/env bash
# A standby IOC (fabric.standby; docs/protocol.md 6.4, 6.5): host 1 keeps a warm, authenticated
# session to a second IOC on the same LAN and moves to it when its active IOC is lost: across
# `kill -9` of the active IOC, across its fabric port set down (found by the agreed liveness),
# and across its NIC set down (LinkChange), a 20 s transfer from the host arrives intact, the
# LAN's ping of sd0 every 10 ms gets no duplicate reply, and the longest gap is printed. sd0
# keeps its MAC and addresses; the LAN learns the move from the host's announcements. Then
# failback as configured, and a standby whose key or MAC policy does not match is refused with
# a clear message before it is ever needed.
#
#   sd-host   fabbr 10.200.0.1 (ports fabh1, fabh2)     sd0 10.50.0.1, fd50::1
#   sd-ioc    fab1 10.200.0.2 (peer fabh1)   lan0 (peer lan1 in sd-lan's lanbr)
#   sd-ioc2   fab1 10.200.0.3 (peer fabh2)   lan0 (peer lan2 in sd-lan's lanbr)
#   sd-lan    lanbr 10.50.0.2, fd50::2
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping python3; need_daemons
MAC=02:5d:00:00:01:01
VM=02:5d:00:00:01:09
RAW="python3 $ROOT/tests/rawframes.py"

[ -e /run/netns/sd-ioc2 ] && fail "namespace sd-ioc2 already exists"
addns sd-host; addns sd-ioc; addns sd-ioc2; addns sd-lan
run ip -n sd-host link add fabbr type bridge
run ip -n sd-host addr add 10.200.0.1/24 dev fabbr
run ip -n sd-host link set fabbr up
run ip -n sd-lan link add lanbr type bridge
run ip -n sd-lan addr add 10.50.0.2/24 dev lanbr
run ip -n sd-lan addr add fd50::2/64 dev lanbr nodad
run ip -n sd-lan link set lanbr up
i=0
for ioc in sd-ioc sd-ioc2; do
    i=$((i + 1))
    run ip link add "fabh$i" netns sd-host type veth peer name fab1 netns "$ioc"
    run ip -n sd-host link set "fabh$i" master fabbr
    run ip -n sd-host link set "fabh$i" up
    run ip -n "$ioc" addr add "10.200.0.$((i + 1))/24" dev fab1
    run ip -n "$ioc" link set fab1 up
    run ip link add lan0 netns "$ioc" type veth peer name "lan$i" netns sd-lan
    run ip -n sd-lan link set "lan$i" master lanbr
    run ip -n sd-lan link set "lan$i" up
done

# Both IOCs admit host 1 with the same MAC, a machine bridged behind it (VM) and two
# queues; the second has a key of its own.
sed -e "/^name = \"host1\"$/a mac = \"$MAC\"\nextra_macs = [\"$VM\"]" -e 's/^queues = 1$/queues = 2/' \
    "$IOC_CONF" >"$T/ioc1.toml"
grep -q "^mac = \"$MAC\"" "$T/ioc1.toml" || fail "could not give host1's entry a mac"
(umask 077 && "$BIN/splitnetctl" genkey >"$T/keys/ioc2.key") || fail "genkey"
IOC2_PUB=$("$BIN/splitnetctl" pubkey <"$T/keys/ioc2.key")
sed -e "s|$T/keys/ioc.key|$T/keys/ioc2.key|" -e 's/^listen = "10.200.0.2:7400"/listen = "10.200.0.3:7400"/' \
    "$T/ioc1.toml" >"$T/ioc2.toml"
grep -q '^listen = "10.200.0.3:7400"' "$T/ioc2.toml" || fail "could not set the second IOC's address"
# host.toml with the standby (KEY: its public key) and FAILBACK lines.
host_conf() {
    sed "/^ioc = \"10.200.0.2:7400\"$/a standby = [{ ioc = \"10.200.0.3:7400\", public_key = \"$1\" }]\n${2:-}" \
        "$HOST_CONF" >"$T/host-standby.toml"
    grep -q '^standby = ' "$T/host-standby.toml" || fail "could not add the standby to host.toml"
    HOST_CONF=$T/host-standby.toml
}
BASE_HOST_CONF=$HOST_CONF

IOC2_PID=
start_iocs() {
    IOC_CONF=$T/ioc1.toml start_ioc
    start_ioc2
}
start_ioc2() {
    ip netns exec sd-ioc2 "$BIN/ioc-driver" --config "$T/ioc2.toml" --control-socket "$T/ioc2.sock" \
        >>"$T/ioc2.log" 2>&1 &
    IOC2_PID=$!
    PIDS+=("$IOC2_PID")
    eventually 5 sh -c "ip netns exec sd-ioc2 ss -Hltn 'sport = :7400' | grep -q 7400" ||
        fail "the second ioc-driver is not listening"
}
hjson() { ctl_json "$T/host1.sock" "$@"; }
role() { hjson status "d['status']['fabric']['iocs'][$1]['role']"; }
active_is() { [ "$(role "$1")" = active ]; }
ready_is() { [ "$(role "$1")" = standby ]; }

# --- A standby whose key does not match, or whose MAC policy differs, is refused at once.
host_conf "$IOC_PUB"  # the primary's key: not the standby's
start_iocs
start_host 1
wait_carrier sd-host up 10
eventually 5 grep -q 'cannot keep a standby session' "$T/host1.log" ||
    fail "a standby of the wrong key was not refused: $(tail -3 "$T/host1.log")"
assert_grep "$T/host1.log" 'cannot keep a standby session.*(nauthenticated|handshake|key)' "the refusal says why"
assert_eq "$(role 1)" down "the standby of the wrong key"
stop_host 1
kill "$IOC2_PID"; wait "$IOC2_PID" 2>/dev/null
sed "s/^mac = \"$MAC\"$/mac = \"02:5d:00:00:01:02\"/" "$T/ioc2.toml" >"$T/ioc2-other-mac.toml"
cp "$T/ioc2.toml" "$T/ioc2-good.toml"; cp "$T/ioc2-other-mac.toml" "$T/ioc2.toml"
start_ioc2
HOST_CONF=$BASE_HOST_CONF; host_conf "$IOC2_PUB"
start_host 1
wait_carrier sd-host up 10
eventually 5 grep -q 'the standby IOC cannot serve this host' "$T/host1.log" ||
    fail "a standby with another MAC was not refused: $(tail -3 "$T/host1.log")"
assert_grep "$T/host1.log" 'needs the same `mac` on every IOC' "the refusal names the entry's mac"
log "a standby of the wrong key and one of another MAC: both refused before they are needed"
stop_host 1
kill "$IOC2_PID"; wait "$IOC2_PID" 2>/dev/null
cp "$T/ioc2-good.toml" "$T/ioc2.toml"
start_ioc2

# --- The moves, of a host with two queues that has joined a group of each family.
sed 's/^queues = 1$/queues = 2/' "$HOST_CONF" >"$T/host-2q.toml"
grep -q '^queues = 2$' "$T/host-2q.toml" || fail "could not give the host two queues"
HOST_CONF=$T/host-2q.toml
run ip -n sd-host link del sd0  # made anew with two queues
start_host 1
wait_carrier sd-host up 10
assert_eq "$(link_mac sd-host sd0)" "$MAC" "sd0's MAC from its entry"
eventually 5 ready_is 1 || fail "the standby never became ready: $(role 1)"
assert_eq "$(role 0)" active "the primary"
assert_eq "$(ctl_json "$T/ioc2.sock" hosts "d['hosts']['hosts'][0]['standby']")" True "the second IOC's view of host 1"
ping_ok sd-lan 10.50.0.1 || fail "the LAN cannot reach sd0 before the moves"
queues_on() { ctl_json "$1" hosts "sorted(h['queue'] for h in d['hosts']['hosts'] if h['mac'] == '$MAC' and not h.get('standby'))"; }
both_on_primary() { [ "$(queues_on "$T/ioc.sock")" = "[0, 1]" ]; }
eventually 5 both_on_primary || fail "host 1's two queues are not on the primary: $(queues_on "$T/ioc.sock")"
# Memberships the kernel reported through the primary, for the move to report again.
ip netns exec sd-host python3 -c '
import socket, struct, time
v4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
v4.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
              socket.inet_aton("239.1.2.3") + socket.inet_aton("10.50.0.1"))
v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP,
              socket.inet_pton(socket.AF_INET6, "ff0e::5d") + struct.pack("@I", socket.if_nametoindex("sd0")))
time.sleep(600)' &
PIDS+=($!)
mdb_on() { bridge -n sd-lan mdb show dev lanbr | grep -w "$1" | grep -qw "$2"; }
eventually 5 mdb_on lan1 239.1.2.3 || fail "the LAN's bridge never learnt sd0's IPv4 group: $(bridge -n sd-lan mdb show)"
eventually 5 mdb_on lan1 ff0e::5d || fail "the LAN's bridge never learnt sd0's IPv6 group: $(bridge -n sd-lan mdb show)"
mdb_on lan2 239.1.2.3 && fail "the standby's port has the group before any move"
export ACROSS_S=20

# What reaches the LAN through the second IOC during the first move, from sd0 and its VM.
ip netns exec sd-lan $RAW recv lan2 "$T/announced.hex" 24 "$MAC,$VM" >"$T/raw.out" &
PIDS+=($!); raw=$!
eventually 5 grep -q ready "$T/raw.out" || fail "the capture on lan2 did not start"
across "kill -9 of the active IOC" kill -9 "$IOC_PID"
kill_gap=$GAP_MS
wait "$raw" || fail "the capture on lan2 failed"
kinds=$($RAW kinds "$T/announced.hex")
log "announced through the new IOC: $(echo "$kinds" | head -1)"
# announce_count (3) rounds: a gratuitous ARP for 10.50.0.1, NAs for fd50::1 and sd0's
# link-local address, a RARP for sd0's MAC and one for the VM, IGMP and MLD reports.
for want in garp=3 rarp=6 igmp=3 mld=3; do
    echo "$kinds" | grep -qw "$want" || fail "announcements after the move: want $want, got: $kinds"
done
echo "$kinds" | grep -q 'na=[1-9]' || fail "no neighbour advertisement after the move: $kinds"
assert_eq "$(echo "$kinds" | grep -c "rarp:$VM")" 3 "RARPs for the bridged VM"
# The LAN's bridge checked the reports (checksums, Router Alert) and learnt the new port.
mdb_on lan2 239.1.2.3 || fail "the bridge did not learn sd0's IPv4 group on the new port: $(bridge -n sd-lan mdb show)"
mdb_on lan2 ff0e::5d || fail "the bridge did not learn sd0's IPv6 group on the new port: $(bridge -n sd-lan mdb show)"
assert_eq "$(queues_on "$T/ioc2.sock")" "[0, 1]" "host 1's queues moved together to the second IOC"
active_is 1 || fail "not moved to the standby: $(role 1)"
assert_eq "$(link_mac sd-host sd0)" "$MAC" "sd0's MAC after the move"
assert_grep "$T/host1.log" 'moved to the standby IOC.*cause=closed' "the move logged with its cause"
wait "$IOC_PID" 2>/dev/null
IOC_CONF=$T/ioc1.toml start_ioc
eventually 10 ready_is 0 || fail "the restarted primary did not become the standby: $(role 0)"

cut_port() { ip -n sd-ioc2 link set fab1 down; }
across "the active IOC's fabric port set down" cut_port
cut_gap=$GAP_MS
active_is 0 || fail "not moved on a silent IOC: $(role 0)"
assert_grep "$T/host1.log" 'cause=silent' "the move by liveness logged"
run ip -n sd-ioc2 link set fab1 up
eventually 15 ready_is 1 || fail "the second IOC did not come back as the standby: $(role 1)"

nic_down() { ip -n sd-ioc link set lan0 down; }
across "the active IOC's NIC set down" nic_down
nic_gap=$GAP_MS
active_is 1 || fail "not moved on the NIC's loss: $(role 1)"
assert_grep "$T/host1.log" 'cause=nic_down' "the move by LinkChange logged"
run ip -n sd-ioc link set lan0 up
eventually 10 ready_is 0 || fail "the primary with its NIC back is not a ready standby: $(role 0)"
# No failback configured: the host stays where it is.
sleep 2
active_is 1 || fail "moved back without a failback configured"
moves=$(hjson status "len(d['status']['fabric']['moves'])")
assert_eq "$moves" 3 "moves listed by splitnetctl status"
metrics=$(hjson status "[m['took_ms'] for m in d['status']['fabric']['moves']]")
log "moves took (loss seen to Activate Ok, ms): $metrics"
stop_host 1

# --- Failback after 1 s.
HOST_CONF=$BASE_HOST_CONF; host_conf "$IOC2_PUB" "failback_after_s = 1"
run ip -n sd-host link del sd0  # made anew with one queue
start_host 1
wait_carrier sd-host up 10
eventually 5 ready_is 1 || fail "no ready standby"
kill -9 "$IOC_PID"; wait "$IOC_PID" 2>/dev/null
eventually 5 active_is 1 || fail "no move to the standby"
IOC_CONF=$T/ioc1.toml start_ioc
eventually 10 active_is 0 || fail "no failback to the primary: $(role 0)"
assert_grep "$T/host1.log" 'failing back to the primary IOC' "the failback logged"
ping_ok sd-lan 10.50.0.1
eventually 10 ready_is 1 || fail "the second IOC is not the standby again"
log "failback: back on the primary 1 s after it was a ready standby"

log "longest gap between replies: kill -9 ${kill_gap} ms, fabric port down ${cut_gap} ms, NIC down ${nic_gap} ms"
pass "standby IOC: moves across kill -9, a cut fabric port and a lost NIC with the transfer intact and no duplicate; failback; mismatched standbys refused"
