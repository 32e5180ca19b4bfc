#!/usr/bin/env bash
# Two machines under real systemd, the product installed from its Debian package as an operator
# would install it: a minimal Debian rootfs built with mmdebstrap from the distribution's
# packages, booted twice with `systemd-nspawn -b` (systemd as PID 1), the host machine in the
# reference topology's sd-host namespace and the IOC machine in sd-ioc (the LAN peer stays the
# plain namespace sd-lan). In each machine: `apt-get install` of target/debian/splitnet_*.deb,
# the configuration edited, `systemctl enable --now`. Then: both units active, ping and iperf3
# from the host machine through sd0 (configured by systemd-networkd), the STATUS= lines in
# `systemctl status`, systemd-analyze security of the installed units, splitnetctl status, an
# upgrade that keeps the edited conffiles and hands ioc-driver over to the new binary (sd0's
# carrier kept, a transfer intact across it), one to a binary that does not start (the old
# process serves on), systemctl restart of ioc-driver with its sockets kept (sd0's carrier too,
# a transfer intact across it), kill -9 of ioc-driver restarted by systemd with
# host-driver untouched, `systemctl stop` on either side (pools flushed, exit 0, no error), and
# the journal at the configured log levels.
#
# Everything it makes is under $T (the rootfs; the machines' overlays live in their own mount
# namespaces) or removed on exit, also on failure and on SIGTERM: the machines are powered off
# (killed after 5 s), their cgroups removed, then lib.sh removes the namespaces. Needs root,
# mmdebstrap, systemd-nspawn (systemd-container) and the package: cargo build --release
# --workspace && cargo deb -p host-driver --no-build (tests/run-all.sh does both). The rootfs is
# the Debian suite this machine runs (VERSION_CODENAME of /etc/os-release; MACHINES_SUITE
# overrides it, MACHINES_MIRROR sets the mirror), so the package's libc dependency is met.
# SPLITNET_DEB_DIR: where the package is (default: target/debian beside the release directory).
# About 30 s of the run is mmdebstrap, the rest 15-20 s.
. "$(dirname "$0")/../lib.sh"

MACHINES=(ioc host)               # boot order: the IOC first, the host waits for it
declare -A NS=([host]=sd-host [ioc]=sd-ioc)
declare -A NSPAWN INIT
TIMINGS=()
MMDEBSTRAP=
IN_M_PID=
PHASE=
PHASE_T0=

# ---------------------------------------------------------------------------------------------
# Preconditions

need_root
need_tool ip iperf3 python3 timeout pgrep
missing=()
for t in mmdebstrap:mmdebstrap systemd-nspawn:systemd-container nsenter:util-linux \
    findmnt:util-linux dpkg-deb:dpkg; do
    command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t%%:*} (apt install ${t#*:})")
done
[ ${#missing[@]} -eq 0 ] || fail "missing tool(s): ${missing[*]} (.ci/run installs them all)"

# The package: the newest splitnet_*.deb next to the release directory (target/debian).
DEB_DIR=${SPLITNET_DEB_DIR:-$(dirname "$BIN")/debian}
DEB=
for f in "$DEB_DIR"/splitnet_*.deb; do
    [ -f "$f" ] || continue
    if [ -z "$DEB" ] || [ "$f" -nt "$DEB" ]; then DEB=$f; fi
done
HOW_TO_BUILD="build it with: cargo build --release --workspace && cargo deb -p host-driver --no-build (cargo install --locked cargo-deb; tests/run-all.sh does both)"
[ -n "$DEB" ] || fail "no package $DEB_DIR/splitnet_*.deb: $HOW_TO_BUILD"
for d in host-driver ioc-driver splitnetctl; do
    [ -x "$BIN/$d" ] && [ "$BIN/$d" -nt "$DEB" ] &&
        fail "$DEB is older than $BIN/$d: it would test stale code; $HOW_TO_BUILD"
done
log "package: $DEB"

if [ -n "${MACHINES_SUITE:-}" ]; then
    SUITE=$MACHINES_SUITE
else
    # shellcheck disable=SC1091
    SUITE=$(. /etc/os-release && [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}")
    [ -n "$SUITE" ] || fail "this machine is not Debian: set MACHINES_SUITE to a Debian suite whose libc is at least the build's"
fi

# ---------------------------------------------------------------------------------------------
# Helpers

# phase NAME: starts timing the next major step (the previous one is recorded and printed).
phase() {
    local now d
    now=$(date +%s.%N)
    if [ -n "$PHASE" ]; then
        d=$(awk -v a="$PHASE_T0" -v b="$now" 'BEGIN { printf "%.1f", b - a }')
        TIMINGS+=("$(printf '%-42s %6s s' "$PHASE" "$d")")
        log "($PHASE: $d s)"
    fi
    PHASE=$1
    PHASE_T0=$now
    [ -z "$1" ] || echo "-- $1"
}

# in_m MACHINE CMD...: CMD inside MACHINE (all its namespaces and its root, a clean
# environment), killed after IN_TIMEOUT seconds (default 60). It runs in the background and is
# waited for (standard input passed on): bash defers a SIGTERM's EXIT trap until a foreground
# command ends, but interrupts `wait`, so the machines are cleaned up at once.
in_m() {
    local m=$1 rc
    shift
    timeout --kill-after=5 "${IN_TIMEOUT:-60}" nsenter -t "${INIT[$m]}" -a \
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 TERM=dumb SYSTEMD_PAGER= \
        SYSTEMD_COLORS=0 DEBIAN_FRONTEND=noninteractive "$@" <&0 &
    IN_M_PID=$!
    wait "$IN_M_PID"
    rc=$?
    IN_M_PID=
    return $rc
}

# on MACHINE CMD...: in_m that must succeed; its output is left in $T/on.out (and fails the
# test with the command's last lines otherwise).
on() {
    local m=$1 rc
    shift
    in_m "$m" "$@" >"$T/on.out" 2>&1
    rc=$?
    [ $rc = 0 ] && return 0
    [ $rc = 124 ] && fail "on the $m machine, '$*' did not finish within ${IN_TIMEOUT:-60} s: $(tail -n 5 "$T/on.out" | tr '\n' ' ')"
    fail "on the $m machine, '$*' exited $rc: $(tail -n 8 "$T/on.out" | tr '\n' ' ')"
}

# prop MACHINE UNIT PROPERTY: a property of UNIT from `systemctl show` ("" when unknown).
prop() { in_m "$1" systemctl show -p "$3" --value "$2" 2>/dev/null; }

# until_prop MACHINE UNIT PROPERTY ERE SECONDS: polls until the property matches.
until_prop() {
    local v
    for _ in $(seq $(($5 * 10))); do
        v=$(prop "$1" "$2" "$3")
        [[ $v =~ $4 ]] && return 0
        sleep 0.1
    done
    fail "$2 on the $1 machine: $3 is '$v' after $5 s, want a match of /$4/"
}

# journal MACHINE UNIT [SINCE]: the unit's journal (messages only) since SINCE (@epoch.frac).
journal() {
    in_m "$1" journalctl --no-pager -o cat -u "$2" ${3:+--since "$3"} >"$T/journal.$1.$2" 2>&1
    cat "$T/journal.$1.$2"
}

# cg_paths NAME: a private cgroup NAME below this shell's, in the unified hierarchy and (on a
# hybrid host) in the name=systemd one. Each machine gets its own: with --keep-unit nspawn
# puts its supervisor and payload cgroups below the caller's, and two would collide.
cg_paths() {
    local hier path mnt
    while IFS=: read -r _ hier path; do
        case $hier in
            '') mnt=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts) ;;
            name=systemd) mnt=$(awk '$3 == "cgroup" && $4 ~ /(^|,)name=systemd(,|$)/ { print $2; exit }' /proc/self/mounts) ;;
            *) continue ;;
        esac
        [ -n "$mnt" ] && echo "$mnt${path%/}/$1"
    done </proc/self/cgroup
}

# boot MACHINE [NSPAWN ARGS...]: boots the rootfs as MACHINE (systemd as PID 1) in its
# namespace: read-only rootfs under a tmpfs overlay (--volatile=overlay: both machines share
# it, writes vanish with the machine), the packages directory at /srv/splitnet.
# This host's PID 1 may not be systemd and its cgroups may be hybrid: the unified hierarchy
# for the machine, no registration with machined, the caller's cgroup. A machine keeps
# CAP_NET_ADMIN only when asked.
boot() {
    local m=$1
    shift
    (
        for d in $(cg_paths "splitnet-machine-$m-$$"); do
            mkdir -p "$d" && echo "$BASHPID" >"$d/cgroup.procs" || exit 97
        done
        SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 exec systemd-nspawn --quiet --boot \
            --directory="$T/rootfs" --volatile=overlay --machine="splitnet-$m" \
            --register=no --keep-unit --link-journal=no --console=read-only \
            --capability=CAP_NET_ADMIN --network-namespace-path="/run/netns/${NS[$m]}" \
            --bind-ro="$T/debs:/srv/splitnet" "$@"
    ) </dev/null >"$T/console.$m.log" 2>&1 &
    NSPAWN[$m]=$!
}

# wait_booted MACHINE: finds the machine's PID 1 (the child of nspawn) and waits until its
# systemd reports running (degraded: fails with the failed units).
wait_booted() {
    local m=$1 state=
    for _ in $(seq 100); do
        INIT[$m]=$(pgrep -P "${NSPAWN[$m]}" -x systemd | head -n 1)
        [ -n "${INIT[$m]}" ] && break
        kill -0 "${NSPAWN[$m]}" 2>/dev/null ||
            fail "systemd-nspawn for the $m machine exited: $(tail -n 5 "$T/console.$m.log" | tr '\n' ' ')"
        sleep 0.1
    done
    [ -n "${INIT[$m]}" ] || fail "the $m machine's systemd did not start within 10 s: $(tail -n 5 "$T/console.$m.log" | tr '\n' ' ')"
    for _ in $(seq 60); do
        state=$(IN_TIMEOUT=30 in_m "$m" systemctl is-system-running --wait 2>/dev/null)
        case $state in running | degraded) break ;; esac
        sleep 0.5
    done
    [ "$state" = running ] || fail "the $m machine did not boot cleanly: state '$state'; failed units: $(in_m "$m" systemctl --failed --plain --no-legend 2>&1 | tr '\n' ' ')"
}

# machines_down: powers every machine off (nspawn turns SIGTERM into an orderly shutdown: the
# daemons get their SIGTERM from systemd) and removes their cgroups. A command still running
# in a machine (the test was interrupted) is killed first; a machine still up after 5 s is
# killed with its PID 1 (run-all.sh allows the whole cleanup 10 s after its SIGTERM).
machines_down() {
    local m d rc=0
    [ -n "$IN_M_PID" ] && kill -9 -- "-$IN_M_PID" 2>/dev/null # timeout leads its own group
    for m in "${!NSPAWN[@]}"; do kill -TERM "${NSPAWN[$m]}" 2>/dev/null; done
    for m in "${!NSPAWN[@]}"; do
        for _ in $(seq 50); do kill -0 "${NSPAWN[$m]}" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "${NSPAWN[$m]}" 2>/dev/null; then
            echo "FAIL: the $m machine did not power off within 5 s; killed" >&2
            [ -n "${INIT[$m]:-}" ] && kill -9 "${INIT[$m]}" 2>/dev/null
            for _ in $(seq 20); do kill -0 "${NSPAWN[$m]}" 2>/dev/null || break; sleep 0.1; done
            kill -9 "${NSPAWN[$m]}" 2>/dev/null
            rc=1
        fi
        wait "${NSPAWN[$m]}" 2>/dev/null
        for d in $(cg_paths "splitnet-machine-$m-$$"); do
            [ -d "$d" ] && { find "$d" -depth -type d -exec rmdir {} + 2>/dev/null ||
                { echo "FAIL: cgroup $d left behind" >&2; rc=1; }; }
        done
        rm -rf "/run/systemd/nspawn/propagate/splitnet-$m"
    done
    NSPAWN=()
    return $rc
}

# on_exit: machines first (they live in the namespaces), then the rootfs, then lib.sh's
# cleanup (namespaces, $T). A mount left under $T (mmdebstrap killed half-way) is unmounted;
# $T is never removed across a mount.
on_exit() {
    local rc=$? left
    # A second SIGTERM (timeout signals its whole process group) must not cut the cleanup short.
    trap '' TERM INT
    if [ -n "$MMDEBSTRAP" ] && kill -0 "$MMDEBSTRAP" 2>/dev/null; then
        # timeout passes the signal on to mmdebstrap, which unmounts what it mounted.
        kill -TERM "$MMDEBSTRAP"
        for _ in $(seq 50); do kill -0 "$MMDEBSTRAP" 2>/dev/null || break; sleep 0.1; done
        kill -9 -- "-$MMDEBSTRAP" 2>/dev/null # timeout leads its own process group
        wait "$MMDEBSTRAP" 2>/dev/null
    fi
    machines_down || rc=1
    if [ -d "$T/rootfs" ]; then
        findmnt -rn -o TARGET | grep -F "$T/" | sort -r | xargs -r -n 1 umount -l 2>/dev/null
        left=$(findmnt -rn -o TARGET | grep -F "$T/")
        if [ -n "$left" ]; then
            echo "FAIL: mounts left under $T: $left (kept it)" >&2
            # shellcheck disable=SC2034  # read by cleanup (lib.sh)
            KEEP_LOGS=1
            rc=1
        else
            rm -rf --one-file-system "$T/rootfs"
        fi
    fi
    (exit "$rc")
    cleanup
}
trap on_exit EXIT

# ---------------------------------------------------------------------------------------------
# The package itself

phase "package contents"
dpkg-deb -c "$DEB" | awk '{ print $NF }' | sed 's|^\./|/|' >"$T/deb.files" || fail "dpkg-deb cannot read $DEB"
for f in /usr/bin/host-driver /usr/bin/ioc-driver /usr/bin/splitnetctl \
    /lib/systemd/system/host-driver.service /lib/systemd/system/ioc-driver.service \
    /etc/splitnet/host.toml /etc/splitnet/ioc.toml /usr/share/man/man8/host-driver.8.gz \
    /usr/share/man/man8/ioc-driver.8.gz /usr/share/man/man1/splitnetctl.1.gz \
    /usr/share/doc/splitnet/README.md /usr/share/doc/splitnet/examples/ports.conf \
    /usr/share/doc/splitnet/examples/ports-ovs.conf /usr/lib/splitnet/port-ovs; do
    grep -qxF "$f" "$T/deb.files" || fail "$(basename "$DEB") lacks $f"
done
conffiles=$(dpkg-deb --ctrl-tarfile "$DEB" | tar -xOf - ./conffiles 2>/dev/null | sort | tr '\n' ' ')
assert_eq "$conffiles" "/etc/splitnet/host.toml /etc/splitnet/ioc.toml " "conffiles of the package"
VERSION=$(dpkg-deb -f "$DEB" Version)
log "splitnet $VERSION: $(wc -l <"$T/deb.files") paths, conffiles: $conffiles"
# The upgrade used later: the same package with a higher version.
mkdir -p "$T/debs" "$T/pkg"
cp "$DEB" "$T/debs/"
run dpkg-deb -R "$DEB" "$T/pkg"
run sed -i "s/^Version: .*/Version: $VERSION+upgrade1/" "$T/pkg/DEBIAN/control"
run dpkg-deb -Zgzip -b "$T/pkg" "$T/debs/splitnet_${VERSION}+upgrade1_test.deb"
rm -rf "$T/pkg"

# ---------------------------------------------------------------------------------------------
# Two machines

phase "rootfs (mmdebstrap $SUITE)"
# In the background and waited for (see in_m); a SIGTERM meanwhile stops it in on_exit.
timeout --kill-after=10 600 mmdebstrap --variant=apt \
    --include=systemd,systemd-sysv,iproute2,iputils-ping,iperf3,dbus \
    "$SUITE" "$T/rootfs" ${MACHINES_MIRROR:+"$MACHINES_MIRROR"} </dev/null >"$T/mmdebstrap.log" 2>&1 &
MMDEBSTRAP=$!
wait "$MMDEBSTRAP" || fail "mmdebstrap $SUITE failed (or took over 600 s): $(tail -n 5 "$T/mmdebstrap.log" | tr '\n' ' ')"
MMDEBSTRAP=
# The hostname is the machine's name (nspawn sets it; the copied /etc/hostname would override
# it). Timers that would run apt or fstrim during the test are masked.
rm -f "$T/rootfs/etc/hostname"
for u in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer fstrim.timer; do
    ln -sf /dev/null "$T/rootfs/etc/systemd/system/$u"
done
# /dev/net/tun as Debian's udev makes it (0666: the daemon's unprivileged user opens it, the
# unit's DeviceAllow= limits it). Bound into the host machine; this machine's own node is left
# alone.
run mknod "$T/tun" c 10 200
run chmod 0666 "$T/tun"

phase "topology + boot both machines"
topo_up 1
boot ioc
boot host --bind="$T/tun:/dev/net/tun"
wait_booted ioc
wait_booted host
log "machines up: splitnet-ioc in sd-ioc (PID 1: ${INIT[ioc]}), splitnet-host in sd-host (PID 1: ${INIT[host]})"

phase "apt install + configure"
for m in "${MACHINES[@]}"; do
    on "$m" apt-get install -y "/srv/splitnet/$(basename "$DEB")"
    assert_eq "$(in_m "$m" dpkg-query -W -f '${Status} ${Version}' splitnet)" "install ok installed $VERSION" \
        "splitnet on the $m machine"
    # Nothing is enabled or started by the installation.
    assert_eq "$(in_m "$m" systemctl is-enabled host-driver ioc-driver | tr '\n' ' ')" "disabled disabled " \
        "units enabled by the package on the $m machine"
    assert_eq "$(in_m "$m" systemctl is-active host-driver ioc-driver | tr '\n' ' ')" "inactive inactive " \
        "units started by the package on the $m machine"
done
# The package made each machine's keys, root's alone.
for m in "${MACHINES[@]}"; do
    assert_eq "$(in_m "$m" stat -c '%a %U' /etc/splitnet/host.key /etc/splitnet/ioc.key | tr '\n' ' ')" \
        "600 root 600 root " "the keys the package made on the $m machine"
done
# The operator's edits (README: admitting a host): the IOC admits the host's public key, the
# host names the IOC's; the IOC logs at debug, the host keeps info.
iocpub=$(in_m ioc sh -c 'splitnetctl pubkey </etc/splitnet/ioc.key') || fail "no public key of the IOC"
hostpub=$(in_m host sh -c 'splitnetctl pubkey </etc/splitnet/host.key') || fail "no public key of the host"
in_m ioc sh -c "printf '\n[[auth.hosts]]\nname = \"host\"\npublic_key = \"%s\"\n' '$hostpub' >>/etc/splitnet/ioc.toml" ||
    fail "cannot admit the host in the IOC's ioc.toml"
on host sed -i "s|^# ioc_public_key = .*|ioc_public_key = \"$iocpub\"|" /etc/splitnet/host.toml
on host grep -q "^ioc_public_key = \"$iocpub\"" /etc/splitnet/host.toml
on ioc sed -i 's/^level = "info"/level = "debug"/' /etc/splitnet/ioc.toml
on ioc grep -q '^level = "debug"' /etc/splitnet/ioc.toml
on ioc ioc-driver --check-config --config /etc/splitnet/ioc.toml
on host host-driver --check-config --config /etc/splitnet/host.toml
# sd0 is configured like any interface, here by systemd-networkd. host-driver turns the carrier
# off while the IOC is away: keep the addresses meanwhile.
in_m host sh -c 'cat >/etc/systemd/network/50-sd0.network' <<'EOF' || fail "cannot write 50-sd0.network"
[Match]
Name=sd0

[Network]
Address=10.50.0.1/24
Address=fd50::1/64
ConfigureWithoutCarrier=yes
IgnoreCarrierLoss=yes
EOF
on host systemctl enable --now systemd-networkd

phase "systemctl enable --now"
IN_TIMEOUT=30 on ioc systemctl enable --now ioc-driver
IN_TIMEOUT=30 on host systemctl enable --now host-driver
for m in "${MACHINES[@]}"; do
    u=$m-driver
    assert_eq "$(in_m "$m" systemctl is-active "$u")" active "systemctl is-active $u"
    assert_eq "$(in_m "$m" systemctl is-enabled "$u")" enabled "systemctl is-enabled $u"
done
wait_carrier sd-host up 10

phase "ping + iperf3 through sd0"
eventually 5 in_m host ping -q -c 1 -W 1 10.50.0.2 >/dev/null 2>&1 || fail "no ping reply from 10.50.0.2 through sd0"
on host ping -q -c 5 -i 0.2 -W 2 10.50.0.2
log "ping: $(grep -E 'packets|rtt' "$T/on.out" | tr '\n' ' ')"
ip netns exec sd-lan timeout 60 iperf3 -s -1 -p 5322 >"$T/iperf-server.out" 2>&1 &
PIDS+=($!)
wait_listen sd-lan 5322
in_m host iperf3 -c 10.50.0.2 -p 5322 -t 3 -J >"$T/iperf.5322.json" 2>&1 ||
    fail "iperf3 from the host machine failed: $(grep -o '"error":.*' "$T/iperf.5322.json" || tail -n 3 "$T/iperf.5322.json")"
gbps=$(iperf_field 5322 '"%.3f" % (d["end"]["sum_received"]["bits_per_second"] / 1e9)')
assert_positive "$gbps" "iperf3 TCP host machine -> LAN peer (Gb/s)"
log "iperf3 TCP from the host machine to 10.50.0.2: $gbps Gb/s"
# Each daemon said at start what its configuration may use against the unit's MemoryMax:
# within it where the unified hierarchy has the memory controller (systemd enforces the
# limit there), and that there is no limit where it has not (this machine's kernel keeps
# memory in a v1 hierarchy). The memory its unit was charged after the transfer is printed.
for m in "${MACHINES[@]}"; do
    line=$(journal "$m" "$m-driver" | grep -m1 -o 'memory: this configuration.*')
    want='no memory limit$'
    in_m "$m" grep -qw memory /sys/fs/cgroup/cgroup.controllers && want='within the limit of [0-9]+ MiB$'
    assert_match "$line" "$want" "$m-driver's memory budget against MemoryMax"
    log "$m-driver: ${line#memory: }; charged now $(prop "$m" "$m-driver" MemoryCurrent) bytes (MemoryMax $(prop "$m" "$m-driver" MemoryMax))"
done

phase "systemctl status, exposure, splitnetctl"
until_prop host host-driver StatusText '^fabric up to IOC .*, carrier on' 10
until_prop ioc ioc-driver StatusText '^1 host\(s\), LAN lan0 link up' 10
for m in "${MACHINES[@]}"; do
    in_m "$m" systemctl status --no-pager -n 0 "$m-driver" >"$T/status.$m" 2>&1
    assert_grep "$T/status.$m" '^ +Status: "' "systemctl status $m-driver shows the daemon's STATUS= line"
    log "$m-driver: $(grep -E '^ +Status: ' "$T/status.$m" | sed 's/^ *//')"
done
# Least privilege as installed: systemd-analyze security on the packaged unit, offline (the
# unit file) and online (the loaded, running unit): at most 2.0, and below the distribution's
# own systemd-networkd.service (2.8 offline on Debian 12).
in_m host systemd-analyze security --no-pager --offline=true /lib/systemd/system/systemd-networkd.service \
    >"$T/security.networkd" 2>&1
networkd=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$T/security.networkd")
assert_match "$networkd" '^[0-9.]+$' "exposure of systemd-networkd.service (offline)"
log "for comparison, systemd-networkd.service: exposure $networkd (offline)"
for m in "${MACHINES[@]}"; do
    for how in offline online; do
        args=("$m-driver.service")
        [ $how = offline ] && args=(--offline=true "/lib/systemd/system/$m-driver.service")
        in_m "$m" systemd-analyze security --no-pager "${args[@]}" >"$T/security.$m.$how" 2>&1
        score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$T/security.$m.$how")
        awk -v s="$score" -v n="$networkd" 'BEGIN { exit !(s != "" && s + 0 <= 2.0 && s + 0 < n + 0) }' ||
            fail "$m-driver.service on the $m machine: exposure '$score' ($how), want <= 2.0 and < $networkd: $(grep '✗' "$T/security.$m.$how" | head -n 20)"
        log "$m-driver.service on the $m machine: exposure $score ($how)"
    done
done
# splitnetctl (root, the control socket in the unit's RuntimeDirectory) says the fabric is up.
declare -A CTL_WANT=([host]='^fabric: +up 10\.200\.0\.2:7400' [ioc]='^fabric: +listening 10\.200\.0\.2:7400.*hosts 1/')
for m in "${MACHINES[@]}"; do
    on "$m" splitnetctl status
    cp "$T/on.out" "$T/splitnetctl.$m"
    assert_grep "$T/splitnetctl.$m" "${CTL_WANT[$m]}" "splitnetctl status on the $m machine"
    log "splitnetctl status ($m): $(grep '^fabric:' "$T/splitnetctl.$m")"
done

phase "systemctl reload ioc-driver"
# A reload applies [auth] (the host stays connected: its entry is unchanged); a file that
# changes a key only a restart applies, or that does not parse, makes systemctl reload fail
# visibly (ExecReload= asks the daemon over its control socket and exits 1 with its reason),
# and the running configuration stays.
pid_before=$(prop ioc ioc-driver MainPID)
on ioc systemctl reload ioc-driver
on ioc cp /etc/splitnet/ioc.toml /root/ioc.toml.good
on ioc sed -i 's/^max_hosts = 8$/max_hosts = 9/' /etc/splitnet/ioc.toml
on ioc grep -q '^max_hosts = 9$' /etc/splitnet/ioc.toml
in_m ioc systemctl reload ioc-driver >"$T/reload.out" 2>&1 && fail "systemctl reload took a change of fabric.max_hosts"
journal ioc ioc-driver | grep -q 'reload refused.*\[fabric\] changed' ||
    fail "the refused reload's reason is not in the unit's journal: $(journal ioc ioc-driver | tail -n 5 | tr '\n' ' ')"
on ioc sh -c 'echo "[nonsense" >>/etc/splitnet/ioc.toml'
in_m ioc systemctl reload ioc-driver >"$T/reload.out" 2>&1 && fail "systemctl reload took a file that does not parse"
on ioc cp /root/ioc.toml.good /etc/splitnet/ioc.toml
on ioc systemctl reload ioc-driver
assert_eq "$(prop ioc ioc-driver MainPID)" "$pid_before" "ioc-driver's MainPID across the reloads (not restarted)"
assert_eq "$(prop ioc ioc-driver ActiveState)" active "ioc-driver after the refused reloads"
eventually 5 in_m host ping -q -c 1 -W 1 10.50.0.2 >/dev/null 2>&1 || fail "no ping through sd0 after the reloads"
log "reloads: applied, refused (fabric.max_hosts), refused (a file that does not parse), applied"

phase "upgrade (conffiles kept): ioc-driver handed over, host-driver restarted"
# postinst hands the running ioc-driver's sockets to the new binary (splitnetctl upgrade):
# the new process becomes the unit's main process without a restart, the host hears
# Restarting and keeps sd0's carrier; a paced transfer from the host and a ping every 10 ms
# from the LAN run across it (the gap is printed). The host machine is upgraded first, on its
# own (host-driver is restarted; sd0 stays).
host_pid=$(prop host host-driver MainPID)
on host apt-get install -y "/srv/splitnet/splitnet_${VERSION}+upgrade1_test.deb"
until_prop host host-driver ActiveState '^active$' 15
until_prop host host-driver MainPID "^[1-9][0-9]*$" 15
assert_ne "$(prop host host-driver MainPID)" "$host_pid" "host-driver's MainPID after the upgrade (restarted)"
wait_carrier sd-host up 15
eventually 10 in_m host ping -q -c 1 -W 1 10.50.0.2 >/dev/null 2>&1 || fail "no ping through sd0 after the host's upgrade"
ioc_pid=$(prop ioc ioc-driver MainPID)
ioc_restarts=$(prop ioc ioc-driver NRestarts)
t_upgrade=$(date +%s.%N)
upgrade_ioc() { IN_TIMEOUT=60 on ioc apt-get install -y "/srv/splitnet/splitnet_${VERSION}+upgrade1_test.deb"; }
across "package upgrade of the IOC" upgrade_ioc
upgrade_gap=$GAP_MS
assert_eq "$(in_m ioc dpkg-query -W -f '${Version}' splitnet)" "$VERSION+upgrade1" "version after the upgrade (ioc)"
assert_eq "$(prop ioc ioc-driver ActiveState)" active "ioc-driver after the upgrade"
assert_ne "$(prop ioc ioc-driver MainPID)" "$ioc_pid" "ioc-driver's MainPID after the upgrade (the new process)"
assert_eq "$(prop ioc ioc-driver NRestarts)" "$ioc_restarts" "ioc-driver's restarts across the upgrade (none)"
journal ioc ioc-driver "@$t_upgrade" >/dev/null
assert_grep "$T/journal.ioc.ioc-driver" 'upgrade: the new process serves' "the old ioc-driver handing over"
assert_no_grep "$T/journal.ioc.ioc-driver" 'Stopping|Stopped|Started|reception only permitted|not our child' "systemd across the hand-over (no restart, no refused message)"
journal host host-driver "@$t_upgrade" >/dev/null
assert_grep "$T/journal.host.host-driver" 'the IOC is restarting; carrier kept' "host-driver told of the IOC's upgrade"
assert_no_grep "$T/journal.host.host-driver" 'carrier off|fabric lost' "host-driver across the IOC's upgrade"
on ioc grep -q '^level = "debug"' /etc/splitnet/ioc.toml
on ioc sh -c 'test ! -e /etc/splitnet/ioc.toml.dpkg-new && test ! -e /etc/splitnet/ioc.toml.dpkg-dist'
log "package upgrade of the IOC: longest gap between replies to a ping every 10 ms from the LAN ${upgrade_gap} ms"
# systemd's watchdog (WatchdogSec=5) runs on across the change of main process: the new one
# is fed in time, and nothing restarts it once the timer would have run out.
new_pid=$(prop ioc ioc-driver MainPID)
sleep 6
assert_eq "$(prop ioc ioc-driver MainPID)" "$new_pid" "ioc-driver's MainPID 6 s after the upgrade"
assert_eq "$(prop ioc ioc-driver NRestarts)" "$ioc_restarts" "ioc-driver's restarts 6 s after the upgrade"
journal ioc ioc-driver "@$t_upgrade" >/dev/null
assert_no_grep "$T/journal.ioc.ioc-driver" 'atchdog timeout|Stopping|Stopped' "systemd 6 s after the upgrade"

phase "upgrade to a binary that does not start: the old ioc-driver serves on"
# As a package whose ioc-driver fails at once would leave it: the hand-over is refused with
# exit 3 and nothing else changes; the good binary goes back after.
on ioc cp /usr/bin/ioc-driver /root/ioc-driver.good
in_m ioc sh -c 'printf "#!/bin/sh\necho this build is broken >&2\nexit 1\n" >/usr/bin/ioc-driver.new && chmod 755 /usr/bin/ioc-driver.new && mv -f /usr/bin/ioc-driver.new /usr/bin/ioc-driver' ||
    fail "cannot put a broken ioc-driver in place"
ioc_pid=$(prop ioc ioc-driver MainPID)
rc=0; in_m ioc splitnetctl --daemon ioc upgrade >"$T/upgrade.out" 2>&1 || rc=$?
assert_eq "$rc" 3 "splitnetctl upgrade's exit status with a broken binary"
assert_grep "$T/upgrade.out" 'not upgraded, the running process serves on' "splitnetctl's refusal"
assert_eq "$(prop ioc ioc-driver MainPID)" "$ioc_pid" "ioc-driver's MainPID after the refused upgrade"
assert_eq "$(prop ioc ioc-driver ActiveState)" active "ioc-driver after the refused upgrade"
on host ping -q -c 3 -i 0.2 -W 2 10.50.0.2
in_m ioc sh -c 'mv -f /root/ioc-driver.good /usr/bin/ioc-driver' || fail "cannot put the good ioc-driver back"

phase "systemctl restart ioc-driver: sockets kept, carrier kept"
# systemd keeps the fabric socket in the unit's descriptor store across the restart; the old
# process tells the host it is restarting, the host keeps sd0's carrier and reconnects at
# once, and the new process accepts that connection. The gap a ping every 10 ms from the LAN
# sees is printed (a timing decides no test).
assert_match "$(prop ioc ioc-driver NFileDescriptorStore)" '^[1-9]' "descriptors in ioc-driver's store"
ioc_pid=$(prop ioc ioc-driver MainPID)
t_restart=$(date +%s.%N)
restart_ioc() { IN_TIMEOUT=30 on ioc systemctl restart ioc-driver; }
across "systemctl restart ioc-driver" restart_ioc
gap=$GAP_MS
assert_ne "$(prop ioc ioc-driver MainPID)" "$ioc_pid" "ioc-driver MainPID after systemctl restart"
journal ioc ioc-driver "@$t_restart" >/dev/null
assert_grep "$T/journal.ioc.ioc-driver" 'fabric socket kept across the restart' "the new ioc-driver taking the kept socket up"
journal host host-driver "@$t_restart" >/dev/null
assert_grep "$T/journal.host.host-driver" 'the IOC is restarting; carrier kept' "host-driver told of the restart"
assert_no_grep "$T/journal.host.host-driver" 'carrier off|fabric lost' "host-driver across the restart"
assert_grep "$T/journal.host.host-driver" 'fabric up' "host-driver reconnected"
log "systemctl restart ioc-driver: longest gap between replies to a ping every 10 ms from the LAN ${gap} ms"

phase "kill -9 ioc-driver: systemd restarts it"
host_pid=$(prop host host-driver MainPID)
ioc_pid=$(prop ioc ioc-driver MainPID)
assert_match "$ioc_pid" '^[1-9][0-9]*$' "ioc-driver MainPID"
t_kill=$(date +%s.%N)
on ioc sh -c "kill -9 $ioc_pid"
until_prop ioc ioc-driver NRestarts '^1$' 10
until_prop ioc ioc-driver ActiveState '^active$' 10
assert_ne "$(prop ioc ioc-driver MainPID)" "$ioc_pid" "ioc-driver MainPID after kill -9"
journal ioc ioc-driver "@$t_kill" >/dev/null
assert_grep "$T/journal.ioc.ioc-driver" 'Main process exited, code=killed, status=9/KILL' "systemd saw the kill"
assert_grep "$T/journal.ioc.ioc-driver" 'Scheduled restart job' "systemd scheduled a restart (Restart=on-failure)"
eventually 10 in_m host ping -q -c 1 -W 1 10.50.0.2 >/dev/null 2>&1 || fail "no ping through sd0 after ioc-driver's restart"
t_back=$(date +%s.%N)
on host ping -q -c 3 -i 0.2 -W 2 10.50.0.2
assert_eq "$(prop host host-driver MainPID)" "$host_pid" "host-driver MainPID (untouched by the IOC's restart)"
assert_eq "$(prop host host-driver NRestarts)" 0 "host-driver NRestarts"
journal host host-driver "@$t_kill" >/dev/null
assert_grep "$T/journal.host.host-driver" 'fabric up' "host-driver reconnected by itself"
log "traffic back $(awk -v a="$t_kill" -v b="$t_back" 'BEGIN { printf "%.1f", b - a }') s after the kill"

phase "systemctl stop (host, then IOC)"
# Host first: pools flushed, exit 0, a clean goodbye at the IOC.
t_stop=$(date +%s.%N)
IN_TIMEOUT=15 on host systemctl stop host-driver
assert_eq "$(prop host host-driver ActiveState)/$(prop host host-driver Result)/$(prop host host-driver ExecMainStatus)" \
    "inactive/success/0" "host-driver after systemctl stop (state/result/exit status)"
journal host host-driver "@$t_stop" >/dev/null
assert_grep "$T/journal.host.host-driver" 'pools flushed' "host-driver flushed its pools on stop"
assert_no_grep "$T/journal.host.host-driver" ' (ERROR|WARN) |Failed|failed' "host-driver's journal on stop"
# sd0 outlives the daemon (interface.persist): still there, carrier off, address kept.
ip -n sd-host link show sd0 >/dev/null 2>&1 || fail "sd0 went away with host-driver's stop"
assert_eq "$(carrier sd-host)" down "sd0's carrier while host-driver is stopped"
sleep 0.3
journal ioc ioc-driver "@$t_stop" >/dev/null
assert_grep "$T/journal.ioc.ioc-driver" 'host removed: host disconnected \(ShuttingDown\)' "the IOC saw a clean disconnect"
assert_no_grep "$T/journal.ioc.ioc-driver" ' ERROR |Failed|failed' "ioc-driver's journal on the host's stop"
# Host back, then the IOC stops: exit 0, the host sees the IOC's goodbye and keeps retrying.
IN_TIMEOUT=30 on host systemctl start host-driver
wait_carrier sd-host up 10
t_stop=$(date +%s.%N)
IN_TIMEOUT=15 on ioc systemctl stop ioc-driver
assert_eq "$(prop ioc ioc-driver ActiveState)/$(prop ioc ioc-driver Result)/$(prop ioc ioc-driver ExecMainStatus)" \
    "inactive/success/0" "ioc-driver after systemctl stop (state/result/exit status)"
journal ioc ioc-driver "@$t_stop" >/dev/null
assert_grep "$T/journal.ioc.ioc-driver" 'shutting down: flushing pools with every host hosts=1' "ioc-driver flushed the host's pools"
assert_grep "$T/journal.ioc.ioc-driver" ' INFO stopped' "ioc-driver logged its stop"
# (An incomplete flush would be a WARN.)
assert_no_grep "$T/journal.ioc.ioc-driver" ' (ERROR|WARN) |Failed|failed' "ioc-driver's journal on stop"
# The IOC cannot tell a stop from a restart (systemd says neither): it says Restarting, the
# host holds sd0's carrier for restart_grace_ms (2 s) while the released socket refuses it,
# then drops it (README, "Restarting an IOC").
wait_carrier sd-host down 5
log "sd0's carrier off ${WAITED_MS} ms after systemctl stop ioc-driver (restart_grace_ms = 2000)"
journal host host-driver "@$t_stop" >/dev/null
assert_grep "$T/journal.host.host-driver" 'the IOC is restarting; carrier kept' "the host saw the IOC's goodbye"
assert_grep "$T/journal.host.host-driver" 'did not come back within fabric.restart_grace_ms; carrier off' "the host giving up its hold"
assert_eq "$(in_m host systemctl is-active host-driver)" active "host-driver while the IOC is stopped"
IN_TIMEOUT=15 on host systemctl stop host-driver
assert_eq "$(prop host host-driver Result)/$(prop host host-driver ExecMainStatus)" "success/0" \
    "host-driver stopped while the IOC is away (result/exit status)"

phase "journal at the configured levels"
journal host host-driver >/dev/null
journal ioc ioc-driver >/dev/null
assert_grep "$T/journal.host.host-driver" '^[0-9T:.-]+Z +INFO fabric up' "host-driver's INFO lines in the journal"
assert_no_grep "$T/journal.host.host-driver" '^[0-9T:.-]+Z +(DEBUG|TRACE) ' "host-driver's journal at level info"
assert_grep "$T/journal.ioc.ioc-driver" '^[0-9T:.-]+Z +DEBUG ' "ioc-driver's DEBUG lines in the journal (level debug)"
assert_no_grep "$T/journal.ioc.ioc-driver" '^[0-9T:.-]+Z +TRACE ' "ioc-driver's journal at level debug"
for m in "${MACHINES[@]}"; do
    assert_no_grep "$T/journal.$m.$m-driver" '^[0-9T:.-]+Z +ERROR ' "$m-driver's journal over the whole test"
    log "$m-driver journal: $(grep -cE '^[0-9T:.-]+Z +INFO ' "$T/journal.$m.$m-driver") INFO, $(grep -cE '^[0-9T:.-]+Z +DEBUG ' "$T/journal.$m.$m-driver") DEBUG, $(grep -cE '^[0-9T:.-]+Z +WARN ' "$T/journal.$m.$m-driver") WARN lines"
done

phase "apt purge"
# Removal stops a running daemon (prerm); purge drops the conffiles and the enable link.
IN_TIMEOUT=30 on ioc systemctl start ioc-driver
t_purge=$(date +%s.%N)
on ioc apt-get purge -y splitnet
assert_eq "$(in_m ioc systemctl is-active ioc-driver)" inactive "ioc-driver after apt purge"
assert_eq "$(prop ioc ioc-driver LoadState)" not-found "ioc-driver.service after apt purge"
on ioc sh -c 'for f in /usr/bin/ioc-driver /etc/splitnet /etc/systemd/system/multi-user.target.wants/ioc-driver.service; do
    if [ -e "$f" ] || [ -L "$f" ]; then echo "left behind: $f"; exit 1; fi; done'
journal ioc ioc-driver "@$t_purge" >/dev/null
assert_grep "$T/journal.ioc.ioc-driver" ' INFO stopped' "ioc-driver stopped by the package's removal"
assert_no_grep "$T/journal.ioc.ioc-driver" ' (ERROR|WARN) |Failed|failed' "ioc-driver's journal on removal"
# The host's purge removes the persistent sd0 too.
ip -n sd-host link show sd0 >/dev/null 2>&1 || fail "sd0 gone before the host's purge"
on host apt-get purge -y splitnet
ip -n sd-host link show sd0 >/dev/null 2>&1 && fail "sd0 left behind by the host's apt purge"

phase "power off + clean up"
machines_down || fail "the machines did not power off cleanly"
phase ""
echo "timings:"
printf '  %s\n' "${TIMINGS[@]}"
pass "two machines under systemd: package installed with apt, units enabled and started, traffic through sd0, restart on kill -9, clean stops, journal levels"
