#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 10) each; fails on any crash.
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP lets the stable toolchain provide them.
set -u
cd "$(dirname "$0")" || exit 1
secs=${1:-10}
command -v cargo-fuzz >/dev/null || { echo "missing cargo-fuzz (cargo install cargo-fuzz)"; exit 1; }
export RUSTC_BOOTSTRAP=1
# No sanitizer: everything the targets reach is safe Rust (splitnet-messaging and config deny
# unsafe_code; the syscall crates, netif and fabric's shm, are not reached), so AddressSanitizer
# would find nothing Rust's own checks miss, and it made the endpoint target about 5x slower.
SAN=(-s none)
cargo fuzz build -O "${SAN[@]}" >/dev/null 2>&1 || { echo "fuzz build failed"; cargo fuzz build -O "${SAN[@]}"; exit 1; }
rc=0
for t in $(cargo fuzz list); do
    out=$(cargo fuzz run -O "${SAN[@]}" "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1)
    if [ $? -eq 0 ]; then
        echo "$t: $(echo "$out" | grep -o 'Done [0-9]* runs in [0-9]* second(s)' | tail -1)"
    else
        echo "$t: FAILED"; echo "$out" | tail -n 30; rc=1
    fi
done
exit $rc
