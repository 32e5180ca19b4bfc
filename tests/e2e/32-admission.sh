#!/usr/bin/env bash
# Admission by key (auth.admission = "keys", the default; docs/protocol.md 5.1): only the
# hosts of [[auth.hosts]] get in, each proving its key, and the attacks on admission grant
# nothing while an admitted host (host 1) works on. Attacks, from host 2's namespace (host 2's
# key is admitted: a host gone rogue): a Hello without a key, an unknown key, a handshake for
# another IOC's key, a replayed handshake, a data channel without proof, a forged control
# message, a claim of host 1's node id (the MAC follows the key), and a flood of Hellos
# without a key. Then a host whose key is not admitted is refused until the operator admits
# it with a reload (README: admitting a host), gets its policy's MAC, and is cut off when a
# reload takes its key out again.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3; need_daemons; need_rogue
sed 's/^# listen = "127.0.0.1:9702"/listen = "127.0.0.1:9702"/' "$IOC_CONF" >"$T/ioc.toml"
grep -q '^listen = "127.0.0.1:9702"' "$T/ioc.toml" || fail "could not set the IOC's metrics listener"
IOC_CONF=$T/ioc.toml
# metric NAME: a counter of the IOC's metrics.
metric() {
    ip netns exec sd-ioc python3 -c "import sys, urllib.request as u
for l in u.urlopen('http://127.0.0.1:9702/metrics', timeout=2).read().decode().splitlines():
    if l.startswith(sys.argv[1] + ' '): print(l.split()[1])" "$1"
}
failures() { metric splitnet_ioc_handshake_failures_total; }
topo_up 2; start_ioc; start_host 1
wait_carrier sd-host up 10
json() { ctl_json "$T/ioc.sock" "$@"; }
mac1=$(link_mac sd-host sd0)
assert_eq "$(json hosts "len(d['hosts']['hosts'])")" 1 "hosts served"
assert_eq "$(json hosts "d['hosts']['hosts'][0]['name']")" host1 "host 1's name from its policy"
assert_grep "$T/host1.log" 'authenticating with this host key' "host 1 authenticates"

# ping_run SECONDS: pings the LAN peer from host 1 every 50 ms; prints "answered sent avg_us".
ping_run() {
    ip netns exec sd-host ping -q -i 0.05 -w "$1" -W 1 10.50.0.2 |
        awk -F'[ /,]+' '/packets transmitted/ { s = $1; r = $4 } /^rtt/ { a = $8 * 1000 } END { printf "%d %d %d\n", r, s, a }'
}
read -r solo_ok solo_sent solo_us < <(ping_run 3)
solo_gbps=$(iperf sd-host 10.50.0.2 5201 -t 3)
log "solo: $solo_ok/$solo_sent pings, avg $solo_us us; iperf3 $solo_gbps Gb/s"
failures_before=$(failures)

# The attacks, with host 1 pinging and then sending meanwhile.
claimed=$(python3 -c "import base64, sys; print(int.from_bytes(base64.b64decode(sys.argv[1])[:8], 'big'))" "${HOST_PUB[1]}")
ping_run 12 >"$T/ping.attack" &
pinger=$!
PIDS+=("$pinger")
ip netns exec sd-host2 "$ROGUE" auth 10.200.0.2:7400 "$T/cred/host2/splitnet.key" "$IOC_PUB" "$claimed" >"$T/rogue.out" 2>&1
rc=$?
sed 's/^/  rogue: /' "$T/rogue.out"
assert_eq "$rc" 0 "rogue auth's exit status (0: every attack refused)"
mac_rogue=$(sed -n 's/.*got mac=\([0-9a-f:]*\).*/\1/p' "$T/rogue.out")
assert_match "$mac_rogue" '^02:5d:00:' "the rogue session's MAC"
assert_ne "$mac_rogue" "$mac1" "the MAC of a host claiming host 1's node id"
# A flood of Hellos without a key: four floods of 400 connections at once; every one refused.
for i in 1 2 3 4; do
    ip netns exec sd-host2 "$ROGUE" churn 10.200.0.2:7400 400 >"$T/flood.$i" 2>&1 &
    PIDS+=($!)
    floods+=($!)
done
for p in "${floods[@]}"; do wait "$p"; done
for i in 1 2 3 4; do
    assert_grep "$T/flood.$i" '^churn: 400 connections, 400 failed$' "flood $i: every unauthenticated Hello refused"
done
attack_gbps=$(iperf sd-host 10.50.0.2 5202 -t 3)
wait "$pinger"
read -r att_ok att_sent att_us <"$T/ping.attack"
log "under attack: $att_ok/$att_sent pings, avg $att_us us ($(python3 -c "print('%.2f' % ($att_us / max($solo_us, 1)))")x solo); iperf3 $attack_gbps Gb/s ($(python3 -c "print('%.2f' % ($attack_gbps / $solo_gbps))")x solo)"
assert_eq "$att_ok" "$att_sent" "host 1's pings answered during the attacks"
assert_positive "$attack_gbps" "host 1's iperf3 after the floods (Gb/s)"
assert_alive "$IOC_PID" "ioc-driver"
assert_eq "$(carrier sd-host)" up "host 1's carrier"
assert_eq "$(link_mac sd-host sd0)" "$mac1" "host 1's MAC"
failures=$(failures)
assert_ge "$((failures - failures_before))" 1600 "handshake failures counted"
# No worker's loop stalled meanwhile: the watchdog was fed on every tick.
assert_eq "$(metric splitnet_ioc_watchdog_withheld_total)" 0 "watchdog ticks withheld during the attacks"
eventually 3 test "$(json hosts "len(d['hosts']['hosts'])")" = 1 || fail "sessions left by the attacks: $(json hosts "[h['address'] for h in d['hosts']['hosts']]")"
# The first refusal is logged; the later ones at a limited rate, each line counting those it
# held back: far fewer lines than refusals.
assert_grep "$T/ioc.log" 'connection refused: a Hello without a key' "the IOC's log of the first refusal"
lines=$(grep -c 'refused' "$T/ioc.log")
assert_le "$lines" 100 "refusal log lines"
log "the IOC logged $lines refusal lines for $((failures - failures_before)) refused handshakes"

# A host with a key the IOC does not list stays down, says why, and the IOC names its key;
# admitted (its public key added to [[auth.hosts]], the IOC reloaded: SIGHUP, as systemctl
# reload sends), it comes up with the MAC its policy gives, host 1's session undisturbed.
# Taken out again and reloaded, its session ends at once.
mkdir -p "$T/cred/new"
(umask 077 && "$BIN/splitnetctl" genkey >"$T/cred/new/splitnet.key")
newpub=$("$BIN/splitnetctl" pubkey <"$T/cred/new/splitnet.key")
mv "$T/cred/host2" "$T/cred/host2.old" && mv "$T/cred/new" "$T/cred/host2"
start_host 2
sleep 2
assert_eq "$(carrier sd-host2)" down "the carrier of a host whose key is not admitted"
assert_grep "$T/host2.log" 'refused the connection: Unauthenticated' "the refused host's log"
eventually 6 grep -qF "host key $newpub is not admitted" "$T/ioc.log" ||
    fail "the IOC's log does not name the refused key $newpub"
cp "$IOC_CONF" "$T/ioc-before.toml"
printf '\n[[auth.hosts]]\nname = "newcomer"\npublic_key = "%s"\nmac = "02:5d:00:00:0a:0b"\n' "$newpub" >>"$IOC_CONF"
"$BIN/ioc-driver" --check-config --config "$IOC_CONF" >/dev/null || fail "ioc.toml with the new host refused"
connects=$(grep -c 'host connected .*name="host1"' "$T/ioc.log")
kill -HUP "$IOC_PID"
wait_carrier sd-host2 up 10
assert_grep "$T/ioc.log" 'reloaded \[auth\] hosts=9' "the IOC's log of the reload"
assert_eq "$(link_mac sd-host2 sd0)" 02:5d:00:00:0a:0b "the admitted host's MAC from its policy"
ping_ok sd-host2 10.50.0.2
assert_eq "$(grep -c 'host connected .*name="host1"' "$T/ioc.log")" "$connects" "host 1's connections across the reload"
assert_eq "$(json hosts "' '.join(sorted(h['name'] for h in d['hosts']['hosts']))")" "host1 newcomer" "hosts after the reload"
cp "$T/ioc-before.toml" "$IOC_CONF"
kill -HUP "$IOC_PID"
wait_carrier sd-host2 down 5
assert_grep "$T/ioc.log" 'no longer admitted' "the IOC's log of the revocation"
eventually 3 test "$(json hosts "len(d['hosts']['hosts'])")" = 1 || fail "the revoked host's session stays"
ping_ok sd-host 10.50.0.2
# A restart: host 1 comes back with the same MAC (it follows the key).
stop_ioc
start_ioc
wait_carrier sd-host up 10
assert_eq "$(link_mac sd-host sd0)" "$mac1" "host 1's MAC after the IOC's restart"
ping_ok sd-host 10.50.0.2
pass "only admitted keys get in; the attacks on admission grant nothing and host 1 works on"
