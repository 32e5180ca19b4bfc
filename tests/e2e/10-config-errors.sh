#!/usr/bin/env bash
# --check-config accepts the shipped examples and names the key of a bad value; start-up
# failures are one clear line.
. "$(dirname "$0")/../lib.sh"
need_tool ip; need_daemons
"$BIN/host-driver" --check-config --config "$HOST_CONF" >/dev/null || fail "host.toml refused"
"$BIN/ioc-driver" --check-config --config "$IOC_CONF" >/dev/null || fail "ioc.toml refused"
sed 's/name = "sd0"/name = "averyveryverylongname"/' "$HOST_CONF" >"$T/bad.toml"
out=$("$BIN/host-driver" --check-config --config "$T/bad.toml" 2>&1); rc=$?
[ "$rc" = 2 ] || fail "bad config exit code $rc, want 2"
echo "$out" | grep -q "interface.name" || fail "error does not name the key: $out"
printf '[fabric]\nioc = "10.200.0.2:7400"\nbogus = 1\n' >"$T/unknown.toml"
out=$("$BIN/host-driver" --check-config --config "$T/unknown.toml" 2>&1) && fail "unknown key accepted"
echo "$out" | grep -q "bogus" || fail "error does not name the unknown key: $out"
"$BIN/host-driver" --version | grep -q "host-driver" || fail "--version"
if [ "$(id -u)" = 0 ]; then
    addns sd-ioc
    out=$(timeout 5 ip netns exec sd-ioc "$BIN/ioc-driver" --config "$IOC_CONF" 2>&1); rc=$?
    [ "$rc" = 1 ] || fail "missing LAN interface: exit $rc"
    echo "$out" | grep -q "cannot open LAN interface lan0" || fail "unclear start-up error: $out"
fi
pass "configuration errors are clear"
