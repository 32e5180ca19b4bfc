#!/usr/bin/env bash
# Checks the systemd units: `systemd-analyze verify` on copies whose ExecStart points at the
# built daemons (verify needs the binaries to exist), the man pages they name exist in
# docs/man, each unit bounds its memory, tasks and descriptors (MemoryMax, TasksMax,
# LimitNOFILE), and `systemd-analyze security --offline=true` scores each unit at most
# UNIT_MAX_EXPOSURE (default 2.0; Debian's own systemd-networkd.service scores 2.8).
set -u
cd "$(dirname "$0")/.." || exit 1
command -v systemd-analyze >/dev/null || { echo "FAIL: missing systemd-analyze (apt install systemd)"; exit 1; }
max=${UNIT_MAX_EXPOSURE:-2.0}
bin=${SPLITNET_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
rc=0
for u in host-driver ioc-driver; do
    [ -x "$bin/$u" ] || { echo "FAIL: $bin/$u not built (cargo build --release)"; rc=1; continue; }
    grep -q "^ExecStart=/usr/bin/$u --config /etc/splitnet/${u%-driver}.toml$" "systemd/$u.service" ||
        { echo "FAIL: $u.service: ExecStart is not /usr/bin/$u --config /etc/splitnet/${u%-driver}.toml"; rc=1; }
    # ioc-driver's ExecReload= runs splitnetctl, installed beside the daemons.
    sed -e "s|/usr/bin/$u|$bin/$u|" -e "s|/usr/bin/splitnetctl|$bin/splitnetctl|" "systemd/$u.service" >"$d/$u.service"
    # Documentation=man:... is checked here against docs/man rather than by verify's man(1).
    if out=$(systemd-analyze verify --man=no "$d/$u.service" 2>&1) && [ -z "$out" ]; then
        echo "$u.service: systemd-analyze verify: ok"
    else
        echo "FAIL: $u.service: systemd-analyze verify reported:"; echo "$out" | sed 's/^/  /'; rc=1
    fi
    for k in MemoryMax TasksMax LimitNOFILE; do
        grep -q "^$k=[0-9]" "systemd/$u.service" || { echo "FAIL: $u.service sets no $k"; rc=1; }
    done
    for m in $(grep -o 'man:[^ ]*' "systemd/$u.service" | sed 's/man:\([^(]*\)(\([0-9]\))/\1.\2/'); do
        [ -f "docs/man/$m" ] || { echo "FAIL: $u.service names man page $m, not in docs/man"; rc=1; }
    done
    score=$(systemd-analyze security --offline=true "$d/$u.service" 2>/dev/null |
        sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
    if [ -z "$score" ]; then
        echo "FAIL: $u.service: no exposure score from systemd-analyze security --offline=true"; rc=1
    elif awk -v s="$score" -v m="$max" 'BEGIN { exit !(s + 0 <= m + 0) }'; then
        echo "$u.service: exposure $score (systemd-analyze security --offline=true; limit $max)"
    else
        echo "FAIL: $u.service: exposure $score above $max:"
        systemd-analyze security --offline=true "$d/$u.service" 2>/dev/null | grep '✗' | sed 's/^/  /'
        rc=1
    fi
    # With each drop-in the README offers (appended as systemd merges a drop-in's [Service]
    # lines): still valid, and within the same bound. latency.conf applies to both daemons;
    # ports.conf (and ports-ovs.conf beside it) to the IOC.
    drops=(latency)
    [ "$u" = ioc-driver ] && drops+=(ports ports+ports-ovs)
    for drop in "${drops[@]}"; do
        unit="$d/$u-${drop//+/-}.service"
        cp "$d/$u.service" "$unit"
        for f in ${drop//+/ }; do cat "systemd/$f.conf" >>"$unit"; done
        what="$u.service with ${drop//+/.conf and }.conf"
        # ports-ovs.conf runs the daemon as root for OVS's database socket (README, "Ports
        # mode": the one way ovs-vsctl reaches it on Debian); root alone costs 0.4 here.
        lim=$max
        [ "$drop" = ports+ports-ovs ] && lim=$(awk -v m="$max" 'BEGIN { print m + 0.5 }')
        if out=$(systemd-analyze verify --man=no "$unit" 2>&1) && [ -z "$out" ]; then
            echo "$what: systemd-analyze verify: ok"
        else
            echo "FAIL: $what: systemd-analyze verify reported:"; echo "$out" | sed 's/^/  /'; rc=1
        fi
        score=$(systemd-analyze security --offline=true "$unit" 2>/dev/null |
            sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
        if [ -n "$score" ] && awk -v s="$score" -v m="$lim" 'BEGIN { exit !(s + 0 <= m + 0) }'; then
            echo "$what: exposure $score (limit $lim)"
        else
            echo "FAIL: $what: exposure '${score}' above $lim"; rc=1
        fi
    done
done
exit $rc
