#!/usr/bin/env bash
# shellcheck disable=SC2034  # STOP_RC, WAITED_MS, ...: read by the tests that source this file
# Shared helpers of the end-to-end tests: the reference topology of ../shared/DESIGN.md in
# network namespaces, the two daemons, and assertions that say what failed.
#
# Every test sources this file, builds its own topology and removes it on exit (EXIT trap: also
# on failure, on SIGTERM from `timeout`, on Ctrl-C). Traffic only ever goes to addresses inside
# these namespaces. A missing tool or missing root is a failure that names what is missing,
# never a silent skip.
#
#   namespace   interface                     address
#   sd-host     fab0 (veth, peer fab1)        10.200.0.1/24
#   sd-host     sd0 (TAP of host-driver)      10.50.0.1/24, fd50::1/64
#   sd-ioc      fab1                          10.200.0.2/24 (1 host) or fabbr bridge (N > 1)
#   sd-ioc      lan0 (veth, peer lan1)        none: ioc-driver owns it (AF_PACKET)
#   sd-lan      lan1                          10.50.0.2/24, fd50::2/64
#   sd-hostK    fab0 (peer fab(2K-1))         10.200.0.(10+K)/24, sd0 10.50.0.(K+1)/24, fd50::(K+1)/64
#
# Keys are set up as an operator sets them up (README, "Admitting a host"): an IOC key and one
# key per host K in $T, and IOC_CONF / HOST_CONF become copies in $T that admit those hosts
# and name the IOC's key (keys_up); each host K gets its own key as the credential
# splitnet.key, as systemd's LoadCredential= gives it (start_host).
#
# Environment: SPLITNET_BIN (where the daemons are; default $CARGO_TARGET_DIR/release or target/release), HOST_CONF and
# IOC_CONF (default systemd/host.toml and systemd/ioc.toml, with the keys added), KEEP_LOGS=1 (keep
# the daemons' logs directory after the test), VERBOSE=1 (print every set-up command).
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SPLITNET_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
HOST_CONF=${HOST_CONF:-$ROOT/systemd/host.toml}
IOC_CONF=${IOC_CONF:-$ROOT/systemd/ioc.toml}
MAX_HOSTS=8
T=$(mktemp -d /tmp/splitnet-test.XXXXXX)
PIDS=()      # every background process a test starts (killed on exit)
NETNS=()     # every namespace this test created (deleted on exit)
IOC_PID=
STOP_RC=
WAITED_MS=
declare -A HOST_PID

# ---------------------------------------------------------------------------------------------
# Keys

# keys_up: makes the IOC's key ($T/keys/ioc.key, its public key in IOC_PUB) and host K's key
# for K = 1..MAX_HOSTS ($T/cred/hostK/splitnet.key, public key HOST_PUB[K]) with splitnetctl
# genkey / pubkey; IOC_CONF becomes a copy that reads the IOC's key file and admits every host
# key ([[auth.hosts]] named hostK, appended, allowed promiscuous mode, which some tests use,
# and one queue: a test of more sets its entries' queues),
# HOST_CONF a copy that names the IOC's public key.
# Does nothing when splitnetctl is not built (need_daemons then fails the test; the demo
# builds first, then calls it) or the keys are made already.
declare -A HOST_PUB
keys_up() {
    local k ctl=$BIN/splitnetctl
    [ -x "$ctl" ] && [ -z "${IOC_PUB:-}" ] || return 0
    mkdir -p "$T/keys" && chmod 700 "$T/keys"
    (umask 077 && "$ctl" genkey >"$T/keys/ioc.key") || fail "splitnetctl genkey failed"
    IOC_PUB=$("$ctl" pubkey <"$T/keys/ioc.key") || fail "splitnetctl pubkey failed"
    sed "s|^# private_key_file = .*|private_key_file = \"$T/keys/ioc.key\"|" "$IOC_CONF" >"$T/ioc-auth.toml"
    grep -q "^private_key_file = \"$T/keys/ioc.key\"" "$T/ioc-auth.toml" ||
        fail "no '# private_key_file =' line in $IOC_CONF to name the IOC's key"
    for k in $(seq "$MAX_HOSTS"); do
        mkdir -p "$T/cred/host$k"
        (umask 077 && "$ctl" genkey >"$T/cred/host$k/splitnet.key") || fail "splitnetctl genkey failed"
        HOST_PUB[$k]=$("$ctl" pubkey <"$T/cred/host$k/splitnet.key")
        printf '\n[[auth.hosts]]\nname = "host%s"\npublic_key = "%s"\npromiscuous = true\nqueues = 1\n' "$k" "${HOST_PUB[$k]}" >>"$T/ioc-auth.toml"
    done
    sed "s|^# ioc_public_key = .*|ioc_public_key = \"$IOC_PUB\"|" "$HOST_CONF" >"$T/host-auth.toml"
    grep -q '^ioc_public_key = ' "$T/host-auth.toml" ||
        fail "no '# ioc_public_key =' line in $HOST_CONF to name the IOC's key"
    IOC_CONF=$T/ioc-auth.toml
    HOST_CONF=$T/host-auth.toml
}

# open_admission: IOC_CONF becomes a copy with auth.admission = "open" (the lab setting), for
# the tests whose hostile peers speak the unauthenticated handshake of an admitted host.
open_admission() {
    sed 's/^admission = "keys"/admission = "open"/' "$IOC_CONF" >"$T/ioc-open.toml"
    grep -q '^admission = "open"' "$T/ioc-open.toml" || fail "no admission line in $IOC_CONF"
    IOC_CONF=$T/ioc-open.toml
}

# ---------------------------------------------------------------------------------------------
# Reporting

log() { printf '  %s\n' "$*"; }
pass() { printf 'PASS: %s\n' "$*"; }

# fail MESSAGE: prints the message and the tail of every daemon log, exits 1 (cleanup runs).
fail() {
    local f
    printf 'FAIL: %s\n' "$*" >&2
    for f in "$T"/*.log; do
        [ -s "$f" ] || continue
        echo "--- $(basename "$f") (last 15 lines)" >&2
        tail -n 15 "$f" >&2
    done
    exit 1
}

# ---------------------------------------------------------------------------------------------
# Preconditions: fail, naming what is missing.

need_root() {
    [ "$(id -u)" = 0 ] || fail "needs root (network namespaces, TAP, AF_PACKET): run it with sudo"
}

# need_tool TOOL...: every tool must be on PATH; the message names all the missing ones and
# the Debian package that has each.
need_tool() {
    local t missing=()
    for t in "$@"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t$(pkg_hint "$t")"); done
    [ ${#missing[@]} -eq 0 ] || fail "missing tool(s): ${missing[*]} (.ci/run installs them all)"
}

pkg_hint() {
    case $1 in
        ip | ss | bridge) echo " (apt install iproute2)" ;;
        ping) echo " (apt install iputils-ping)" ;;
        iperf3) echo " (apt install iperf3)" ;;
        dnsmasq) echo " (apt install dnsmasq-base)" ;;
        dhclient) echo " (apt install isc-dhcp-client)" ;;
        udhcpc) echo " (apt install udhcpc)" ;;
        python3) echo " (apt install python3)" ;;
        ethtool) echo " (apt install ethtool)" ;;
        pgrep | pkill) echo " (apt install procps)" ;;
        systemd-analyze) echo " (apt install systemd)" ;;
        tshark | dumpcap) echo " (apt install tshark)" ;;
        setpriv | nsenter | findmnt) echo " (apt install util-linux)" ;;
        mmdebstrap) echo " (apt install mmdebstrap)" ;;
        systemd-nspawn) echo " (apt install systemd-container)" ;;
        dpkg-deb) echo " (apt install dpkg)" ;;
        *) ;;
    esac
}

# need_daemons: both daemons and splitnetctl built (tests never build; tests/run-all.sh does).
need_daemons() {
    local d
    for d in host-driver ioc-driver splitnetctl; do
        [ -x "$BIN/$d" ] || fail "not built: $BIN/$d (run cargo build --release)"
    done
}

# need_tools TOOL...: the tools and both daemons (what most tests need).
need_tools() { need_tool "$@"; need_daemons; }

# need_rogue: the hostile peer of the rogue tests (an example, built with --examples) in ROGUE.
need_rogue() {
    ROGUE=$BIN/examples/rogue
    [ -x "$ROGUE" ] || fail "missing $ROGUE (cargo build --release --examples)"
}

# ---------------------------------------------------------------------------------------------
# Cleanup: processes first, then the namespaces (a persistent sd0 goes with its namespace).

stop_processes() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    PIDS=()
    IOC_PID=
    HOST_PID=()
}

# topo_down: kills everything running in this test's namespaces and deletes them; fails if one
# cannot be removed.
topo_down() {
    local n left=()
    stop_processes
    for n in "${NETNS[@]}"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$n" 2>/dev/null
        rm -rf "/etc/netns/$n"
        [ -e "/run/netns/$n" ] && left+=("$n")
    done
    NETNS=()
    [ ${#left[@]} -eq 0 ] || { echo "FAIL: namespaces left behind: ${left[*]}" >&2; return 1; }
}

cleanup() {
    local rc=$?
    # `timeout` signals the whole process group again while this runs: finish the cleanup.
    trap '' TERM INT
    topo_down || rc=1
    if [ -s "$T/broken-checks" ]; then
        echo "FAIL: a check's query of a daemon failed on its answer (ctl_json):" >&2
        cat "$T/broken-checks" >&2
        rc=1
    fi
    if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs kept in $T" >&2; else rm -rf "$T"; fi
    exit "$rc"
}
trap cleanup EXIT
# One run at a time (tests/e2e-lock.sh); without root, the test's need_root says so.
. "$ROOT/tests/e2e-lock.sh"
if [ "$(id -u)" = 0 ]; then e2e_lock || exit 1; fi

# ---------------------------------------------------------------------------------------------
# The reference topology

# host_ns K: namespace of host K (1 is sd-host, K > 1 is sd-hostK).
host_ns() { if [ "$1" = 1 ]; then echo sd-host; else echo "sd-host$1"; fi; }
# host_fab_ip K: host K's fabric address (10.200.0.1 for host 1, 10.200.0.(10+K) otherwise).
host_fab_ip() { if [ "$1" = 1 ]; then echo 10.200.0.1; else echo "10.200.0.$((10 + $1))"; fi; }
# host_ip K / host_ip6 K: sd0's addresses (.1 for host 1, .(K+1) otherwise; .2 is the LAN peer).
host_ip() { if [ "$1" = 1 ]; then echo 10.50.0.1; else echo "10.50.0.$(($1 + 1))"; fi; }
host_ip6() { if [ "$1" = 1 ]; then echo fd50::1; else echo "fd50::$(($1 + 1))"; fi; }

ALL_NS=(sd-host sd-ioc sd-lan)
for _k in $(seq 2 "$MAX_HOSTS"); do ALL_NS+=("sd-host$_k"); done

# run CMD...: runs a set-up command; on error fails with the command and what it printed.
# VERBOSE=1 prints each command first (the demo does).
run() {
    local out
    [ "${VERBOSE:-0}" = 1 ] && printf '   + %s\n' "$*"
    out=$("$@" 2>&1) || fail "set-up command failed: $* => ${out:-no output}"
}

addns() {
    run ip netns add "$1"
    NETNS+=("$1")
    run ip -n "$1" link set lo up
}

# topo_up N [LAN_MTU]: the reference topology with N hosts (1..8). One host: a veth pair
# between sd-host and sd-ioc, no bridge. N > 1: bridge fabbr in sd-ioc holds 10.200.0.2/24 and
# takes fab1, fab3, ... as ports. sd0 does not exist yet (host-driver creates it).
topo_up() {
    local n=${1:-1} mtu=${2:-1500} k ns port
    case $n in [1-8]) ;; *) fail "topo_up: $n hosts (1..$MAX_HOSTS)" ;; esac
    for ns in "${ALL_NS[@]}"; do
        [ -e "/run/netns/$ns" ] &&
            fail "namespace $ns already exists (another test running, or a killed one left it: ip netns del $ns)"
    done
    addns sd-ioc
    addns sd-lan
    run ip link add lan0 netns sd-ioc mtu "$mtu" type veth peer name lan1 netns sd-lan mtu "$mtu"
    run ip -n sd-lan addr add 10.50.0.2/24 dev lan1
    run ip -n sd-lan addr add fd50::2/64 dev lan1 nodad
    run ip -n sd-lan link set lan1 up
    if [ "$n" = 1 ]; then
        addns sd-host
        run ip link add fab0 netns sd-host type veth peer name fab1 netns sd-ioc
        run ip -n sd-host addr add 10.200.0.1/24 dev fab0
        run ip -n sd-host link set fab0 up
        run ip -n sd-ioc addr add 10.200.0.2/24 dev fab1
        run ip -n sd-ioc link set fab1 up
        return 0
    fi
    run ip -n sd-ioc link add fabbr type bridge
    run ip -n sd-ioc addr add 10.200.0.2/24 dev fabbr
    run ip -n sd-ioc link set fabbr up
    for k in $(seq 1 "$n"); do
        ns=$(host_ns "$k")
        port=fab$((2 * k - 1))
        addns "$ns"
        run ip link add fab0 netns "$ns" type veth peer name "$port" netns sd-ioc
        run ip -n "$ns" addr add "$(host_fab_ip "$k")/24" dev fab0
        run ip -n "$ns" link set fab0 up
        run ip -n sd-ioc link set "$port" master fabbr
        run ip -n sd-ioc link set "$port" up
    done
}

# ---------------------------------------------------------------------------------------------
# The daemons: in the background, logs in $T (ioc.log, hostK.log), pids tracked.

# start_ioc: ioc-driver in sd-ioc with IOC_CONF; waits until it listens on 10.200.0.2:7400.
# Sets IOC_PID.
start_ioc() {
    ip netns exec sd-ioc "$BIN/ioc-driver" --config "$IOC_CONF" --control-socket "$T/ioc.sock" \
        >>"$T/ioc.log" 2>&1 &
    IOC_PID=$!
    PIDS+=("$IOC_PID")
    for _ in $(seq 100); do
        ip netns exec sd-ioc ss -Hltn 'sport = :7400' 2>/dev/null | grep -q 7400 && return 0
        kill -0 "$IOC_PID" 2>/dev/null || fail "ioc-driver exited at start"
        sleep 0.05
    done
    fail "ioc-driver is not listening on 10.200.0.2:7400 after 5 s"
}

# stop_ioc [SIGNAL]: signals ioc-driver (default TERM) and waits for it; its exit status is
# left in STOP_RC.
stop_ioc() {
    kill -"${1:-TERM}" "$IOC_PID" 2>/dev/null
    wait "$IOC_PID" 2>/dev/null
    STOP_RC=$?
}

# start_host K: host-driver in host K's namespace with HOST_CONF (the same file for every
# host), waits for sd0, then configures it as the OS would: addresses (unless NO_ADDR=1 or sd0
# existed already: a persistent sd0 left by an earlier host-driver keeps its own) and link
# up. Sets HOST_PID[K].
start_host() {
    local k=$1 ns existed=0
    ns=$(host_ns "$k")
    ip -n "$ns" link show sd0 >/dev/null 2>&1 && existed=1
    CREDENTIALS_DIRECTORY=$T/cred/host$k ip netns exec "$ns" "$BIN/host-driver" --config "$HOST_CONF" \
        --control-socket "$T/host$k.sock" >>"$T/host$k.log" 2>&1 &
    HOST_PID[$k]=$!
    PIDS+=("${HOST_PID[$k]}")
    for _ in $(seq 100); do
        ip -n "$ns" link show sd0 >/dev/null 2>&1 && break
        kill -0 "${HOST_PID[$k]}" 2>/dev/null || fail "host-driver in $ns exited at start"
        sleep 0.05
    done
    ip -n "$ns" link show sd0 >/dev/null 2>&1 || fail "host-driver did not create sd0 in $ns within 5 s"
    [ "${NO_ADDR:-0}" = 1 ] || [ "$existed" = 1 ] || configure_sd0 "$k"
    run ip -n "$ns" link set sd0 up
}

# configure_sd0 K: sd0's IPv4 and IPv6 addresses of host K (no DAD: the test starts at once).
configure_sd0() {
    local ns
    ns=$(host_ns "$1")
    run ip -n "$ns" addr add "$(host_ip "$1")/24" dev sd0
    run ip -n "$ns" addr add "$(host_ip6 "$1")/64" dev sd0 nodad
}

# stop_host K [SIGNAL]: signals host K's driver (default TERM) and waits for it; its exit
# status is left in STOP_RC.
stop_host() {
    kill -"${2:-TERM}" "${HOST_PID[$1]}" 2>/dev/null
    wait "${HOST_PID[$1]}" 2>/dev/null
    STOP_RC=$?
}

# ---------------------------------------------------------------------------------------------
# Link state

# carrier NS: "up" when sd0 exists in NS and has LOWER_UP, else "down".
carrier() {
    if ip -n "$1" link show sd0 2>/dev/null | grep -q 'LOWER_UP'; then echo up; else echo down; fi
}

# wait_carrier NS [up|down] [SECONDS]: polls (20 ms) until sd0 in NS exists with LOWER_UP
# (up, the default) or shows NO-CARRIER / is gone (down); fails after SECONDS (default 10).
# How long it took is left in WAITED_MS. (Call it directly, not in $(...): a failure must end
# the test, not a subshell.)
wait_carrier() {
    local ns=$1 want=${2:-up} max=${3:-10} start now
    start=$(date +%s%N)
    while true; do
        now=$(date +%s%N)
        if [ "$(carrier "$ns")" = "$want" ]; then WAITED_MS=$(((now - start) / 1000000)); return 0; fi
        [ $(((now - start) / 1000000)) -ge $((max * 1000)) ] &&
            fail "sd0 in $ns not $want within ${max}s: $(ip -n "$ns" -br link show sd0 2>&1)"
        sleep 0.02
    done
}

# sd0_mtu NS / link_mac NS DEV
sd0_mtu() { ip -n "$1" link show sd0 2>/dev/null | grep -o 'mtu [0-9]*' | awk '{print $2}'; }
link_mac() { ip -n "$1" -br link show "$2" 2>/dev/null | awk '{print $3}'; }

# neigh NS ADDR DEV: "LLADDR STATE" of ADDR's neighbour entry ("none" when absent).
neigh() {
    local line
    line=$(ip -n "$1" neigh show "$2" dev "$3" 2>/dev/null | head -n 1)
    [ -n "$line" ] || { echo none; return; }
    echo "$line" | awk '{ for (i = 1; i < NF; i++) if ($i == "lladdr") mac = $(i + 1); print (mac ? mac : "-"), $NF }'
}

# ---------------------------------------------------------------------------------------------
# Traffic

# ping_ok NS ADDR [PING ARGS...]: 3 pings must all be answered.
ping_ok() {
    local ns=$1 addr=$2
    shift 2
    local out=$T/ping.$BASHPID.out
    ip netns exec "$ns" ping -q -c "${PING_COUNT:-3}" -i 0.2 -W 2 "$@" "$addr" >"$out" 2>&1 ||
        fail "ping $* $addr from $ns failed: $(tail -n 2 "$out" | tr '\n' ' ')"
}

# wait_listen NS PORT [tcp|udp]: until something listens on PORT in NS (5 s).
wait_listen() {
    local ns=$1 port=$2 opt=-Hltn
    [ "${3:-tcp}" = udp ] && opt=-Hlun
    for _ in $(seq 100); do
        ip netns exec "$ns" ss "$opt" "sport = :$port" 2>/dev/null | grep -q . && return 0
        sleep 0.05
    done
    fail "nothing listens on port $port in $ns"
}

# iperf NS SERVER_ADDR PORT [IPERF3 ARGS...]: iperf3 client in NS against a one-shot server
# in sd-lan (or SERVER_NS). The run must succeed; prints the received rate in Gb/s. The JSON
# result stays in $T/iperf.PORT.json. It prints, so it runs in $(...) or in the background:
# always follow it with `|| fail ...` (or `wait $! || fail ...`).
iperf() {
    local ns=$1 addr=$2 port=$3 sns=${SERVER_NS:-sd-lan}
    shift 3
    ip netns exec "$sns" timeout 60 iperf3 -s -1 -p "$port" >"$T/iperf-server.$port.out" 2>&1 &
    PIDS+=($!)
    wait_listen "$sns" "$port"
    timeout 60 ip netns exec "$ns" iperf3 -c "$addr" -p "$port" -J "$@" >"$T/iperf.$port.json" 2>&1 ||
        fail "iperf3 $* from $ns to $addr failed: $(grep -o '"error":.*' "$T/iperf.$port.json" || tail -n 3 "$T/iperf.$port.json")"
    python3 - "$T/iperf.$port.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d:
    sys.exit("iperf3 error: " + d["error"])
s = d["end"].get("sum_received") or d["end"]["sum"]
print("%.3f" % (s["bits_per_second"] / 1e9))
PY
}

# iperf_field PORT EXPR: a value from the last iperf3 JSON on PORT (EXPR is Python over `d`).
iperf_field() {
    python3 -c "import json; d = json.load(open('$T/iperf.$1.json')); print($2)"
}

# ping_fails NS ADDR [PING ARGS...]: none of 3 pings is answered.
ping_fails() {
    local ns=$1 addr=$2
    shift 2
    local out=$T/ping.$BASHPID.out
    if ip netns exec "$ns" ping -q -c 3 -i 0.2 -W 1 "$@" "$addr" >"$out" 2>&1; then
        fail "ping $* $addr from $ns was answered, which it must not be"
    fi
    grep -Eq ' 0 (packets )?received' "$out" ||
        fail "ping $* $addr from $ns: $(tail -n 2 "$out" | tr '\n' ' '), want none answered"
}

# ---------------------------------------------------------------------------------------------
# Open vSwitch of the test's own (userspace datapath: bridges need datapath_type=netdev)

# ovs_up NS DIR [tso]: ovsdb-server and ovs-vswitchd in NS on files in DIR (database
# DIR/db.sock, a bridge's OpenFlow socket DIR/BRIDGE.mgmt, logs DIR/*.log), never the
# machine's own; they go with NS (topo_down). `tso`: with userspace TSO (read at start; the
# datapath then takes offloaded frames, and keeps a veth's unfinished checksums as such).
# vsctl DIR ARGS... / ofctl DIR BRIDGE ARGS... talk to it.
ovs_up() {
    local ns=$1 d=$2 tso=${3:-}
    mkdir -p "$d"
    run ovsdb-tool create "$d/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    ip netns exec "$ns" env OVS_RUNDIR="$d" OVS_LOGDIR="$d" OVS_DBDIR="$d" ovsdb-server "$d/conf.db" \
        --remote=punix:"$d/db.sock" --pidfile="$d/ovsdb-server.pid" --unixctl="$d/ovsdb-server.ctl" \
        --log-file="$d/ovsdb-server.log" --detach >>"$d/start.log" 2>&1 || fail "ovsdb-server in $ns: $(tail -n 3 "$d/start.log")"
    run vsctl "$d" --no-wait init
    [ "$tso" = tso ] && run vsctl "$d" --no-wait set Open_vSwitch . other_config:userspace-tso-enable=true
    ip netns exec "$ns" env OVS_RUNDIR="$d" OVS_LOGDIR="$d" OVS_DBDIR="$d" ovs-vswitchd unix:"$d/db.sock" \
        --pidfile="$d/ovs-vswitchd.pid" --unixctl="$d/ovs-vswitchd.ctl" --log-file="$d/ovs-vswitchd.log" \
        --detach >>"$d/start.log" 2>&1 || fail "ovs-vswitchd in $ns: $(tail -n 3 "$d/start.log")"
}
vsctl() { local d=$1; shift; ovs-vsctl --timeout=10 --db=unix:"$d/db.sock" "$@"; }
ofctl() { local d=$1 br=$2; shift 2; ovs-ofctl "$1" unix:"$d/$br.mgmt" "${@:2}"; }

# ---------------------------------------------------------------------------------------------
# Assertions: each fails with what was expected and what was found.

# assert_eq ACTUAL EXPECTED WHAT
assert_eq() { [ "$1" = "$2" ] || fail "$3: got '$1', want '$2'"; }
# assert_ne ACTUAL UNWANTED WHAT
assert_ne() { [ "$1" != "$2" ] || fail "$3: got '$1', which it must not be"; }
# assert_match ACTUAL EXTENDED_REGEX WHAT
assert_match() { [[ $1 =~ $2 ]] || fail "$3: got '$1', want a match of /$2/"; }
# assert_ge ACTUAL MIN WHAT (integers)
assert_ge() {
    [[ $1 =~ ^-?[0-9]+$ ]] && [ "$1" -ge "$2" ] || fail "$3: got '$1', want >= $2"
}
# assert_le ACTUAL MAX WHAT (integers)
assert_le() {
    [[ $1 =~ ^-?[0-9]+$ ]] && [ "$1" -le "$2" ] || fail "$3: got '$1', want <= $2"
}
# assert_positive NUMBER WHAT (any decimal number > 0)
assert_positive() {
    awk -v v="$1" 'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 > 0) }' || fail "$2: got '$1', want > 0"
}
# assert_grep FILE ERE WHAT: a line of FILE matches.
assert_grep() { grep -Eq -- "$2" "$1" 2>/dev/null || fail "$3: no line matching /$2/ in $(basename "$1")"; }
# assert_no_grep FILE ERE WHAT: no line of FILE matches.
assert_no_grep() {
    local hit
    hit=$(grep -E -m1 -- "$2" "$1" 2>/dev/null) && fail "$3: $(basename "$1") has: $hit"
    return 0
}
# assert_alive PID WHAT
assert_alive() { kill -0 "$1" 2>/dev/null || fail "$2: process $1 is gone"; }

# eventually SECONDS CMD...: retries CMD every 0.1 s until it succeeds; false after SECONDS.
eventually() {
    local max=$1
    shift
    for _ in $(seq $((max * 10))); do "$@" && return 0; sleep 0.1; done
    "$@"
}

# start_ioc_kept [BINARY]: ioc-driver (or BINARY) under tests/fdstore.py, which stands in
# for systemd's descriptor store (pid in KEEPER, its events in $T/store/events); waits until
# it is ready.
start_ioc_kept() {
    mkdir -p "$T/store"; : >"$T/store/events"
    python3 "$ROOT/tests/fdstore.py" "$T/store" -- ip netns exec sd-ioc "${1:-$BIN/ioc-driver}" --config "$IOC_CONF" \
        --control-socket "$T/ioc.sock" >>"$T/ioc.log" 2>&1 &
    KEEPER=$!
    PIDS+=("$KEEPER")
    eventually 5 grep -q "^ready" "$T/store/events" || fail "ioc-driver under fdstore.py not ready: $(cat "$T/store/events")"
}

# across WHAT CMD...: runs CMD (a restart or an upgrade) while the LAN pings sd0 every 10 ms
# and the host sends a paced transfer to the LAN (ACROSS_S seconds, default 6); checks the
# transfer and the replies; sets GAP_MS.
across() {
    local what=$1 dups sent got
    shift
    rm -f "$T/recv.out"
    ip netns exec sd-lan python3 "$ROOT/tests/transfer.py" recv 5201 "$T/recv.out" &
    PIDS+=($!); local rx=$!
    wait_listen sd-lan 5201
    local secs=${ACROSS_S:-6}
    ip netns exec sd-host python3 "$ROOT/tests/transfer.py" send 10.50.0.2 5201 "$secs" $((secs * 8)) >"$T/sent.out" &
    PIDS+=($!); local tx=$!
    ip netns exec sd-lan ping -D -i 0.01 -w $((secs + 1)) -W 1 10.50.0.1 >"$T/ping.out" 2>&1 &
    PIDS+=($!); local pinger=$!
    sleep 2
    "$@"
    wait "$tx" || fail "$what: the transfer from the host failed: $(cat "$T/sent.out")"
    wait "$rx" || fail "$what: the LAN's receiver failed"
    wait "$pinger"
    sent=$(cat "$T/sent.out"); got=$(cat "$T/recv.out")
    assert_eq "$got" "$sent" "$what: bytes and SHA-256 received, against those sent"
    dups=$(grep -c 'DUP!' "$T/ping.out")
    assert_eq "$dups" 0 "$what: duplicated ping replies"
    GAP_MS=$(awk -F'[][]' '/bytes from/ { t = $2; if (p && t - p > g) g = t - p; p = t }
        END { printf "%d", g * 1000 }' "$T/ping.out")
    log "$what: transfer of ${sent%% *} bytes intact, no duplicate reply, longest gap between replies ${GAP_MS} ms"
}

# pcap_count FILE MAC: the frames of a pcapng capture (dumpcap's) addressed to MAC.
pcap_count() {
    python3 - "$1" "$2" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
mac = bytes.fromhex(sys.argv[2].replace(":", ""))
n, at = 0, 0
# pcapng: walk the blocks, count Enhanced Packet Blocks whose frame starts with MAC.
while at + 12 <= len(data):
    kind, size = struct.unpack_from("<II", data, at)
    if size < 12:
        break
    if kind == 6 and data[at + 28:at + 34] == mac:
        n += 1
    at += size
print(n)
PY
}

# ctl_json SOCKET COMMAND PYTHON-EXPRESSION: a daemon's splitnetctl answer (--json) to
# COMMAND, evaluated as `d` by the expression (e.g. "d['stats']['drops']"). Fails when the
# daemon does not answer (a test may wait for that). An expression that fails on an answer
# is a broken check, whose empty output could pass a comparison: it is recorded, and the
# test fails at its end (cleanup) even if nothing else did.
ctl_json() {
    local answer
    answer=$("$BIN/splitnetctl" -s "$1" --json "$2") || return 1
    python3 -c "import json, sys
d = json.load(sys.stdin)
try:
    print($3)
except Exception as e:
    with open(sys.argv[1], 'a') as f:
        f.write('%s: %r on the answer to %s\n' % (sys.argv[2], e, sys.argv[3]))
    raise" "$T/broken-checks" "$3" "$2" <<<"$answer"
}

# fds PID / rss_kib PID: open descriptors and resident memory of a process.
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
rss_kib() { awk '/VmRSS/{print $2}' "/proc/$1/status" 2>/dev/null; }

# Every test starts with the keys of an operator's set-up (IOC_CONF and HOST_CONF in $T).
keys_up
