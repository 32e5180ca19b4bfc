#!/usr/bin/env bash
# The workspace's rust-version is the true minimum: every crate declares it (inherits the
# workspace's key, which clippy's incompatible_msrv lint then holds the code to), and no
# crate the lock file resolves (dependencies, dev-dependencies) needs a newer Rust.
set -u
cd "$(dirname "$0")/.." || exit 1
cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
d = json.load(sys.stdin)
ver = lambda v: tuple(int(x) for x in (v or "0").split("."))
show = lambda t: ".".join(map(str, t))
members = set(d["workspace_members"])
ids = {n["id"] for n in d["resolve"]["nodes"]}
pkgs = {p["id"]: p for p in d["packages"]}
bad = []
declared = {pkgs[m]["name"]: pkgs[m].get("rust_version") for m in members}
for name, rv in sorted(declared.items()):
    if not rv:
        bad.append(f"{name} declares no rust-version (rust-version.workspace = true)")
msrv = min((ver(v) for v in declared.values() if v), default=(0,))
need = max((ver(pkgs[i].get("rust_version")), pkgs[i]["name"] + " " + pkgs[i]["version"])
           for i in ids if i not in members)
if need[0] > msrv:
    bad.append("%s needs Rust %s, above the declared %s" % (need[1], show(need[0]), show(msrv)))
for b in bad:
    print("FAIL:", b)
if bad:
    sys.exit(1)
print("rust-version %s declared by %d crates; the newest any locked crate needs: %s (%s)"
      % (show(msrv), len(declared), show(need[0]), need[1]))
'
