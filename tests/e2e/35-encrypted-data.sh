#!/usr/bin/env bash
# The data channel encrypted (docs/protocol.md 5.1, "Sealed data channel"): host 1 asks for it
# (auth.encrypt_data), host 2 does not. Both reach the LAN (ping, iperf3 both ways for host
# 1); a capture on each host's fabric link during a ping whose payload is a known pattern finds
# the pattern on host 2's link and never on host 1's. Then the IOC requires encryption
# (auth.encrypt_data on the IOC): host 2's data channel is refused, counted and logged,
# while host 1 reconnects and works.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping iperf3 python3 dumpcap tshark; need_daemons
PATTERN=5e1fc0de5e1fc0de5e1fc0de5e1fc0de
sed 's/^# encrypt_data = false$/encrypt_data = true/' "$HOST_CONF" >"$T/host-sealed.toml"
grep -q '^encrypt_data = true' "$T/host-sealed.toml" || fail "no '# encrypt_data = false' line in $HOST_CONF"
PLAIN_CONF=$HOST_CONF

topo_up 2; start_ioc
# Host 1's fabric link from its first handshake on, for the dissector (below).
ip netns exec sd-host dumpcap -q -i fab0 -w "$T/fab1-all.pcap" >"$T/dumpcap-all.out" 2>&1 &
whole=$!
PIDS+=("$whole")
sleep 1
HOST_CONF=$T/host-sealed.toml start_host 1
HOST_CONF=$PLAIN_CONF start_host 2
wait_carrier sd-host up 10
wait_carrier sd-host2 up 10
assert_grep "$T/host1.log" "fabric up.*data_sealed=true" "host 1's data channel sealed"
assert_grep "$T/host2.log" "fabric up.*data_sealed=false" "host 2's data channel in the clear"
peer_of() { ctl_json "$T/ioc.sock" hosts "[h['address'] for h in d['hosts']['hosts'] if h['name'] == 'host$1'][0]"; }
assert_match "$(peer_of 1)" "data sealed" "the IOC's report of host 1"
ping_ok sd-host 10.50.0.2
ping_ok sd-host2 10.50.0.2

# The dissector (tools/wireshark/splitnet.lua) shows the sealed data channel as records, with
# nothing malformed, on a capture bounded as e2e 21 bounds its own (iperf3 at 40 Mb/s).
iperf sd-host 10.50.0.2 5349 -t 2 -b 40M >/dev/null || fail "iperf3 at 40 Mb/s from host 1"
kill -INT "$whole"
wait "$whole" 2>/dev/null
LUA=$ROOT/tools/wireshark/splitnet.lua
records=$(tshark -n -X "lua_script:$LUA" -r "$T/fab1-all.pcap" -Y splitnet.sealed_record 2>/dev/null | wc -l)
bad=$(tshark -n -X "lua_script:$LUA" -r "$T/fab1-all.pcap" \
    -Y '_ws.malformed || _ws.lua.error || _ws.expert.severity == error' 2>/dev/null | wc -l)
log "the dissector on host 1's fabric link: $records frames of sealed data records, $bad malformed"
assert_positive "$records" "frames of sealed data records in the dissector's view"
assert_eq "$bad" 0 "malformed frames or Lua errors in the dissector's view"

up=$(iperf sd-host 10.50.0.2 5350 -t 3) || fail "iperf3 host 1 -> LAN"
down=$(iperf sd-host 10.50.0.2 5351 -t 3 -R) || fail "iperf3 LAN -> host 1"
log "host 1, data channel sealed: $up Gb/s to the LAN, $down Gb/s back"

# count_pattern K: pings with the pattern from host K while its fabric link is captured;
# prints how many captured bytes sequences hold the pattern.
count_pattern() {
    local k=$1 ns pcap=$T/fab$1.pcap
    ns=$(host_ns "$k")
    ip netns exec "$ns" dumpcap -q -i fab0 -a duration:3 -w "$pcap" >"$T/dumpcap$k.out" 2>&1 &
    local cap=$!
    PIDS+=("$cap")
    sleep 1
    ip netns exec "$ns" ping -q -c 5 -i 0.2 -s 400 -p "$PATTERN" 10.50.0.2 >/dev/null ||
        fail "ping with a pattern from host $k"
    wait "$cap" || fail "dumpcap on host $k's fabric link: $(cat "$T/dumpcap$k.out")"
    python3 -c "import sys; print(open(sys.argv[1], 'rb').read().count(bytes.fromhex(sys.argv[2])))" "$pcap" "$PATTERN"
}
clear=$(count_pattern 2)
sealed=$(count_pattern 1)
log "the pattern on the fabric: $clear times from host 2 (clear), $sealed from host 1 (sealed)"
assert_positive "$clear" "the pattern seen on host 2's fabric link (the capture works)"
assert_eq "$sealed" 0 "the pattern seen on host 1's fabric link"


# The IOC requires encryption: host 2 is refused, host 1 comes back.
stop_ioc
sed 's/^# encrypt_data = false$/encrypt_data = true/' "$IOC_CONF" >"$T/ioc-sealed.toml"
grep -q '^encrypt_data = true' "$T/ioc-sealed.toml" || fail "no '# encrypt_data = false' line in $IOC_CONF"
IOC_CONF=$T/ioc-sealed.toml start_ioc
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
eventually 10 grep -q "data channel not encrypted" "$T/ioc.log" || fail "host 2's clear data channel not refused"
assert_eq "$(carrier sd-host2)" down "host 2's carrier while the IOC refuses it"
pass "the data channel sealed at a host's request: its frames unreadable on the fabric; required, a clear one refused"
