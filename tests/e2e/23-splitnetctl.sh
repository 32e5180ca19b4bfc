#!/usr/bin/env bash
# splitnetctl against two hosts and their IOC: status, pools, hosts, stats and top, as text
# and --json, agree with what the kernel shows; the control socket answers root only; and
# multicast groups joined on sd0 (ip maddr, IPv6 solicited-node groups) reach the IOC's NIC
# filter, leaving it only when no host wants them any more.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping python3 setpriv; need_daemons
CTL=$BIN/splitnetctl
topo_up 2; start_ioc; start_host 1; start_host 2
wait_carrier sd-host up 10
wait_carrier sd-host2 up 10
ping_ok sd-host 10.50.0.2
ping_ok sd-host2 10.50.0.2

# json SOCKET COMMAND PYTHON-EXPRESSION: evaluates the expression on the reply (as `d`).
json() { ctl_json "$@"; }

# --- status ------------------------------------------------------------------------------
out=$("$CTL" -s "$T/host1.sock" status) || fail "splitnetctl status (host): $out"
echo "$out" | sed 's/^/    /'
assert_match "$out" "fabric: +up 10\.200\.0\.2:7400, protocol v1" "host status line"
assert_match "$out" "interface: +sd0 $(link_mac sd-host sd0) mtu 1500 carrier up" "host interface line"
assert_eq "$(json "$T/host1.sock" status "d['status']['fabric']['state']")" up "host fabric state"
assert_eq "$(json "$T/host1.sock" status "'vnet_hdr' in d['status']['interface']['offloads']")" True "offloads"
assert_eq "$(json "$T/ioc.sock" status "d['status']['fabric']['hosts']")" 2 "IOC hosts connected"
assert_eq "$(json "$T/ioc.sock" status "d['status']['interface']['name']")" lan0 "IOC NIC"

# --- hosts: one line per host, MACs as the hosts see them ----------------------------------
out=$("$CTL" -s "$T/ioc.sock" hosts) || fail "splitnetctl hosts: $out"
echo "$out" | sed 's/^/    /'
for k in 1 2; do
    mac=$(link_mac "$(host_ns "$k")" sd0)
    echo "$out" | grep -q " $mac " || fail "host $k's MAC $mac not in splitnetctl hosts"
    assert_eq "$(json "$T/ioc.sock" hosts "[h['address'].split(':')[0] for h in d['hosts']['hosts'] if h['mac'] == '$mac'][0]")" \
        "$(host_fab_ip "$k")" "host $k's fabric address"
done
assert_eq "$(json "$T/ioc.sock" hosts "len({h['domain'] for h in d['hosts']['hosts']})")" 2 "one protection domain per host"
"$CTL" -s "$T/host1.sock" hosts >/dev/null 2>&1 && fail "a host driver answered 'hosts'"

# --- pools: every element of every pool is accounted for ------------------------------------
for s in host1 ioc; do
    check=$(json "$T/$s.sock" pools "all(p['credits_outstanding'] + p['busy'] + p['free'] == p['element_count'] for x in d['pools']['peers'] for p in x['local']) and all(0 <= r['credits'] <= r['element_count'] for x in d['pools']['peers'] for r in x['remote']) and len(d['pools']['peers']) > 0 and all(x['local'] and x['remote'] for x in d['pools']['peers'])")
    assert_eq "$check" True "$s: pool accounting"
done
assert_eq "$(json "$T/ioc.sock" pools "len(d['pools']['peers'])")" 2 "IOC pools: one entry per host"
"$CTL" -s "$T/host1.sock" pools | sed 's/^/    /'

# --- stats: counters move with traffic; the NIC's and the IOC's view are there ----------
before=$(json "$T/host1.sock" stats "d['stats']['fabric']['tx']['frames']")
ip netns exec sd-host ping -c 20 -i 0.01 -W 1 10.50.0.2 >/dev/null || fail "ping burst"
after=$(json "$T/host1.sock" stats "d['stats']['fabric']['tx']['frames']")
assert_ge "$after" $((before + 20)) "host tx frames after 20 pings"
ioc_rx_at_least() {
    [ "$(json "$T/host1.sock" stats "(d['stats']['ioc'] or {}).get('rx', {}).get('frames', 0)")" -ge "$1" ]
}
eventually 3 ioc_rx_at_least 20 ||
    fail "the IOC's counters for host 1 (GetStats) did not reach splitnetctl"
nic_tx=$(json "$T/ioc.sock" stats "d['stats']['nic']['tx']['frames']")
kernel_tx=$(ip netns exec sd-ioc cat /sys/class/net/lan0/statistics/tx_packets)
assert_ge "$kernel_tx" "$nic_tx" "NIC tx frames (kernel counts at least what splitnetctl saw)"
assert_ge "$nic_tx" 40 "NIC tx frames"
"$CTL" -s "$T/ioc.sock" stats | sed 's/^/    /'

# --- top: two samples, rates from the second ---------------------------------------------
lines=$("$CTL" -s "$T/ioc.sock" --json top -n 2 -i 0.3) || fail "splitnetctl top: $lines"
assert_eq "$(echo "$lines" | wc -l)" 2 "top -n 2 samples"
assert_eq "$(echo "$lines" | tail -n 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tx_bits_per_s"] is not None)')" True "top rate"
screen=$("$CTL" -s "$T/host1.sock" top -n 2 -i 0.2) || fail "splitnetctl top (text)"
echo "$screen" | grep -q "rx pool" || fail "top shows no pool occupancy: $screen"

# --- help and man page stand on their own: every command is described in both ----------
help=$("$CTL" --help) || fail "splitnetctl --help"
for c in status pools hosts stats top --json --socket --daemon; do
    echo "$help" | grep -q -- "$c" || fail "splitnetctl --help does not describe $c"
    grep -q -- "$(echo "$c" | sed 's/-/\\\\-/g')" "$ROOT/docs/man/splitnetctl.1" || fail "splitnetctl.1 does not describe $c"
done

# --- errors: clear messages and exit codes -------------------------------------------------
out=$("$CTL" -s "$T/none.sock" status 2>&1); rc=$?
assert_eq "$rc" 1 "exit status without a daemon"
assert_match "$out" "cannot connect to .*none.sock" "message without a daemon"
"$CTL" -s "$T/host1.sock" bogus >/dev/null 2>&1; assert_eq "$?" 2 "exit status of a usage error"
# Root only: the socket is 0600; with the mode opened up, the daemon still refuses others.
chmod 755 "$T"
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$CTL" -s "$T/host1.sock" status 2>&1) &&
    fail "an unprivileged user read the control socket: $out"
assert_match "$out" "Permission denied" "unprivileged client, mode 0600"
chmod 666 "$T/host1.sock"
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$CTL" -s "$T/host1.sock" status 2>&1) &&
    fail "the daemon answered an unprivileged user: $out"
assert_match "$out" "permission denied: the control socket is root only" "unprivileged client, mode 0666"
chmod 600 "$T/host1.sock"; chmod 700 "$T"

# --- multicast: sd0's groups reach the NIC filter, as a union over hosts --------------------
nic_has() { ip -n sd-ioc maddr show dev lan0 | grep -q "link  *$1"; }
# IPv6 on sd0 joined fd50::1's solicited-node group by itself.
eventually 3 nic_has 33:33:ff:00:00:01 || fail "solicited-node group of fd50::1 not on the NIC: $(ip -n sd-ioc maddr show dev lan0)"
G=01:00:5e:01:02:03
nic_has $G && fail "$G on the NIC before any host joined it"
run ip -n sd-host maddr add $G dev sd0
eventually 3 nic_has $G || fail "group $G joined on host 1's sd0 is not on the NIC"
run ip -n sd-host2 maddr add $G dev sd0
run ip -n sd-host maddr del $G dev sd0
sleep 1
nic_has $G || fail "group $G left the NIC while host 2 still wants it"
run ip -n sd-host2 maddr del $G dev sd0
eventually 3 sh -c "! ip -n sd-ioc maddr show dev lan0 | grep -q 'link  *$G'" ||
    fail "group $G stayed on the NIC after both hosts left it"
run ip -n sd-host2 maddr add 01:00:5e:0a:0b:0c dev sd0
eventually 3 nic_has 01:00:5e:0a:0b:0c || fail "host 2's group not on the NIC"
stop_host 2
eventually 3 sh -c "! ip -n sd-ioc maddr show dev lan0 | grep -q 'link  *01:00:5e:0a:0b:0c'" ||
    fail "a stopped host's group stayed on the NIC"
assert_grep "$T/host1.log" "multicast groups changed on sd0" "host 1 logs its multicast changes"
pass "splitnetctl reports what the kernel shows; multicast joins reach the NIC"
