#!/usr/bin/env bash
# Both daemons run by hand (not under systemd), with the example configurations and no
# --control-socket: as root, each keeps only the capabilities it needs once set up; each
# makes its runtime directory (/run/host-driver, /run/ioc-driver: root, 0755) and socket
# (0600). Two host-drivers on one machine (sd0 and sd1, each with a key of its own) get sockets of
# their own (control.sock, control-sd1.sock) instead of fighting over one; splitnetctl finds
# each (options anywhere on the line), and with no daemon running says so with exit 1.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss python3; need_daemons
CTL=$BIN/splitnetctl
for d in /run/host-driver /run/ioc-driver; do
    if [ -e "$d" ]; then
        ls "$d"/*.sock >/dev/null 2>&1 && fail "$d has sockets: a daemon runs outside the test namespaces"
        rmdir "$d" || fail "cannot remove the empty $d"
    fi
done
# The daemons first, then their runtime directories (empty before the test), then the rest.
cleanup_by_hand() {
    local rc=$?
    stop_processes
    rm -rf /run/host-driver /run/ioc-driver
    (exit "$rc")
    cleanup
}
trap cleanup_by_hand EXIT

topo_up 1
# By hand there is no credential: host.toml names its key file, as an operator's would.
sed "s|^# private_key_file = .*|private_key_file = \"$T/cred/host1/splitnet.key\"|" "$HOST_CONF" >"$T/host-by-hand.toml"
grep -q '^private_key_file = ' "$T/host-by-hand.toml" || fail "no '# private_key_file =' line in $HOST_CONF"
HOST_CONF=$T/host-by-hand.toml
ip netns exec sd-ioc "$BIN/ioc-driver" --config "$IOC_CONF" >>"$T/ioc.log" 2>&1 &
IOC_PID=$!; PIDS+=("$IOC_PID")
ip netns exec sd-host "$BIN/host-driver" --config "$HOST_CONF" >>"$T/host1.log" 2>&1 &
HOST_PID[1]=$!; PIDS+=("${HOST_PID[1]}")
# sd1's driver is another host of the IOC: a key of its own (host 2's; README: each
# host-driver needs a key of its own).
sed -e 's/^name = "sd0"/name = "sd1"/' -e "s|/cred/host1/splitnet.key|/cred/host2/splitnet.key|" \
    "$HOST_CONF" >"$T/host-sd1.toml"
grep -q "/cred/host2/splitnet.key" "$T/host-sd1.toml" || fail "cannot give sd1's driver host 2's key"
ip netns exec sd-host "$BIN/host-driver" --config "$T/host-sd1.toml" >>"$T/host-sd1.log" 2>&1 &
sd1_pid=$!; PIDS+=("$sd1_pid")
for s in /run/ioc-driver/control.sock /run/host-driver/control.sock /run/host-driver/control-sd1.sock; do
    for _ in $(seq 50); do [ -S "$s" ] && break; sleep 0.1; done
    [ -S "$s" ] || fail "no socket $s"
done
assert_alive "$IOC_PID" "ioc-driver run by hand"
assert_alive "${HOST_PID[1]}" "host-driver of sd0 run by hand"
assert_alive "$sd1_pid" "host-driver of sd1 run by hand"
for d in /run/host-driver /run/ioc-driver; do
    assert_eq "$(stat -c '%U %a' "$d")" "root 755" "owner and mode of $d"
done
for s in /run/ioc-driver/control.sock /run/host-driver/control.sock /run/host-driver/control-sd1.sock; do
    assert_eq "$(stat -c '%a' "$s")" 600 "mode of $s"
done
configure_sd0 1; run ip -n sd-host link set sd0 up
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2

# Run as root by hand, each daemon keeps only the capabilities it needs, in every thread and
# every set: CAP_NET_ADMIN (bit 12) and, the IOC, CAP_NET_RAW (bit 13).
# caps PID SET: the set (CapEff, CapPrm, CapBnd, ...) of every thread of PID, one line each.
caps() { grep -h "^$2:" /proc/"$1"/task/*/status | awk '{print $2}' | sort -u; }
for set in CapEff CapPrm CapBnd; do
    assert_eq "$(caps "$IOC_PID" "$set")" 0000000000003000 "ioc-driver's $set (every thread)"
    assert_eq "$(caps "${HOST_PID[1]}" "$set")" 0000000000001000 "host-driver's $set (every thread)"
done
assert_eq "$(caps "$IOC_PID" CapInh)" 0000000000000000 "ioc-driver's inheritable set"
log "ioc-driver: $(ls /proc/"$IOC_PID"/task | wc -l) threads with CAP_NET_ADMIN and CAP_NET_RAW only; host-driver: CAP_NET_ADMIN only"
# What is left still does the work: an MTU change reaches the IOC and is taken.
run ip -n sd-host link set sd0 mtu 1400
ping_ok sd-host 10.50.0.2 -M "do" -s 1372
run ip -n sd-host link set sd0 mtu 1500

# splitnetctl: the options anywhere on the line; each daemon by name.
name() { python3 -c 'import json, sys; print(json.load(sys.stdin)["status"]["interface"]["name"])'; }
assert_eq "$("$CTL" status --json --interface sd1 | name)" sd1 "splitnetctl status --json --interface sd1"
assert_eq "$("$CTL" --json -d ioc status | name)" lan0 "splitnetctl --json -d ioc status"
assert_eq "$("$CTL" status -s /run/host-driver/control.sock --json | name)" sd0 "splitnetctl status -s ... --json"
out=$("$CTL" status --json 2>&1); rc=$?
assert_eq "$rc" 2 "exit status of splitnetctl status with three daemons and none chosen"
assert_match "$out" "choose with --daemon" "splitnetctl's hint"
kill -TERM "$sd1_pid" "$IOC_PID"; wait "$sd1_pid" "$IOC_PID"
assert_eq "$("$CTL" status --json | name)" sd0 "splitnetctl status --json, one daemon left"
kill -TERM "${HOST_PID[1]}"; wait "${HOST_PID[1]}"
out=$("$CTL" status --json 2>&1); rc=$?
assert_eq "$rc" 1 "exit status of splitnetctl status --json with no daemon running"
assert_match "$out" "no daemon socket found" "splitnetctl with no daemon"

# The same socket twice is refused, naming the option.
ip netns exec sd-host "$BIN/host-driver" --config "$HOST_CONF" >>"$T/host1.log" 2>&1 &
HOST_PID[1]=$!; PIDS+=("${HOST_PID[1]}")
for _ in $(seq 50); do [ -S /run/host-driver/control.sock ] && break; sleep 0.1; done
sed 's/^name = "sd0"/name = "sd2"/; s|^# socket = .*|socket = "/run/host-driver/control.sock"|' "$HOST_CONF" >"$T/host-clash.toml"
timeout 10 ip netns exec sd-host "$BIN/host-driver" --config "$T/host-clash.toml" >"$T/clash.log" 2>&1
assert_ne "$?" 0 "exit status of a second host-driver on the same socket"
assert_grep "$T/clash.log" "control.sock.*another daemon answers.*\[control\] socket.*--control-socket" "error naming the option"
assert_alive "${HOST_PID[1]}" "the first host-driver"
pass "daemons run by hand make their runtime directories; one socket per interface; splitnetctl options anywhere"
