#!/usr/bin/env bash
# Sourced by run-all.sh and demo.sh: `as_user CMD...` runs a build command as the user who
# called sudo, with that user's Rust toolchain (sudo's secure_path has no ~/.cargo/bin, and a
# root build would leave root-owned files in their target/). As root without sudo, or when the
# checkout is not that user's, it runs the command as it is.
as_user() {
    local home
    if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] &&
        [ "$(stat -c %U .)" = "$SUDO_USER" ] && { [ ! -e target ] || [ "$(stat -c %U target)" = "$SUDO_USER" ]; }; then
        home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
        runuser -u "$SUDO_USER" -- env HOME="$home" PATH="$home/.cargo/bin:$PATH" \
            ${CARGO_HOME:+CARGO_HOME="$CARGO_HOME"} ${RUSTUP_HOME:+RUSTUP_HOME="$RUSTUP_HOME"} \
            ${CARGO_TARGET_DIR:+CARGO_TARGET_DIR="$CARGO_TARGET_DIR"} "$@"
    else
        "$@"
    fi
}

# need_cargo: cargo must be reachable (as the build user); says how when it is not.
need_cargo() {
    as_user sh -c 'command -v cargo' >/dev/null 2>&1 && return 0
    echo "FAIL: cargo not found on PATH${SUDO_USER:+ (of $SUDO_USER)}: install Rust with rustup, or run" \
        "'sudo env PATH=\"\$PATH\" $0' so root sees your toolchain" >&2
    return 1
}

# release_dir: where `cargo build --release` puts the binaries, as cargo itself reports it
# (CARGO_TARGET_DIR, build.target-dir in any cargo config, or ./target).
release_dir() {
    local dir
    dir=$(as_user cargo metadata --no-deps --format-version 1 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null) ||
        dir=
    echo "${dir:-${CARGO_TARGET_DIR:-$PWD/target}}/release"
}
