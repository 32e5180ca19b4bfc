#!/usr/bin/env bash
# What the two commands of README.md (tests/demo.sh, tests/run-all.sh) need, installed when it
# is missing, so that they work on a fresh Debian machine from a root shell or with sudo.
#
# Sourced by both; also runs on its own: `tests/setup.sh demo|all` (as root, or it re-runs
# itself with sudo) installs what that command needs and exits.
#
#   reexec_as_root SCRIPT ARGS...  as root: returns. Otherwise re-runs SCRIPT with sudo (the
#                                  build still runs as the calling user: tests/cargo.sh), or
#                                  fails naming what to do when sudo is not installed.
#   setup_tools demo|all           installs the missing Debian packages (apt-get) and, for
#                                  `all`, the cargo tools (cargo install --locked) and rustup
#                                  components; fails naming what it could not install.
#
# Rust itself (rustup: a stable toolchain at least as new as the workspace's rust-version)
# is the one thing it does not install. SETUP_NO_INSTALL=1 only checks.

# TOOL:PACKAGE pairs: the command whose absence means the Debian package is missing (or a
# file, a glob starting with /). cmake and clang build rdma-core's shim (the verbs transport);
# ibverbs-providers has Soft-RoCE's user-space driver and librdmacm1 the RDMA connection
# manager, which the VMs of e2e 50 load. Open vSwitch and OVN run in the tests' own
# namespaces on files of their own (tests/lib.sh ovs_up), never as the machine's services.
SETUP_DEMO_PKGS=(ip:iproute2 ss:iproute2 ping:iputils-ping iperf3:iperf3 python3:python3
    pgrep:procps timeout:coreutils cc:gcc flock:util-linux cmake:cmake clang:clang)
SETUP_ALL_PKGS=("${SETUP_DEMO_PKGS[@]}" dnsmasq:dnsmasq-base dhclient:isc-dhcp-client
    ethtool:ethtool systemd-analyze:systemd shellcheck:shellcheck tshark:tshark
    mmdebstrap:mmdebstrap systemd-nspawn:systemd-container runuser:util-linux
    nsenter:util-linux setpriv:util-linux findmnt:util-linux dpkg-deb:dpkg c++:g++
    qemu-system-x86_64:qemu-system-x86 busybox:busybox-static
    ovs-vswitchd:openvswitch-switch ovs-ofctl:openvswitch-common ovn-northd:ovn-central
    ovn-controller:ovn-host
    '/usr/lib/*/libibverbs/librxe-*.so:ibverbs-providers' '/usr/lib/*/librdmacm.so.1:librdmacm1')

reexec_as_root() {
    [ "$(id -u)" = 0 ] && return 0
    if ! command -v sudo >/dev/null 2>&1; then
        echo "FAIL: $1 needs root (network namespaces, TAP, AF_PACKET) and sudo is not" \
            "installed: run it from a root shell" >&2
        exit 1
    fi
    echo "not root: running $1 again with sudo" >&2
    exec sudo --preserve-env=CARGO_HOME,RUSTUP_HOME,CARGO_TARGET_DIR,SPLITNET_BIN,FUZZ_SECONDS,SOAK_SECONDS,KEEP_LOGS,VERBOSE,CI,SETUP_NO_INSTALL "$@"
}

# setup_missing_pkgs PAIR...: the packages of the pairs whose tool is not on PATH (unique).
setup_missing_pkgs() {
    local pair
    for pair in "$@"; do
        case $pair in
            /*) compgen -G "${pair%%:*}" >/dev/null || echo "${pair#*:}" ;;
            *) command -v "${pair%%:*}" >/dev/null 2>&1 || echo "${pair#*:}" ;;
        esac
    done | sort -u
}

# setup_tools demo|all
setup_tools() {
    local which=${1:-all} pkgs=() missing
    if [ "$which" = all ]; then
        mapfile -t pkgs < <(setup_missing_pkgs "${SETUP_ALL_PKGS[@]}")
    else
        mapfile -t pkgs < <(setup_missing_pkgs "${SETUP_DEMO_PKGS[@]}")
    fi
    if [ ${#pkgs[@]} -gt 0 ]; then
        if [ "${SETUP_NO_INSTALL:-0}" = 1 ] || ! command -v apt-get >/dev/null 2>&1; then
            echo "FAIL: missing Debian packages: ${pkgs[*]} (apt-get install them)" >&2
            return 1
        fi
        echo "setup: installing ${pkgs[*]} (apt-get)"
        # Another apt run (unattended upgrades, a parallel set-up) holds the lock: wait.
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
                --no-install-recommends "${pkgs[@]}" >/dev/null ||
            { echo "FAIL: apt-get install ${pkgs[*]} failed" >&2; return 1; }
        missing=$(setup_missing_pkgs "${SETUP_ALL_PKGS[@]}" | grep -Fx -f <(printf '%s\n' "${pkgs[@]}"))
        [ -z "$missing" ] || { echo "FAIL: installed, yet still missing: $missing" >&2; return 1; }
    fi
    [ "$which" = all ] || return 0
    setup_cargo_tools
}

# setup_cargo_tools: rustfmt and clippy (rustup components), cargo-fuzz and cargo-deb
# (cargo install --locked), as the user who builds (tests/cargo.sh's as_user).
setup_cargo_tools() {
    local c
    as_user sh -c 'command -v cargo' >/dev/null 2>&1 || {
        echo "FAIL: cargo not found: install Rust with rustup (https://rustup.rs)" >&2
        return 1
    }
    for c in rustfmt clippy; do
        as_user cargo "$([ "$c" = rustfmt ] && echo fmt || echo clippy)" --version >/dev/null 2>&1 && continue
        [ "${SETUP_NO_INSTALL:-0}" = 1 ] && { echo "FAIL: missing rustup component $c" >&2; return 1; }
        echo "setup: rustup component add $c"
        as_user rustup component add "$c" >/dev/null || { echo "FAIL: rustup component add $c" >&2; return 1; }
    done
    for c in fuzz deb; do
        as_user cargo "$c" --version >/dev/null 2>&1 && continue
        [ "${SETUP_NO_INSTALL:-0}" = 1 ] && { echo "FAIL: missing cargo-$c (cargo install --locked cargo-$c)" >&2; return 1; }
        echo "setup: cargo install --locked cargo-$c"
        as_user cargo install --locked --quiet "cargo-$c" || { echo "FAIL: cargo install --locked cargo-$c" >&2; return 1; }
    done
}

# On its own: tests/setup.sh demo|all.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -u
    case ${1:-} in demo | all) ;; *) echo "usage: $0 demo|all" >&2; exit 2 ;; esac
    reexec_as_root "$0" "$@"
    cd "$(dirname "$0")/.." || exit 1
    . tests/cargo.sh
    setup_tools "$1"
fi
