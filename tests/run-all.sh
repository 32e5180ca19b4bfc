#!/usr/bin/env bash
# The one test command: formatting, lints, unit/property/integration tests, then every
# end-to-end test in network namespaces (root). Exits non-zero if anything failed.
set -u
cd "$(dirname "$0")/.."
failed=()
step() {
    local name=$1; shift
    echo "== $name"
    if "$@"; then echo "PASS: $name"; else echo "FAIL: $name"; failed+=("$name"); fi
}
step "cargo fmt" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
step "cargo test" cargo test --workspace
step "cargo build --release" cargo build --release --workspace --examples
step "systemd units" tests/units.sh
step "fuzz smoke (${FUZZ_SECONDS:-10} s per target)" fuzz/run.sh "${FUZZ_SECONDS:-10}"
for t in tests/e2e/*.sh; do
    step "e2e $(basename "$t" .sh)" timeout 1200 bash "$t"
done
echo
if [ ${#failed[@]} -eq 0 ]; then
    echo "ALL PASSED"
else
    echo "FAILED (${#failed[@]}): ${failed[*]}"
    exit 1
fi
