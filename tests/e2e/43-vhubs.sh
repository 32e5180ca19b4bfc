#!/usr/bin/env bash
# vHubs: each host's VLANs ([[auth.hosts]] vlan, vlans; README "VLANs"). Host 1 is an access
# host of VLAN 10, host 2 of VLAN 20, host 3 has no VLAN, host 4 is a trunk of VLAN 10. This
# kernel has no VLAN devices, so the LAN peer sends and reads raw tagged frames
# (tests/rawframes.py), as e2e 27 does:
# - hosts 1 and 2 each reach the LAN peer on their VLAN: their untagged frames arrive tagged
#   with it, the peer's frames tagged with it arrive untagged, and those of the other VLAN
#   or untagged never reach them; each gets only its VLAN's broadcasts;
# - host 1 (access 10) and host 4 (trunk 10) reach each other, each seeing the tag as its
#   mode says; host 2 sees none of it;
# - host 3 sends a tagged frame: dropped and counted (tx_vlan), while its untagged ping
#   works; a frame of VLAN 10 from host 4 is none of host 3's.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping python3; need_daemons
RAW="python3 $ROOT/tests/rawframes.py"
python3 - "$IOC_CONF" "$T/ioc.toml" <<'PY' || fail "cannot write the hosts' VLANs"
import re, sys
t = open(sys.argv[1]).read()
for name, line in (("host1", "vlan = 10"), ("host2", "vlan = 20"), ("host4", "vlans = [10]")):
    t = re.sub(r'^name = "%s"$' % name, 'name = "%s"\n%s' % (name, line), t, count=1, flags=re.M)
open(sys.argv[2], "w").write(t)
PY
grep -q '^vlans = \[10\]$' "$T/ioc.toml" || fail "no vlans for host4 in $T/ioc.toml"
IOC_CONF=$T/ioc.toml
topo_up 4; start_ioc
for k in 1 2 3 4; do start_host "$k"; done
for k in 1 2 3 4; do wait_carrier "$(host_ns "$k")" up 10; done
ping_ok sd-host3 10.50.0.2
lan=$(link_mac sd-lan lan1)
declare -A MAC NS
for k in 1 2 3 4; do NS[$k]=$(host_ns "$k"); MAC[$k]=$(link_mac "${NS[$k]}" sd0); done
BCAST=ff:ff:ff:ff:ff:ff

# mkframe DST SRC N [TPID:TCI]: a test frame in hex, ethertype 0x88b5, 46 bytes of payload
# naming N: untagged 60 bytes, so that with a tag it is the same frame and the tag's 4 bytes.
mkframe() {
    local dst=${1//:/} src=${2//:/} n=$3 payload
    payload=$(printf 'splitnet-vhub-test-%02d' "$n" | od -An -tx1 | tr -d ' \n')
    while [ ${#payload} -lt 92 ]; do payload+=00; done
    echo "$dst$src${4:+${4%%:*}${4##*:}}88b5$payload"
}
# Receivers on every host's sd0 and the LAN peer's lan1, for one round of frames.
listen() {
    local k
    RX=()
    for k in 1 2 3 4; do
        ip netns exec "${NS[$k]}" $RAW recv sd0 "$T/got.$k" 3 >"$T/ready.$k" 2>&1 &
        RX+=($!)
    done
    ip netns exec sd-lan $RAW recv lan1 "$T/got.lan" 3 >"$T/ready.lan" 2>&1 &
    RX+=($!)
    PIDS+=("${RX[@]}")
    for k in 1 2 3 4 lan; do
        for _ in $(seq 50); do grep -q ready "$T/ready.$k" && break; sleep 0.1; done
        grep -q ready "$T/ready.$k" || fail "receiver $k did not start: $(cat "$T/ready.$k")"
    done
}
collect() { local p; for p in "${RX[@]}"; do wait "$p" || fail "a receiver failed"; done; }
# arrived WHERE HEX: the frame arrived at WHERE (1..4, lan) exactly once.
arrived() { [ "$(grep -c -x "$2" "$T/got.$1")" = 1 ] || fail "$3: frame not received once at $1; got: $(cut -c1-64 "$T/got.$1" | tr '\n' ' ')"; }
# none WHERE N: no frame of payload N reached WHERE.
none() {
    local tag
    tag=$(printf 'splitnet-vhub-test-%02d' "$2" | od -An -tx1 | tr -d ' \n')
    grep -q "$tag" "$T/got.$1" && fail "$3: frame $2 reached $1"
    return 0
}
send() { ip netns exec "$1" $RAW send "$2" "${@:3}" || fail "cannot send on $1 $2"; }

# Round 1: the hosts to the LAN, and host 1 with host 4.
listen
send sd-host sd0 "$(mkframe "$lan" "${MAC[1]}" 1)" "$(mkframe "$BCAST" "${MAC[1]}" 2)"
send sd-host2 sd0 "$(mkframe "$lan" "${MAC[2]}" 3)"
send sd-host4 sd0 "$(mkframe "${MAC[1]}" "${MAC[4]}" 4 8100:000a)" "$(mkframe "$lan" "${MAC[4]}" 5 8100:0014)"
before3=$(ctl_json "$T/ioc.sock" hosts "next(h.get('drops', {}).get('tx_vlan', 0) for h in d['hosts']['hosts'] if h['name'] == 'host3')")
send sd-host3 sd0 "$(mkframe "$lan" "${MAC[3]}" 6 8100:000a)"
collect
arrived lan "$(mkframe "$lan" "${MAC[1]}" 1 8100:000a)" "host 1's frame on the LAN, tagged 10"
arrived lan "$(mkframe "$BCAST" "${MAC[1]}" 2 8100:000a)" "host 1's broadcast on the LAN, tagged 10"
arrived 4 "$(mkframe "$BCAST" "${MAC[1]}" 2 8100:000a)" "host 1's broadcast at trunk host 4, tagged 10"
none 2 2 "host 1's broadcast (VLAN 10) at host 2 (VLAN 20)"
none 3 2 "host 1's broadcast (VLAN 10) at untagged host 3"
arrived lan "$(mkframe "$lan" "${MAC[2]}" 3 8100:0014)" "host 2's frame on the LAN, tagged 20"
arrived 1 "$(mkframe "${MAC[1]}" "${MAC[4]}" 4)" "host 4's VLAN 10 frame at host 1, untagged"
none lan 5 "host 4's VLAN 20 frame (not in its vlans)"
none lan 6 "host 3's tagged frame"
drops3=$(ctl_json "$T/ioc.sock" hosts "next(h.get('drops', {}).get('tx_vlan', 0) for h in d['hosts']['hosts'] if h['name'] == 'host3')")
assert_ge "$((drops3 - before3))" 1 "host 3's tagged frame counted (tx_vlan)"
drops4=$(ctl_json "$T/ioc.sock" hosts "next(h.get('drops', {}).get('tx_vlan', 0) for h in d['hosts']['hosts'] if h['name'] == 'host4')")
assert_ge "$drops4" 1 "host 4's VLAN 20 frame counted (tx_vlan)"
log "to the LAN: host 1 tagged 10, host 2 tagged 20; host 1 <-> trunk host 4 on VLAN 10; host 3's and host 4's foreign tags dropped ($drops3, $drops4)"

# Round 2: the LAN to the hosts: unicast and broadcast on VLANs 10 and 20 and untagged.
listen
send sd-lan lan1 \
    "$(mkframe "${MAC[1]}" "$lan" 11 8100:a00a)" "$(mkframe "${MAC[1]}" "$lan" 12 8100:0014)" \
    "$(mkframe "${MAC[1]}" "$lan" 13)" "$(mkframe "${MAC[2]}" "$lan" 14 8100:0014)" \
    "$(mkframe "$BCAST" "$lan" 15 8100:000a)" "$(mkframe "$BCAST" "$lan" 16 8100:0014)" \
    "$(mkframe "$BCAST" "$lan" 17)"
collect
arrived 1 "$(mkframe "${MAC[1]}" "$lan" 11)" "the LAN's VLAN 10 frame at host 1, untagged"
none 1 12 "the LAN's VLAN 20 frame for host 1's MAC"
none 1 13 "the LAN's untagged frame for host 1's MAC"
arrived 2 "$(mkframe "${MAC[2]}" "$lan" 14)" "the LAN's VLAN 20 frame at host 2, untagged"
arrived 1 "$(mkframe "$BCAST" "$lan" 15)" "VLAN 10's broadcast at host 1, untagged"
arrived 4 "$(mkframe "$BCAST" "$lan" 15 8100:000a)" "VLAN 10's broadcast at trunk host 4, tagged"
arrived 2 "$(mkframe "$BCAST" "$lan" 16)" "VLAN 20's broadcast at host 2, untagged"
arrived 3 "$(mkframe "$BCAST" "$lan" 17)" "the untagged broadcast at host 3"
for n in 16 17; do none 1 "$n" "broadcast $n at host 1 (VLAN 10)"; done
for n in 15 17; do none 2 "$n" "broadcast $n at host 2 (VLAN 20)"; done
for n in 15 16; do none 3 "$n" "broadcast $n at untagged host 3"; done
for n in 16 17; do none 4 "$n" "broadcast $n at trunk host 4 (VLAN 10 only)"; done
log "from the LAN: each host got its VLAN's unicast and broadcasts only, as its mode says"
ping_ok sd-host3 10.50.0.2

# Host 1 again over shared memory: its VLAN's frames for it are read from a socket of its
# own straight into its pools (the filter matches VLAN 10; the kernel hands them over
# untagged), large enough to be RDMA writes rather than inline.
stop_host 1 TERM; stop_ioc TERM
sock=$T/run/fabric.sock
sed "s|^listen = .*|&\nlisten_local = \"$sock\"|" "$IOC_CONF" >"$T/ioc-shm.toml"
sed "s|^ioc = .*|ioc = \"unix:$sock\"|" "$HOST_CONF" >"$T/host-shm.toml"
IOC_CONF=$T/ioc-shm.toml start_ioc; HOST_CONF=$T/host-shm.toml start_host 1
wait_carrier sd-host up 10
# big N [TPID:TCI]: a 1,200-byte frame for host 1 naming N, with the tag if given.
big() {
    local f t=${2:-}
    f=$(mkframe "${MAC[1]}" "$lan" "$1")
    while [ ${#f} -lt $((2 * 1200)) ]; do f+=00; done
    echo "${f:0:24}${t//:/}${f:24}"
}
placed() { ctl_json "$T/ioc.sock" hosts "next(h['in_place'] for h in d['hosts']['hosts'] if h['name'] == 'host1')"; }
listen
send sd-lan lan1 "$(big 21 8100:000a)" "$(big 22 8100:000a)" "$(big 23 8100:0014)" "$(big 24)"
collect
arrived 1 "$(big 21)" "a large VLAN 10 frame at host 1 over shared memory, untagged"
arrived 1 "$(big 22)" "the second one"
none 1 23 "a large VLAN 20 frame at host 1 over shared memory"
none 1 24 "a large untagged frame at host 1 over shared memory"
assert_ge "$(placed)" 2 "frames written straight into host 1's pools from its own socket"
log "over shared memory: VLAN 10's frames from host 1's own socket, untagged ($(placed) in place)"
pass "vHubs: access, trunk and untagged hosts each on their VLANs, on the LAN and between hosts"
