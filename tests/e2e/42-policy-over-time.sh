#!/usr/bin/env bash
# Per-host policy that holds over time ([[auth.hosts]], README "What a reload applies"):
# - reserved MACs: while host 1 is away, host 2 asks for host 1's MAC and for its bridged
#   machine's (ip link set sd0 address): refused, it keeps its own; host 1 comes back to both;
# - a reload reaches live sessions: host 2's promiscuity taken away stops its snooping (a
#   capture on its sd0 a second later sees no frame for no one), host 3's container, cut off
#   until its MAC is added to host 3's extra_macs, reaches the LAN after the reload without a
#   reconnect; a reload that changes a key only a restart applies, or a file that does not
#   parse, is refused whole (splitnetctl reload exits 1 saying why; nothing is applied);
# - a key is one host: a second host-driver with host 1's key fights it, the IOC never holds
#   more than one session of the key and logs the shared key by the entry's name, and host 3
#   is admitted and served meanwhile; a host with more queues than its entry allows is
#   refused (Busy) until a reload allows them; a reload that removes its entry ends its
#   sessions;
# - a key's handshakes that never prove it (no data channel) take no session's place.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping python3 dumpcap; need_daemons; need_rogue
RES1=02:5d:00:00:00:31
CTR1=02:aa:00:00:00:01
CTR3=02:cc:00:00:00:03
NOBODY=02:99:99:99:99:99
CTL=$BIN/splitnetctl
# policy FILE PY: IOC_CONF rewritten by python (the text in `t`) into FILE.
policy() {
    python3 - "$IOC_CONF" "$1" "$2" <<'PY' || fail "cannot write the hosts' policy"
import re, sys
t = open(sys.argv[1]).read()
def entry(name, *lines):
    global t
    t = re.sub(r'^name = "%s"$' % name, '\n'.join(['name = "%s"' % name] + list(lines)), t, count=1, flags=re.M)
exec(sys.argv[3])
open(sys.argv[2], "w").write(t)
PY
}
# Host 1: a fixed MAC and a bridged machine; host 2 may be promiscuous (lib.sh's entries all
# may); no host but host 2 may be.
policy "$T/ioc.toml" "
t = t.replace('\npromiscuous = true\n', '\n')
entry('host1', 'mac = \"$RES1\"', 'extra_macs = [\"$CTR1\"]')
entry('host2', 'promiscuous = true')"
grep -q "^mac = \"$RES1\"" "$T/ioc.toml" || fail "no mac for host1 in $T/ioc.toml"
BASE=$T/ioc.base.toml
cp "$T/ioc.toml" "$BASE"
IOC_CONF=$T/ioc.toml
# reload_to PY: the IOC's file becomes the base policy rewritten by PY, and the IOC reloads it.
reload_to() {
    local keep=$IOC_CONF
    IOC_CONF=$BASE policy "$keep" "$1"
    "$CTL" -s "$T/ioc.sock" reload >"$T/reload.out" 2>&1 || fail "reload refused: $(cat "$T/reload.out")"
}
json() { ctl_json "$T/ioc.sock" "$@"; }
# of NAME FIELD: FIELD of host NAME's first queue at the IOC ('-' when it has none).
of() { json hosts "next((h.get('$2') for h in d['hosts']['hosts'] if h['name'] == '$1' and h['queue'] == 0), '-')"; }
sessions_of() { json hosts "sum(1 for h in d['hosts']['hosts'] if h['name'] == '$1')"; }
# is FUNCTION ARG... VALUE: whether FUNCTION ARG... prints VALUE (for eventually).
is() { local want=${*: -1}; [ "$("${@:1:$#-1}")" = "$want" ]; }

topo_up 5; start_ioc; NO_ADDR=1 start_host 3
wait_carrier sd-host3 up 10

# Reserved MACs: host 2 asks for host 1's MAC, then its bridged machine's (interface.mac: a
# SetMac at each connection) while host 1 is away: refused, it gets a MAC of its own.
for m in "$RES1" "$CTR1"; do
    sed "s/^# mac = .*/mac = \"$m\"/" "$HOST_CONF" >"$T/host-mac.toml"
    grep -q "^mac = \"$m\"" "$T/host-mac.toml" || fail "cannot give host 2 interface.mac = $m"
    HOST_CONF=$T/host-mac.toml start_host 2
    wait_carrier sd-host2 up 10
    eventually 3 grep -q "MAC address set mac=02:5d:00:" "$T/host2.log" ||
        fail "host 2 did not fall back to the MAC the IOC assigns after asking for $m"
    assert_ne "$(of host2 mac)" "$m" "host 2's MAC at the IOC after asking for $m (reserved for host 1)"
    assert_ne "$(link_mac sd-host2 sd0)" "$m" "host 2's sd0 after the IOC refused $m"
    stop_host 2
done
start_host 2
wait_carrier sd-host2 up 10
start_host 1
wait_carrier sd-host up 10
assert_eq "$(link_mac sd-host sd0)" "$RES1" "host 1's MAC when it comes back"
assert_eq "$(of host1 bridged)" "['$CTR1']" "host 1's bridged machine at the IOC"
ping_ok sd-host 10.50.0.2
log "host 2 refused $RES1 and $CTR1 while host 1 was away; host 1 came back to both"

# snoop NAME: host 2 captures on sd0 while the LAN pings a MAC no one has; the frames for it.
snoop() {
    ip netns exec sd-host2 dumpcap -q -i sd0 -a duration:3 -w "$T/$1.pcap" >"$T/dumpcap.out" 2>&1 &
    local cap=$!
    PIDS+=("$cap")
    sleep 1
    ip netns exec sd-lan ping -q -c 10 -i 0.05 -W 1 10.50.0.203 >/dev/null 2>&1
    wait "$cap" || fail "dumpcap on host 2's sd0: $(cat "$T/dumpcap.out")"
    pcap_count "$T/$1.pcap" "$NOBODY"
}
run ip -n sd-lan neigh replace 10.50.0.203 lladdr "$NOBODY" dev lan1 nud permanent
run ip -n sd-host2 link set sd0 promisc on
eventually 5 is of host2 promisc True || fail "host 2 not promiscuous at the IOC (its policy allows it)"
before=$(snoop promisc)
assert_positive "$before" "frames for no one reaching promiscuous host 2 (the capture works)"

# Host 3's container: its MAC is in no policy yet, so it is cut off (dropped as spoofed).
run ip -n sd-host3 link add br0 type bridge
run ip -n sd-host3 link set sd0 master br0
addns sd-ctr3
run ip -n sd-host3 link add vctr type veth peer name ctr0 netns sd-ctr3
run ip -n sd-host3 link set vctr master br0
run ip -n sd-host3 link set vctr up
run ip -n sd-host3 link set br0 up
run ip -n sd-ctr3 link set ctr0 address "$CTR3"
run ip -n sd-ctr3 addr add 10.50.0.103/24 dev ctr0
run ip -n sd-ctr3 link set ctr0 up
spoofed3() { json hosts "next(h.get('drops', {}).get('tx_spoofed_source', 0) for h in d['hosts']['hosts'] if h['name'] == 'host3')"; }
ip netns exec sd-ctr3 ping -q -c 3 -i 0.2 -W 1 10.50.0.2 >/dev/null 2>&1 && fail "host 3's container reached the LAN without a policy"
assert_positive "$(spoofed3)" "host 3's container's frames dropped as spoofed before the reload"

# One reload: host 2 may no longer be promiscuous, host 3 bridges its container.
reload_to "
entry('host3', 'extra_macs = [\"$CTR3\"]')
t = t.replace('name = \"host2\"\npromiscuous = true', 'name = \"host2\"')"
log "$(cat "$T/reload.out")"
sleep 1
assert_eq "$(of host2 promisc)" False "host 2's promiscuity at the IOC a second after the reload"
after=$(snoop unpromisc)
assert_eq "$after" 0 "frames for no one reaching host 2 from a second after the reload"
assert_eq "$(of host3 bridged)" "['$CTR3']" "host 3's bridged machine after the reload"
eventually 3 ip netns exec sd-ctr3 ping -q -c 1 -W 1 10.50.0.2 >/dev/null ||
    fail "host 3's container still cut off after its MAC was added and the IOC reloaded"
ip netns exec sd-ctr3 ping -q -c 10 -i 0.05 -W 1 10.50.0.2 >"$T/ping.ctr3" || fail "pings from host 3's container: $(tail -n 2 "$T/ping.ctr3")"
log "reload: host 2's snooping stopped ($before frames for no one before, $after after); host 3's container reaches the LAN: $(grep packets "$T/ping.ctr3")"

# Refused reloads: a restart-only key beside an [auth] change, and a file that does not parse.
cp "$IOC_CONF" "$T/ioc.good.toml"
policy "$IOC_CONF" "
t = t.replace('storm_control_pps = 5000', 'storm_control_pps = 4000')
entry('host2', 'promiscuous = true')"
grep -q '^storm_control_pps = 4000' "$IOC_CONF" || fail "cannot change lan.storm_control_pps"
"$CTL" -s "$T/ioc.sock" reload >"$T/reload.out" 2>&1 && fail "a reload changing [lan] was applied: $(cat "$T/reload.out")"
assert_grep "$T/reload.out" 'reload refused: \[lan\] changed' "splitnetctl reload's reason"
echo '[nonsense' >>"$IOC_CONF"
"$CTL" -s "$T/ioc.sock" reload >"$T/reload.out" 2>&1 && fail "a file that does not parse was reloaded"
assert_grep "$T/reload.out" 'reload refused' "splitnetctl reload's reason for a broken file"
run ip -n sd-host2 link set sd0 promisc off
run ip -n sd-host2 link set sd0 promisc on
sleep 1
assert_eq "$(of host2 promisc)" False "host 2's promiscuity after the refused reloads (nothing applied)"
cp "$T/ioc.good.toml" "$IOC_CONF"
log "reloads refused whole: [lan] changed; a file that does not parse"

# Handshakes that never prove their key (a replayed first message cannot open its data
# channel) take no session's place: host 5's key opens control channels without data
# channels for 12 s, one every 20 ms (each waits out the 2 s handshake timeout), while host 3
# reconnects and is served, before the attack ends.
ip netns exec sd-host5 "$ROGUE" hold 10.200.0.2:7400 "$T/cred/host5/splitnet.key" "$IOC_PUB" 12 >"$T/rogue-hold.out" 2>&1 &
holder=$!
PIDS+=("$holder")
sleep 1
stop_host 3
NO_ADDR=1 start_host 3
wait_carrier sd-host3 up 10
eventually 5 ip netns exec sd-ctr3 ping -q -c 1 -W 1 10.50.0.2 >/dev/null ||
    fail "host 3 not served while another key's handshakes went unproven"
assert_alive "$holder" "the unproven handshakes, still going when host 3 was served"
assert_eq "$(sessions_of host5)" 0 "sessions of the key whose handshakes never proved it"
wait "$holder" || fail "rogue hold: $(cat "$T/rogue-hold.out")"
# Each was answered: none was refused for want of a place (the IOC before this counted
# every one as a session until its handshake timed out, and refused the rest, Busy).
assert_grep "$T/rogue-hold.out" '^held [1-9][0-9]* control channels without a data channel \(0 refused\)$' \
    "the unproven handshakes, every one answered and none holding a place"
log "$(cat "$T/rogue-hold.out"); host 3 reconnected and was served meanwhile"

# A key is one host: a second host-driver with host 1's key, in host 4's namespace.
CREDENTIALS_DIRECTORY=$T/cred/host1 ip netns exec sd-host4 "$BIN/host-driver" --config "$HOST_CONF" \
    --control-socket "$T/host4.sock" >>"$T/host1-twin.log" 2>&1 &
twin=$!
PIDS+=("$twin")
most=0
stop_host 3
for i in $(seq 25); do
    n=$(sessions_of host1)
    [ "$n" -gt "$most" ] && most=$n
    [ "$i" = 5 ] && NO_ADDR=1 start_host 3
    sleep 0.2
done
assert_le "$most" 1 "sessions of host 1's key at once while two host-drivers share it"
eventually 5 grep -q 'host "host1": sessions of its key replace each other; two host-drivers share the key' "$T/ioc.log" ||
    fail "the IOC did not name the entry whose key two host-drivers share"
wait_carrier sd-host3 up 10
eventually 5 ip netns exec sd-ctr3 ping -q -c 1 -W 1 10.50.0.2 >/dev/null ||
    fail "host 3 (its container) not served after it reconnected during the fight"
kill "$twin"; wait "$twin" 2>/dev/null
eventually 10 ip netns exec sd-host ping -q -c 1 -W 1 10.50.0.2 >/dev/null || fail "host 1 did not recover once its twin stopped"
log "two host-drivers with one key: at most $most session(s) of it; host 3 admitted and served meanwhile"

# Queues: host 5 with two queues, its entry allowing one, then two.
sed 's/^queues = 1$/queues = 2/' "$HOST_CONF" >"$T/host-2q.toml"
grep -q '^queues = 2$' "$T/host-2q.toml" || fail "cannot make a 2-queue host configuration"
HOST_CONF=$T/host-2q.toml NO_ADDR=1 start_host 5
eventually 5 grep -q 'host "host5": queue 0 of 2 beyond the 1 its entry allows' "$T/ioc.log" ||
    fail "host 5's second queue was not refused by its entry"
assert_eq "$(sessions_of host5)" 0 "sessions of host 5 while its entry allows one queue"
reload_to "
entry('host3', 'extra_macs = [\"$CTR3\"]')
t = t.replace('name = \"host2\"\npromiscuous = true', 'name = \"host2\"')
t = re.sub(r'(name = \"host5\"\npublic_key = \"[^\"]*\"\n)queues = 1', r'\1queues = 2', t)"
eventually 10 is sessions_of host5 2 || fail "host 5 not admitted with two queues after the reload: $(sessions_of host5)"
# Its entry removed: its sessions end.
reload_to "
entry('host3', 'extra_macs = [\"$CTR3\"]')
t = t.replace('name = \"host2\"\npromiscuous = true', 'name = \"host2\"')
t = re.sub(r'\n\[\[auth.hosts\]\]\nname = \"host5\"\npublic_key = \"[^\"]*\"\nqueues = 1\n', '\n', t)"
grep -q 'name = "host5"' "$IOC_CONF" && fail "host 5's entry is still in $IOC_CONF"
eventually 3 is sessions_of host5 0 || fail "host 5's sessions outlived its entry"
ping_ok sd-host 10.50.0.2
pass "policy holds over time: reserved MACs, reloads reaching live sessions, a key is one host"
