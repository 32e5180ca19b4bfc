#!/usr/bin/env bash
# shellcheck disable=SC2034  # VM_ELAPSED, VM_KVER, ...: read by the tests that source this file
# Tests in QEMU/TCG virtual machines running Debian's stock kernel, for what this machine's
# kernel lacks (rdma_rxe, 8021q, bonding, fq_codel): sourced by a test, after tests/lib.sh or
# alone. Each VM sees the host's / read-only (host-built binaries run unchanged) under a tmpfs
# overlay, runs one script and powers off; VMs are joined by virtio-net NICs whose frames go
# over UDP on 127.0.0.1, never further. tests/vm/README.md says what it costs.
#
#   vm_setup [PACKAGE...]         QEMU and busybox-static, and the Debian packages the test's
#                                 VMs need from this machine's / (apt-get, if missing), the
#                                 kernel and its modules, the initramfs: cached, so later runs
#                                 start at once
#   vm_pair A B                   VMs A and B each get a NIC (eth0, eth1, ... in order of
#                                 vm_pair calls), the two joined by a wire
#   vm_start NAME SCRIPT [ARG...] boots VM NAME in the background; it runs SCRIPT with ARGs
#                                 (through tests/vm/guest.sh, which has helpers for it)
#   vm_wait NAME                  waits for it (VM_TIMEOUT after its start, then kills it) and
#                                 returns its script's exit status; when not 0, VM_ERROR says
#                                 which VM failed and what it was doing
#   vm_wait_all NAME...           vm_wait for several VMs, returning at the first failure
#   vm_boot NAME SCRIPT [ARG...]  vm_start, then vm_wait
#   vm_result_get NAME KEY        a value the VM's script recorded (vm_result KEY VALUE)
#   vm_out NAME                   the VM's results directory on the host: stdout, stderr,
#                                 status, step, results, and whatever the script wrote there
#
# Every function returns non-zero with VM_ERROR set on failure: `vm_setup || fail "$VM_ERROR"`.
# On exit (trap, chained to tests/lib.sh's cleanup when that was sourced first) every QEMU
# still running is killed; QEMU also dies with the test's shell if that is killed outright.
# Files: $T/vm-NAME/ (tests/lib.sh's $T) or a temporary directory of its own, removed unless
# KEEP_LOGS=1; $T/vm-NAME.log links to the VM's stderr, so tests/lib.sh's fail shows its tail.
#
# Environment: VM_TIMEOUT (seconds per VM, default 600), VM_MEM (MiB, 1024), VM_SMP (1),
# VM_MAX (VMs running at once, 2), VM_KERNEL (a linux-image-*-amd64 package; default: the one
# cached, else the one linux-image-amd64 depends on).
set -u

VM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VM_CACHE=$(realpath -m "${CARGO_TARGET_DIR:-$VM_ROOT/target}/vm")
VM_TIMEOUT=${VM_TIMEOUT:-600}
VM_BUSYBOX=/bin/busybox
# Modules the initramfs loads to reach the host's / (their dependencies come along).
VM_BOOT_MODULES=(virtio_pci virtio_net 9pnet_virtio 9p overlay)
VM_ERROR=
VM_INITRD=
declare -A VM_PID=() VM_START=() VM_ELAPSED=() VM_NET=() VM_NICS=()

if [ -n "${T:-}" ] && [ -d "${T:-}" ]; then
    VM_TMP=$T
    VM_OWN_TMP=0
else
    VM_TMP=$(mktemp -d /tmp/splitnet-vm.XXXXXX)
    VM_OWN_TMP=1
fi

# ---------------------------------------------------------------------------------------------
# Set-up: packages, kernel, initramfs

# vm_setup [PACKAGE...]: everything a VM needs, built once into VM_CACHE (a lock keeps two
# tests from building it at the same time), and the Debian packages PACKAGE... installed on
# this machine (the VMs see its /). Sets VM_KVER, VM_VMLINUZ, VM_MODULES, VM_INITRD.
vm_setup() {
    local fd rc
    mkdir -p "$VM_CACHE" || { VM_ERROR="cannot create the VM cache $VM_CACHE"; return 1; }
    exec {fd}>>"$VM_CACHE/.lock"
    flock "$fd"
    vm__packages "$@" && vm__kernel && vm__initramfs
    rc=$?
    exec {fd}>&-
    return "$rc"
}

# vm__packages [PACKAGE...]: qemu-system-x86, busybox-static and PACKAGE..., installed with
# apt-get when missing.
vm__packages() {
    local missing=() pkg
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    for pkg in busybox-static "$@"; do
        dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q ' installed' || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] ||
        { VM_ERROR="missing packages: ${missing[*]} (apt-get install them, or run as root)"; return 1; }
    echo "  vm: installing ${missing[*]}" >&2
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
        >"$VM_CACHE/apt.log" 2>&1; then
        apt-get update >>"$VM_CACHE/apt.log" 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
            >>"$VM_CACHE/apt.log" 2>&1 ||
            { VM_ERROR="apt-get install ${missing[*]} failed: $(tail -n 3 "$VM_CACHE/apt.log")"; return 1; }
    fi
}

# vm__kernel_package: the linux-image-*-amd64 package Debian's linux-image-amd64 depends on.
vm__kernel_package() {
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
    if [ -z "$pkg" ]; then
        apt-get update >/dev/null 2>&1
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
    fi
    [ -n "$pkg" ] || { VM_ERROR="apt knows no linux-image-amd64 (set VM_KERNEL)"; return 1; }
    echo "$pkg"
}

# vm__kernel: the kernel package's vmlinuz and modules in VM_CACHE/PACKAGE (downloaded and
# extracted once; the package chosen first is kept until VM_KERNEL names another).
vm__kernel() {
    local pkg=${VM_KERNEL:-} dir
    [ -n "$pkg" ] || pkg=$(cat "$VM_CACHE/kernel" 2>/dev/null)
    [ -n "$pkg" ] || pkg=$(vm__kernel_package) || return 1
    dir=$VM_CACHE/$pkg
    [ -e "$dir/ready" ] || vm__fetch_kernel "$pkg" "$dir" || return 1
    echo "$pkg" >"$VM_CACHE/kernel"
    VM_KVER=$(cat "$dir/version")
    VM_VMLINUZ=$dir/vmlinuz
    VM_MODULES=$dir/lib/modules/$VM_KVER
    case $VM_MODULES in *[[:space:],]*)
        VM_ERROR="the VM cache path has a space or comma (QEMU and the kernel line cannot take it): $VM_MODULES"
        return 1 ;;
    esac
}

# vm__fetch_kernel PACKAGE DIR: apt-get download, dpkg -x, keep vmlinuz and the modules (with
# a modules.dep from busybox depmod) in DIR.
vm__fetch_kernel() {
    local pkg=$1 dir=$2 tmp kver mods
    echo "  vm: downloading $pkg (about 70 MB, once)" >&2
    tmp=$(mktemp -d "$VM_CACHE/fetch.XXXXXX")
    chmod 755 "$tmp" # apt-get download runs as _apt where it can
    if ! (cd "$tmp" && apt-get download "$pkg") >"$tmp/log" 2>&1; then
        VM_ERROR="apt-get download $pkg failed: $(tail -n 3 "$tmp/log")"
        rm -rf "$tmp"
        return 1
    fi
    dpkg -x "$tmp"/*.deb "$tmp/x" || { VM_ERROR="dpkg -x of $pkg failed"; rm -rf "$tmp"; return 1; }
    mods=$tmp/x/lib/modules
    [ -d "$mods" ] || mods=$tmp/x/usr/lib/modules
    kver=$(ls "$mods" 2>/dev/null | head -n 1)
    if [ -z "$kver" ] || [ ! -f "$tmp/x/boot/vmlinuz-$kver" ]; then
        VM_ERROR="$pkg has no vmlinuz or no modules"
        rm -rf "$tmp"
        return 1
    fi
    mkdir -p "$tmp/k/lib/modules"
    mv "$tmp/x/boot/vmlinuz-$kver" "$tmp/k/vmlinuz"
    mv "$mods/$kver" "$tmp/k/lib/modules/$kver"
    echo "$kver" >"$tmp/k/version"
    "$VM_BUSYBOX" depmod -b "$tmp/k" "$kver" ||
        { VM_ERROR="busybox depmod failed for $kver"; rm -rf "$tmp"; return 1; }
    rm -rf "$dir"
    mv "$tmp/k" "$dir" && touch "$dir/ready"
    rm -rf "$tmp"
}

# vm__module_closure NAME...: the modules.dep lines of the modules NAME and of everything they
# depend on (a dependency list there is already complete).
vm__module_closure() {
    local m line f
    for m in "$@"; do
        line=$(grep -E "^([^:]*/)?$m\.ko:" "$VM_MODULES/modules.dep") || return 1
        for f in ${line/:/}; do grep -E "^$f:" "$VM_MODULES/modules.dep"; done
    done | sort -u
}

# vm__initramfs: /init (tests/vm/init.sh), a static busybox and the boot modules, as a cpio
# archive named after what went in (a change to init.sh builds a new one).
vm__initramfs() {
    local key tmp deps f a
    key=$({ cat "$VM_ROOT/tests/vm/init.sh"; echo "$VM_KVER ${VM_BOOT_MODULES[*]}"; "$VM_BUSYBOX" | head -n 1; } |
        sha256sum | cut -c1-16)
    VM_INITRD=$VM_CACHE/initramfs-$VM_KVER-$key.cpio
    [ -s "$VM_INITRD" ] && return 0
    tmp=$(mktemp -d "$VM_CACHE/initramfs.XXXXXX")
    mkdir -p "$tmp"/{bin,dev,proc,sys,lower,rw,newroot} "$tmp/lib/modules/$VM_KVER"
    ln -s bin "$tmp/sbin"
    cp "$VM_BUSYBOX" "$tmp/bin/busybox"
    for a in $("$VM_BUSYBOX" --list); do [ "$a" = busybox ] || ln -s busybox "$tmp/bin/$a"; done
    install -m 755 "$VM_ROOT/tests/vm/init.sh" "$tmp/init"
    deps=$(vm__module_closure "${VM_BOOT_MODULES[@]}") ||
        { VM_ERROR="a boot module (${VM_BOOT_MODULES[*]}) is missing from $VM_KVER"; rm -rf "$tmp"; return 1; }
    echo "$deps" >"$tmp/lib/modules/$VM_KVER/modules.dep"
    for f in $(echo "$deps" | cut -d: -f1); do
        mkdir -p "$tmp/lib/modules/$VM_KVER/$(dirname "$f")"
        cp "$VM_MODULES/$f" "$tmp/lib/modules/$VM_KVER/$f"
    done
    rm -f "$VM_CACHE"/initramfs-*.cpio
    (cd "$tmp" && find . | "$VM_BUSYBOX" cpio -o -H newc 2>/dev/null) >"$VM_INITRD.tmp" &&
        mv "$VM_INITRD.tmp" "$VM_INITRD"
    rm -rf "$tmp"
    [ -s "$VM_INITRD" ] || { VM_ERROR="could not pack the initramfs"; return 1; }
}

# ---------------------------------------------------------------------------------------------
# Wires between VMs

# vm__free_udp_port [TAKEN...]: a UDP port on 127.0.0.1 nothing listens on (and not TAKEN).
vm__free_udp_port() {
    local p
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % 40000))
        [[ " $* " == *" $p "* ]] && continue
        ss -Hlun "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return 0; }
    done
    return 1
}

# vm__add_nic NAME LOCAL_PORT REMOTE_PORT: VM NAME's next NIC, whose frames go from UDP port
# LOCAL_PORT to REMOTE_PORT on 127.0.0.1 (the MAC comes from the local port: unique).
vm__add_nic() {
    local n=${VM_NICS[$1]:-0} mac
    mac=$(printf '52:54:00:%02x:%02x:%02x' $(($2 >> 8)) $(($2 & 255)) "$n")
    VM_NET[$1]="${VM_NET[$1]:-} -netdev socket,id=net$n,udp=127.0.0.1:$3,localaddr=127.0.0.1:$2"
    VM_NET[$1]+=" -device virtio-net-pci,netdev=net$n,mac=$mac,romfile="  # romfile=: no iPXE
    VM_NICS[$1]=$((n + 1))
}

# vm_pair A B: a wire between VMs A and B (call it before vm_start of either).
vm_pair() {
    local pa pb
    pa=$(vm__free_udp_port) && pb=$(vm__free_udp_port "$pa") ||
        { VM_ERROR="no free UDP port on 127.0.0.1 for the wire $1 - $2"; return 1; }
    vm__add_nic "$1" "$pa" "$pb"
    vm__add_nic "$2" "$pb" "$pa"
}

# ---------------------------------------------------------------------------------------------
# Running VMs

# vm_out NAME: the VM's results directory on the host (/vm/out in the VM).
vm_out() { echo "$VM_TMP/vm-$1/out"; }

# vm_result_get NAME KEY: the last value the VM's script recorded for KEY (empty if none).
vm_result_get() { sed -n "s/^$2=//p" "$(vm_out "$1")/results" 2>/dev/null | tail -n 1; }

# vm__run_script NAME SCRIPT [ARG...]: the /vm/out/run.sh init.sh runs: environment, then
# guest.sh with the script and its arguments.
vm__run_script() {
    local name=$1
    shift
    echo '#!/bin/bash'
    echo "# Written by vm_start (tests/vm/lib.sh): VM $name runs this chrooted into the host's / (tests/vm/init.sh)."
    printf 'export VM_NAME=%q VM_OUT=/vm/out VM_SHARED=/vm/shared VM_ROOT=%q HOME=/root LC_ALL=C\n' \
        "$name" "$VM_ROOT"
    echo 'export PATH=/vm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    printf 'cd / && exec /bin/bash %q' "$VM_ROOT/tests/vm/guest.sh"
    printf ' %q' "$@"
    echo
}

# vm__running: how many VMs run now.
vm__running() {
    local n=0 name
    for name in "${!VM_PID[@]}"; do kill -0 "${VM_PID[$name]}" 2>/dev/null && n=$((n + 1)); done
    echo "$n"
}

# vm_start NAME SCRIPT [ARG...]: boots VM NAME (2 to 3 s to its init, TCG) in the background;
# it runs SCRIPT (a host path; the VM sees the host's files) with ARGs, and powers off.
vm_start() {
    local name=$1 script dir setpriv=()
    script=$(realpath "$2") || { VM_ERROR="VM $name: no script $2"; return 1; }
    shift 2
    [ -n "$VM_INITRD" ] || { VM_ERROR="VM $name: vm_setup has not run"; return 1; }
    [ -z "${VM_PID[$name]:-}" ] || { VM_ERROR="VM $name: already started"; return 1; }
    [ "$(vm__running)" -lt "${VM_MAX:-2}" ] ||
        { VM_ERROR="VM $name: ${VM_MAX:-2} VMs run already (VM_MAX)"; return 1; }
    dir=$VM_TMP/vm-$name
    rm -rf "$dir" "$VM_TMP/shared/$name.status"
    mkdir -p "$dir/out" "$VM_TMP/shared"
    vm__run_script "$name" "$script" "$@" >"$dir/out/run.sh"
    echo "booting (kernel, initramfs, 9p mounts: see $dir/console.log)" >"$dir/out/step"
    ln -sfn "vm-$name/out/stderr" "$VM_TMP/vm-$name.log"
    # QEMU dies with this shell even when that is killed outright (no trap runs then).
    setpriv --help 2>&1 | grep -q pdeathsig && setpriv=(setpriv --pdeathsig KILL)
    # shellcheck disable=SC2086  # VM_NET holds QEMU options, one word each
    "${setpriv[@]}" qemu-system-x86_64 -name "splitnet-$name" \
        -accel tcg,thread=multi -cpu max -M q35 -smp "${VM_SMP:-1}" -m "${VM_MEM:-1024}" \
        -nographic -no-reboot -nic none \
        -kernel "$VM_VMLINUZ" -initrd "$VM_INITRD" \
        -append "console=ttyS0 quiet panic=-1 mitigations=off vm.name=$name vm.modules=$VM_MODULES" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$dir/out,mount_tag=vmout,security_model=none" \
        -virtfs "local,path=$VM_TMP/shared,mount_tag=vmshared,security_model=none" \
        ${VM_NET[$name]:-} </dev/null >"$dir/console.log" 2>&1 &
    VM_PID[$name]=$!
    VM_START[$name]=$SECONDS
}

# vm__doing NAME: the VM's last step (vm_step in its script, or init's), for messages.
vm__doing() { cat "$(vm_out "$1")/step" 2>/dev/null || echo "unknown"; }

# vm__tail NAME FILE: FILE's last 15 lines (terminal escapes and blank lines dropped),
# introduced, for messages. The script's stderr only when no tests/lib.sh is there: its fail
# shows that already ($T/vm-NAME.log).
vm__tail() {
    [ -s "$VM_TMP/vm-$1/$2" ] || return 0
    [ "$2" != out/stderr ] || [ "$VM_OWN_TMP" = 1 ] || return 0
    printf '\n--- VM %s: %s (last 15 lines)\n%s' "$1" "$2" \
        "$(sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g; s/\r//g; /^[[:space:]]*$/d' "$VM_TMP/vm-$1/$2" | tail -n 15)"
}

# vm__why NAME: the script's own last word on its failure (guest.sh's vm_die), if any.
vm__why() {
    local why
    why=$(grep -a '^FAIL in VM' "$(vm_out "$1")/stderr" 2>/dev/null | tail -n 1)
    [ -z "$why" ] || printf '\n%s' "$why"
}

# vm__kill NAME: ends VM NAME's QEMU (TERM, then KILL after 3 s).
vm__kill() {
    local pid=${VM_PID[$1]:-}
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    unset "VM_PID[$1]"
}

# vm_wait NAME: waits for VM NAME to power off and returns its script's exit status. A VM
# still running VM_TIMEOUT seconds after its start is killed (124); one whose QEMU ended
# without a status (kernel panic, init failure) gives 125. VM_ELAPSED[NAME]: its seconds.
vm_wait() {
    local name=$1 pid qrc rc
    pid=${VM_PID[$name]:-}
    [ -n "$pid" ] || { VM_ERROR="VM $name: not running (vm_start first)"; return 1; }
    while kill -0 "$pid" 2>/dev/null; do
        if [ $((SECONDS - VM_START[$name])) -ge "$VM_TIMEOUT" ]; then
            vm__kill "$name"
            VM_ERROR="VM $name: hung, killed after $VM_TIMEOUT s (VM_TIMEOUT) while: $(vm__doing "$name")"
            VM_ERROR+="$(vm__tail "$name" out/stderr)$(vm__tail "$name" console.log)"
            return 124
        fi
        sleep 0.5
    done
    wait "$pid"
    qrc=$?
    unset "VM_PID[$name]"
    VM_ELAPSED[$name]=$((SECONDS - VM_START[$name]))
    if [ ! -s "$(vm_out "$name")/status" ]; then
        VM_ERROR="VM $name: QEMU ended (status $qrc) before its script did, while: $(vm__doing "$name")"
        VM_ERROR+="$(vm__tail "$name" console.log)"
        return 125
    fi
    rc=$(cat "$(vm_out "$name")/status")
    [ "$rc" = 0 ] ||
        VM_ERROR="VM $name: its script exited $rc while: $(vm__doing "$name")$(vm__why "$name")$(vm__tail "$name" out/stderr)"
    return "$rc"
}

# vm_wait_all NAME...: waits for these VMs (each as vm_wait) and returns at the first that
# fails, with its status and VM_ERROR (the others run on: vm_stop_all or the exit trap ends
# them); 0 once every one has exited 0.
vm_wait_all() {
    local name left=("$@") next
    while [ ${#left[@]} -gt 0 ]; do
        next=()
        for name in "${left[@]}"; do
            if kill -0 "${VM_PID[$name]:-0}" 2>/dev/null &&
                [ $((SECONDS - ${VM_START[$name]:-0})) -lt "$VM_TIMEOUT" ]; then
                next+=("$name")
            else
                vm_wait "$name" || return
            fi
        done
        left=("${next[@]}")
        [ ${#left[@]} -eq 0 ] || sleep 0.5
    done
}

# vm_boot NAME SCRIPT [ARG...]: runs one VM to its end; its script's exit status.
vm_boot() { vm_start "$@" && vm_wait "$1"; }

# ---------------------------------------------------------------------------------------------
# Cleanup

# vm_stop_all: kills every VM still running.
vm_stop_all() {
    local name
    for name in "${!VM_PID[@]}"; do vm__kill "$name"; done
}

# vm__exit_trap: on exit, the VMs go first, then this file's temporary directory (if it made
# one), then the caller's own trap (tests/lib.sh's cleanup), which sees the exit status
# unchanged.
vm__exit_trap() {
    local rc=$?
    trap '' TERM INT
    vm_stop_all
    if [ "$VM_OWN_TMP" = 1 ]; then
        if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "VM logs kept in $VM_TMP" >&2; else rm -rf "$VM_TMP"; fi
    fi
    if [ -n "$VM_PREV_TRAP" ]; then
        (exit "$rc")
        eval "$VM_PREV_TRAP"
    fi
    exit "$rc"
}
VM_PREV_TRAP=$(trap -p EXIT)
VM_PREV_TRAP=${VM_PREV_TRAP#trap -- \'}
VM_PREV_TRAP=${VM_PREV_TRAP%\' EXIT}
trap vm__exit_trap EXIT
