#!/usr/bin/env bash
# VLAN-tagged frames cross the split NIC with their tags, both ways, for a trunk host whose
# entry lists their VLANs: 802.1Q (TPID 0x8100), QinQ (outer 0x88a8, inner 0x8100), a
# priority tag (VID 0), unicast, broadcast and multicast. This kernel has no VLAN devices, so the frames are raw (tests/rawframes.py):
# the receiver puts back the tag its kernel moved into PACKET_AUXDATA, and every frame must
# arrive exactly as it was sent, once. LAN to host is the case the IOC must repair (its
# AF_PACKET socket sees the tag beside the frame, not in it). Then again with the host over
# shared memory, where the host's unicast frames come from sockets of its own.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss python3; need_daemons
RAW="python3 $ROOT/tests/rawframes.py"

# mkframe DST SRC N [TPID:TCI]...: a 64-byte test frame in hex: the MACs, the tags in order,
# ethertype 0x88b5 (local experimental) and a payload naming frame N.
mkframe() {
    local dst=${1//:/} src=${2//:/} n=$3 hex t
    shift 3
    hex="$dst$src"
    for t in "$@"; do hex+="${t%%:*}${t##*:}"; done
    hex+="88b5$(printf 'splitnet-vlan-test-%02d' "$n" | od -An -tx1 | tr -d ' \n')"
    while [ ${#hex} -lt 128 ]; do hex+=00; done
    echo "$hex"
}

# crossing NAME FROM_NS FROM_DEV TO_NS TO_DEV FRAME...: sends the frames on FROM_DEV and
# checks each arrives on TO_DEV byte for byte, exactly once.
crossing() {
    local name=$1 fns=$2 fdev=$3 tns=$4 tdev=$5 f got
    shift 5
    : >"$T/$name.ready"
    ip netns exec "$tns" $RAW recv "$tdev" "$T/$name.got" 3 >"$T/$name.ready" 2>&1 &
    PIDS+=($!)
    local rx=$!
    for _ in $(seq 50); do grep -q ready "$T/$name.ready" && break; sleep 0.1; done
    grep -q ready "$T/$name.ready" || fail "$name: receiver on $tdev did not start: $(cat "$T/$name.ready")"
    ip netns exec "$fns" $RAW send "$fdev" "$@" || fail "$name: cannot send on $fdev"
    wait "$rx" || fail "$name: receiver failed: $(cat "$T/$name.ready")"
    for f in "$@"; do
        got=$(grep -c -x "$f" "$T/$name.got")
        [ "$got" = 1 ] || fail "$name: frame ${f:0:28}..${f:28:24} arrived $got times; got: $(cut -c1-60 "$T/$name.got" | tr '\n' ' ')"
    done
    log "$name: $# frames arrived intact, tags and TPIDs included"
}

# groups_agreed: the IOC holds as many multicast groups for the host as sd0 has joined.
groups_agreed() {
    [ "$(ctl_json "$T/ioc.sock" hosts "d['hosts']['hosts'][0]['multicast']")" = \
        "$(ip -n sd-host maddr show dev sd0 | grep -c '^[[:space:]]*link ')" ]
}

# both_ways: the frames of every kind, LAN to host and host to LAN. The host joins the
# multicast group first, as a receiving application would: the IOC hands a host only the
# multicast frames of the groups it joined.
both_ways() {
    local host lan bcast=ff:ff:ff:ff:ff:ff mcast=01:00:5e:00:00:fb
    ip -n sd-host maddr show dev sd0 | grep -q "link  $mcast" || run ip -n sd-host maddr add "$mcast" dev sd0
    eventually 5 groups_agreed || fail "the IOC did not take sd0's multicast groups"
    host=$(link_mac sd-host sd0); lan=$(link_mac sd-lan lan1)
    crossing lan-to-host sd-lan lan1 sd-host sd0 \
        "$(mkframe "$host" "$lan" 1 8100:0064)" \
        "$(mkframe "$host" "$lan" 2 88a8:20c8 8100:012c)" \
        "$(mkframe "$bcast" "$lan" 3 8100:e00a)" \
        "$(mkframe "$mcast" "$lan" 4 88a8:0190 8100:0005)" \
        "$(mkframe "$host" "$lan" 5 8100:6000)" \
        "$(mkframe "$bcast" "$lan" 6 88a8:0ffe)" \
        "$(mkframe "$host" "$lan" 7)"
    crossing host-to-lan sd-host sd0 sd-lan lan1 \
        "$(mkframe "$lan" "$host" 11 8100:0064)" \
        "$(mkframe "$lan" "$host" 12 88a8:20c8 8100:012c)" \
        "$(mkframe "$bcast" "$host" 13 8100:e00a)" \
        "$(mkframe "$mcast" "$host" 14 88a8:0190 8100:0005)" \
        "$(mkframe "$lan" "$host" 15 8100:6000)" \
        "$(mkframe "$lan" "$host" 16)"
    # Untagged traffic is unaffected.
    ping_ok sd-lan 10.50.0.1
}

# Host 1 is a trunk of the VLANs below, and takes untagged frames (0); 802.1Q classifies a
# priority tag (VLAN 0) as untagged ([[auth.hosts]] vlans; README, "VLANs").
python3 - "$IOC_CONF" "$T/ioc-trunk.toml" <<'PY' || fail "cannot write host 1's VLANs"
import re, sys
t = open(sys.argv[1]).read()
t = re.sub(r'^name = "host1"$', 'name = "host1"\nvlans = [0, 10, 100, 200, 400, 4094]', t, count=1, flags=re.M)
open(sys.argv[2], "w").write(t)
PY
grep -q '^vlans = \[0, 10' "$T/ioc-trunk.toml" || fail "no vlans for host1 in $T/ioc-trunk.toml"
IOC_CONF=$T/ioc-trunk.toml
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
both_ways
# Again with the host over shared memory: the IOC reads its unicast frames of its VLANs
# from packet sockets of the host's own, one for untagged frames and one for tagged ones,
# which it reads around a gap where the tag the kernel took out goes back.
stop_host 1 TERM; stop_ioc TERM
sock=$T/run/fabric.sock
sed "s|^listen = .*|&\nlisten_local = \"$sock\"|" "$IOC_CONF" >"$T/ioc.toml"
sed "s|^ioc = .*|ioc = \"unix:$sock\"|" "$HOST_CONF" >"$T/host-shm.toml"
IOC_CONF=$T/ioc.toml start_ioc; HOST_CONF=$T/host-shm.toml start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
# Large pings (small frames go inline): their echo requests are written straight into the
# host's pools from its own socket, which is open.
run ip netns exec sd-lan ping -q -c 2 -i 0.2 -s 1000 -W 1 10.50.0.1
placed() { ctl_json "$T/ioc.sock" hosts "d['hosts']['hosts'][0]['in_place']"; }
assert_positive "$(placed)" "frames written into the host's pools from its own socket"
both_ways
# Large frames of the host's VLANs (beyond what goes inline) come from its own sockets too,
# written into its pools with their tags back in place, the untagged one beside them.
before=$(placed)
host=$(link_mac sd-host sd0); lan=$(link_mac sd-lan lan1)
big() { local f; f=$(mkframe "$@"); while [ ${#f} -lt 2400 ]; do f+=00; done; echo "$f"; }
crossing large-lan-to-host sd-lan lan1 sd-host sd0 \
    "$(big "$host" "$lan" 21 8100:0064)" \
    "$(big "$host" "$lan" 22 88a8:20c8 8100:012c)" \
    "$(big "$host" "$lan" 23 8100:affe)" \
    "$(big "$host" "$lan" 24)"
assert_ge "$(placed)" $((before + 4)) "large frames written into the host's pools from its own sockets"
log "large tagged frames over shared memory: $(( $(placed) - before )) written in place"
pass "802.1Q, QinQ and priority-tagged frames, unicast and group, cross both ways intact, over TCP and over shared memory (a trunk host's own queue keeping the tags)"
