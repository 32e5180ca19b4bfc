#!/usr/bin/env bash
# The demo: builds splitnet, brings up the reference topology (host, IOC and LAN namespaces
# joined by veth pairs), starts ioc-driver and host-driver with the example configs, configures
# sd0, pings the LAN peer 5 times and runs iperf3 for 3 s each way through sd0, then does it
# again with host-driver on the IOC's local socket and both its channels in shared memory (as
# daemons on one machine would), then stops the daemons and removes the topology, printing
# every step. It needs root: from a root shell it
# runs as it is; otherwise it runs itself again with sudo. What it lacks it installs first
# (tests/setup.sh: Debian packages with apt-get); the build runs as the calling user.
set -u
SELF=$(readlink -f "$0")
. "$(dirname "$SELF")/setup.sh"
reexec_as_root "$SELF" "$@"
cd "$(dirname "$SELF")/.." || exit 1
. tests/cargo.sh
setup_tools demo || exit 1
. tests/lib.sh
say() { printf '\n== %s\n' "$*"; }
need_root
need_tool ip ping iperf3 python3 ss
need_cargo || exit 1

say "1. build (cargo build --release)"
as_user cargo build --release || fail "cargo build --release failed"
BIN=${SPLITNET_BIN:-$(release_dir)}
need_daemons
echo "   $BIN/host-driver: $("$BIN/host-driver" --version)"
echo "   $BIN/ioc-driver:  $("$BIN/ioc-driver" --version)"

say "2. topology (DESIGN.md): sd-host --fabric--> sd-ioc --LAN--> sd-lan"
VERBOSE=1 topo_up 1
cat <<'TXT'
   sd-host  fab0 10.200.0.1/24   (the host machine; sd0 appears when host-driver starts)
   sd-ioc   fab1 10.200.0.2/24   (the I/O unit; lan0 is its NIC, owned by ioc-driver)
   sd-lan   lan1 10.50.0.2/24 fd50::2/64   (a machine on the LAN)
TXT

say "2b. keys, as an operator makes them (README: admitting a host)"
keys_up
cat <<TXT
   + splitnetctl genkey >ioc.key        (the IOC's private key; mode 0600)
   + splitnetctl pubkey <ioc.key        -> $IOC_PUB
     goes in host.toml as auth.ioc_public_key: the host knows it reached this IOC
   + splitnetctl genkey >host.key       (the host's private key; the unit's credential splitnet.key)
   + splitnetctl pubkey <host.key       -> ${HOST_PUB[1]}
     goes in ioc.toml as an [[auth.hosts]] entry: the IOC admits this host, and no other
TXT
grep -A2 '^\[\[auth.hosts\]\]' "$IOC_CONF" | head -n 3 | sed 's/^/     ioc.toml: /'
grep '^ioc_public_key' "$HOST_CONF" | sed 's/^/     host.toml: /'

say "3. ioc-driver in sd-ioc: listens on 10.200.0.2:7400 (and a local socket), owns lan0 (AF_PACKET)"
sed "s|^listen = .*|&\nlisten_local = \"$T/fabric.sock\"|" "$IOC_CONF" >"$T/ioc.toml"
IOC_CONF=$T/ioc.toml
echo "   (the example ioc.toml with the keys of 2b, and listen_local = \"$T/fabric.sock\" for step 6c)"
echo "   + ip netns exec sd-ioc $BIN/ioc-driver --config $IOC_CONF --control-socket $T/ioc.sock  (log: $T/ioc.log)"
start_ioc
echo "   listening; lan0: $(ip -n sd-ioc -br link show lan0)"

say "4. host-driver in sd-host: creates TAP sd0, connects to the IOC; then sd0 is configured"
echo "   + CREDENTIALS_DIRECTORY=$T/cred/host1 ip netns exec sd-host $BIN/host-driver --config $HOST_CONF --control-socket $T/host1.sock  (log: $T/host1.log)"
VERBOSE=1 start_host 1
wait_carrier sd-host up 10
echo "   carrier up ${WAITED_MS} ms later:"
ip -n sd-host -br link show sd0 | sed 's/^/     /'
ip -n sd-host -br addr show sd0 | sed 's/^/     /'

say "5. ping the LAN peer through sd0 (5 times, IPv4), and once over IPv6"
echo "   + ip netns exec sd-host ping -c 5 10.50.0.2"
ip netns exec sd-host ping -c 5 -i 0.2 -W 2 10.50.0.2 | sed 's/^/     /'
[ "${PIPESTATUS[0]}" = 0 ] || fail "ping 10.50.0.2 through sd0"
echo "   + ip netns exec sd-host ping -6 -c 1 fd50::2"
ip netns exec sd-host ping -6 -c 1 -W 2 fd50::2 | sed -n 2p | sed 's/^/     /'

say "6. iperf3 TCP through sd0, 3 s each way (server: iperf3 -s in sd-lan)"
echo "   + ip netns exec sd-host iperf3 -c 10.50.0.2 -t 3"
tx=$(iperf sd-host 10.50.0.2 5201 -t 3) || fail "iperf3 host -> LAN: $tx"
echo "     host -> LAN: $tx Gb/s ($(iperf_field 5201 "d['end']['sum_sent']['retransmits']") retransmits)"
echo "   + ip netns exec sd-host iperf3 -c 10.50.0.2 -t 3 -R"
rx=$(iperf sd-host 10.50.0.2 5202 -t 3 -R) || fail "iperf3 LAN -> host: $rx"
echo "     LAN -> host: $rx Gb/s"

say "6b. what the daemons say about it (splitnetctl over their control sockets)"
echo "   + splitnetctl -s $T/host1.sock status"
"$BIN/splitnetctl" -s "$T/host1.sock" status | sed 's/^/     /'
echo "   + splitnetctl -s $T/ioc.sock hosts"
"$BIN/splitnetctl" -s "$T/ioc.sock" hosts | sed 's/^/     /'

say "6c. the same host as if on the IOC's machine: both its channels in shared memory"
sed "s|^ioc = .*|ioc = \"unix:$T/fabric.sock\"|" "$HOST_CONF" >"$T/host-shm.toml"
echo "   + restart host-driver with fabric.ioc = \"unix:$T/fabric.sock\" (sd0 stays)"
stop_host 1
HOST_CONF=$T/host-shm.toml start_host 1
wait_carrier sd-host up 10
"$BIN/splitnetctl" -s "$T/ioc.sock" hosts | sed 's/^/     /'
ip netns exec sd-host ping -c 3 -i 0.2 -W 2 10.50.0.2 | tail -n 2 | sed 's/^/     /'
[ "${PIPESTATUS[0]}" = 0 ] || fail "ping 10.50.0.2 over shared memory"
tx=$(iperf sd-host 10.50.0.2 5203 -t 3) || fail "iperf3 host -> LAN over shared memory: $tx"
rx=$(iperf sd-host 10.50.0.2 5204 -t 3 -R) || fail "iperf3 LAN -> host over shared memory: $rx"
echo "     over shared memory: host -> LAN $tx Gb/s, LAN -> host $rx Gb/s"

say "7. stop both daemons (SIGTERM: buffer pools flushed with the peer, exit 0)"
stop_host 1; echo "   host-driver exited with status $STOP_RC; sd0 stays for the next host-driver, carrier off, addresses kept:"
ip -n sd-host -br addr show sd0 | sed 's/^/     /'
stop_ioc; echo "   ioc-driver exited with status $STOP_RC"
echo "   last lines of their logs:"
tail -n 3 "$T/host1.log" "$T/ioc.log" 2>/dev/null | sed 's/^/     /'

say "8. remove the topology"
topo_down || fail "topology not removed"
remaining=$(ip netns list | grep -E '^sd-' || true)
[ -z "$remaining" ] || fail "namespaces left: $remaining"
echo "   namespaces sd-host, sd-ioc, sd-lan deleted; nothing left running (KEEP_LOGS=1 keeps the logs)"
echo
echo "demo done: ping and iperf3 went host -> fabric -> IOC -> LAN and back through sd0"
