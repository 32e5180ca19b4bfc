#!/usr/bin/env bash
# The mirror: a rogue IOC attacks host-driver. First an impostor, a real ioc-driver with a key
# of its own: it cannot prove the key the host expects, and sd0 never comes up. Then a rogue
# that the host does not authenticate (no auth.ioc_public_key: as a compromised IOC would be)
# attacks the protocol: host-driver refuses each attack (closes the connection, logs why),
# reconnects, and never crashes; frames with a bad virtio-net header, and SendData a pool of
# its could hold, it drops and counts.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip; need_daemons
need_rogue
topo_up 1

(umask 077 && "$BIN/splitnetctl" genkey >"$T/keys/impostor.key") || fail "splitnetctl genkey failed"
sed -e "s|^private_key_file = .*|private_key_file = \"$T/keys/impostor.key\"|" \
    -e 's/^admission = "keys"/admission = "open"/' "$IOC_CONF" >"$T/impostor.toml"
IOC_CONF=$T/impostor.toml start_ioc
start_host 1
sleep 2
[ "$(carrier sd-host)" = down ] || fail "sd0 came up with an IOC that did not prove the key the host expects"
assert_grep "$T/host1.log" 'refused the connection: Unauthenticated' "the host's log of the impostor"
assert_grep "$T/ioc.log" 'authentication failed' "the impostor's log"
log "impostor IOC: sd0 stays down; host: $(grep -m1 -o 'IOC [^ ]* unreachable: .*' "$T/host1.log")"
stop_host 1
stop_ioc

sed 's/^ioc_public_key = /# ioc_public_key = /' "$HOST_CONF" >"$T/host-plain.toml"
HOST_CONF=$T/host-plain.toml
ip netns exec sd-ioc "$ROGUE" ioc 10.200.0.2:7400 >"$T/rogue.out" 2>&1 & rogue=$!
PIDS+=("$rogue")
sleep 0.3
start_host 1
wait $rogue; rc=$?
sed 's/^/  rogue: /' "$T/rogue.out"
[ "$rc" = 0 ] || fail "some attack was not refused by host-driver"
kill -0 "${HOST_PID[1]}" || fail "host-driver died"
n=$(grep -c "fabric lost" "$T/host1.log")
[ "$n" -ge 4 ] || fail "host-driver logged $n lost connections, want 4"
[ "$(carrier sd-host)" = down ] || fail "sd0 has carrier without an IOC"
# The rogue's last session wrote 3 frames with a bad virtio-net header and sent one SendData
# of 1,500 bytes that a host pool could hold: dropped, each counted by cause, the session kept
# until the rogue left.
bad=$(ctl_json "$T/host1.sock" stats "d['stats'].get('drops', {}).get('rx_bad_header', 0)")
assert_eq "$bad" 3 "frames from the IOC with a bad virtio-net header, counted by the host"
inline=$(ctl_json "$T/host1.sock" stats "d['stats'].get('drops', {}).get('rx_refused_inline', 0)")
assert_eq "$inline" 1 "a SendData one of the host's pools could hold, refused and counted"
pass "rogue IOC refused; host-driver survives"
