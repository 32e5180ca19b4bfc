#!/usr/bin/env bash
# The one test command (README, .ci/run): formatting, lints, unit/property/integration tests,
# the release build, the systemd units, bounded fuzzing, then every end-to-end test in
# tests/e2e/ in order (root: network namespaces). Prints PASS/FAIL per step and a summary;
# exits non-zero if anything failed. Nothing is skipped: a missing tool or missing root is a
# FAIL that names what is missing.
# It needs root: from a root shell it runs as it is; otherwise it runs itself again with sudo.
# Its first step installs what is missing (tests/setup.sh: Debian packages with apt-get,
# cargo-fuzz and cargo-deb with cargo install --locked, rustfmt and clippy with rustup).
#   FUZZ_SECONDS (default 10): fuzzing time per target.  SOAK_SECONDS (default 600): soak test.
set -u
SELF=$(readlink -f "$0")
. "$(dirname "$SELF")/setup.sh"
reexec_as_root "$SELF" "$@"
cd "$(dirname "$SELF")/.." || exit 1
. tests/cargo.sh
failed=()
summary=()
step() {
    local name=$1 start=$SECONDS r
    shift
    echo "== $name"
    if "$@"; then r=PASS; else r=FAIL; failed+=("$name"); fi
    summary+=("$(printf '%s  %-44s %4ss' "$r" "$name" $((SECONDS - start)))")
    echo "$r: $name"
}
need_cargo || failed+=("cargo")
step "set-up (tests/setup.sh all)" setup_tools all
step "cargo fmt --all -- --check" as_user cargo fmt --all -- --check
step "cargo clippy -D warnings" as_user cargo clippy --workspace --all-targets -- -D warnings
step "cargo test --workspace" as_user cargo test --workspace
# The tests that need root (#[ignore = "needs root"], each in a module named needs_root; the
# other ignored tests need an RDMA device or measure, and are not run here): their binaries
# built as the user, as above, then run as root, so nothing in target/ becomes root's. A test
# that cannot get what it needs fails; none found is a failure too.
root_tests() {
    local bins dir exe out n ran=0
    bins=$(set -o pipefail; as_user cargo test --workspace --no-run --message-format=json | python3 -c 'import json, os, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(os.path.dirname(m["manifest_path"]), m["executable"], sep="\t")') ||
        { echo "FAIL: cargo test --workspace --no-run"; return 1; }
    while IFS=$'\t' read -r dir exe; do
        # As cargo test runs it: in its package's directory.
        out=$(cd "$dir" && "$exe" --ignored needs_root:: 2>&1) ||
            { echo "$out"; echo "FAIL: ${exe##*/} --ignored needs_root::"; return 1; }
        n=$(sed -n 's/^running \([0-9]*\) tests\{0,1\}$/\1/p' <<<"$out" | head -n 1)
        [ "${n:-0}" -gt 0 ] || continue
        echo "${exe##*/}: $(grep '^test result' <<<"$out")"
        ran=$((ran + n))
    done <<<"$bins"
    [ "$ran" -gt 0 ] || { echo "FAIL: no test in a needs_root module (#[ignore = \"needs root\"])"; return 1; }
    echo "$ran tests that need root passed"
}
step "cargo test (needs root)" root_tests
step "cargo build --release" as_user cargo build --release --workspace --bins --examples
# The tests find the daemons here (CI may put the target directory elsewhere).
SPLITNET_BIN=${SPLITNET_BIN:-$(release_dir)}
export SPLITNET_BIN
echo "daemons: $SPLITNET_BIN"
# The Debian package of the release build (target/debian/splitnet_*.deb, next to the release
# directory), which e2e 22-machines installs on two systemd machines.
deb_package() {
    as_user cargo deb --version >/dev/null 2>&1 ||
        { echo "FAIL: cargo-deb is not installed: cargo install --locked cargo-deb (.ci/run does)"; return 1; }
    as_user cargo deb -p host-driver --no-build
}
step "Debian package (cargo deb)" deb_package
step "rust-version (tests/msrv.sh)" as_user tests/msrv.sh
step "systemd units (tests/units.sh)" tests/units.sh
step "shellcheck (tests, hooks, .ci/run)" shellcheck -S warning hooks/* tests/*.sh tests/e2e/*.sh tests/vm/*.sh .ci/run debian/post* debian/pre*
step "fuzz smoke (${FUZZ_SECONDS:-10} s per target)" as_user fuzz/run.sh "${FUZZ_SECONDS:-10}"
# e2e TEST: runs one end-to-end test (20 min at most); a test that leaves a namespace of the
# reference topology behind (killed before its trap ran) fails, and the leftovers are removed so
# the next test can run. Namespaces that existed before the test are not touched.
test_ns() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^sd-(host[0-9]*|ioc[0-9]*|lan[0-9]*|ovn)$'; }
e2e() {
    local before rc=0 left n
    before=$(test_ns)
    timeout --kill-after=10 1200 bash "$1" || rc=1
    left=$(comm -13 <(echo "$before" | sort) <(test_ns | sort))
    if [ -n "$left" ]; then
        echo "FAIL: $1 left namespaces behind: $(echo $left)"
        for n in $left; do ip netns pids "$n" | xargs -r kill -9; ip netns del "$n"; rm -rf "/etc/netns/$n"; done
        rc=1
    fi
    return $rc
}
# Without the lock, the tests are not run: each would wait for it again.
not_run() { echo "FAIL: not run: no end-to-end lock"; return 1; }
. tests/e2e-lock.sh
step "end-to-end lock (tests/e2e-lock.sh)" e2e_lock
for t in tests/e2e/*.sh; do
    if [ -n "${SPLITNET_E2E_LOCKED:-}" ]; then
        step "e2e $(basename "$t" .sh)" e2e "$t"
    else
        step "e2e $(basename "$t" .sh)" not_run
    fi
done
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -eq 0 ]; then
    echo "ALL PASSED (${#summary[@]} steps)"
else
    echo "FAILED (${#failed[@]} of ${#summary[@]}): ${failed[*]}"
    exit 1
fi
