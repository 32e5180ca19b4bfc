#!/usr/bin/env bash
# Verifies the systemd units with systemd-analyze (ExecStart pointed at the built binaries)
# and prints their exposure scores.
set -u
cd "$(dirname "$0")/.."
command -v systemd-analyze >/dev/null || { echo "missing systemd-analyze (apt install systemd)"; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
rc=0
for u in host-driver ioc-driver; do
    [ -x "target/release/$u" ] || { echo "target/release/$u not built"; exit 1; }
    sed "s|/usr/bin/$u|$PWD/target/release/$u|" "systemd/$u.service" >"$d/$u.service"
    if out=$(systemd-analyze verify "$d/$u.service" 2>&1) && [ -z "$out" ]; then
        echo "$u.service: verify ok"
    else
        echo "$u.service: verify reported:"; echo "$out"; rc=1
    fi
    score=$(systemd-analyze security --offline=true "systemd/$u.service" 2>/dev/null | grep -o 'exposure level.*' )
    echo "$u.service: $score"
done
exit $rc
