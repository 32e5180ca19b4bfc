#!/usr/bin/env bash
# A host moves from TCP to shared memory and back by restarting host-driver with another
# configuration: sd0 stays (same ifindex, MAC and addresses), and a TCP connection through it,
# an iperf3 upload running all along, survives both moves.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip iperf3 python3 ss; need_daemons
sock=$T/run/fabric.sock
sed "s|^listen = .*|&\nlisten_local = \"$sock\"|" "$IOC_CONF" >"$T/ioc.toml"
sed "s|^ioc = .*|ioc = \"unix:$sock\"|" "$HOST_CONF" >"$T/host-shm.toml"
grep -q "^listen_local = \"$sock\"" "$T/ioc.toml" || fail "could not set listen_local"
IOC_CONF=$T/ioc.toml
json() { ctl_json "$T/ioc.sock" "$@"; }
# sd0's identity: ifindex, MAC and addresses.
sd0() {
    printf '%s|%s|%s\n' "$(ip -n sd-host -o link show sd0 | awk -F': ' '{print $1}')" \
        "$(link_mac sd-host sd0)" \
        "$(ip -n sd-host -o addr show dev sd0 scope global | awk '{print $4}' | sort | tr '\n' ' ')"
}
# transport: how the IOC sees its one host.
transport() { json hosts "d['hosts']['hosts'][0]['address'] if d['hosts']['hosts'] else ''"; }
came_back() { [ -n "$(transport)" ]; }
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
before=$(sd0)
log "sd0: $before; over $(transport)"
assert_match "$(transport)" "^10\.200\.0\.1:" "the first connection (TCP)"
iperf sd-host 10.50.0.2 5301 -t 12 >"$T/rate" & up=$!
sleep 3
for conf in "$T/host-shm.toml" "$HOST_CONF"; do
    stop_host 1 TERM
    assert_eq "$STOP_RC" 0 "host-driver's exit status"
    HOST_CONF=$conf start_host 1
    wait_carrier sd-host up 5
    eventually 5 came_back || fail "the host did not come back"
    log "over $(transport) after $((WAITED_MS)) ms"
    assert_eq "$(sd0)" "$before" "sd0 across the move"
    sleep 3
done
wait $up || fail "the iperf3 upload did not survive the moves"
assert_positive "$(cat "$T/rate")" "throughput of the upload across the moves"
log "upload across both moves: $(cat "$T/rate") Gb/s average"
assert_match "$(transport)" "^10\.200\.0\.1:" "back over TCP"
assert_grep "$T/ioc.log" "host connected peer=unix:$sock \(pid [0-9]+\), shared memory" "the move to shared memory"
pass "a host moves between TCP and shared memory keeping sd0 and its TCP connections"
