#!/usr/bin/env python3
"""How long losing its IOC cuts a host with a standby off, beside what a restart of its only
IOC costs, seen from the LAN in one invocation (only the ratios between them count): the
longest gap between the replies to a ping every 10 ms from the LAN peer to sd0, median and
worst of N runs.

- the moves to a standby IOC (fabric.standby) beside a 20 s TCP upload from the host:
  `kill -9` of the active IOC, its fabric port set down (found by the agreed liveness), its
  NIC set down (LinkChange); each run is one pass of tests/e2e/46-standby.sh, which also
  checks the transfer's SHA-256 and that no reply is duplicated;
- the restarts of a host's only IOC (bench/restart.py, ping alone): kill -9 and a new one at
  once, SIGTERM and start (no descriptor store), the same with the sockets kept, and
  `splitnetctl upgrade`.

    sudo bench/failover.py [--runs 3]

Needs root, iputils-ping, iproute2, python3, and `cargo build --release` done.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import restart  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GAPS = re.compile(r"longest gap between replies: kill -9 (\d+) ms, fabric port down (\d+) ms, "
                  r"NIC down (\d+) ms")
MOVES = [("kill -9 of the active IOC, standby", 0),
         ("its fabric port down, standby", 1),
         ("its NIC down, standby", 2)]


def moves(runs):
    """The three moves' gaps (ms) in each of `runs` passes of e2e 46."""
    gaps = [[] for _ in MOVES]
    for i in range(runs):
        p = subprocess.run([os.path.join(ROOT, "tests", "e2e", "46-standby.sh")],
                           capture_output=True, text=True)
        m = GAPS.search(p.stdout)
        if p.returncode != 0 or not m:
            sys.exit(f"run {i + 1} of tests/e2e/46-standby.sh failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        for g, v in zip(gaps, m.groups()):
            g.append(float(v))
        print(f"  standby run {i + 1}: {' / '.join(m.groups())} ms", flush=True)
    return gaps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    moved = moves(a.runs)
    restarted = restart.measure(a.runs)
    rows = [(label, moved[i], 0) for label, i in MOVES]
    rows += [(label + ", only IOC", gaps, dups) for label, gaps, dups in restarted.values()]
    base = statistics.median(restarted["kill"][1])
    print(f"\nLongest gap between replies to a ping every 10 ms from the LAN to sd0 ({a.runs} runs each)")
    print(f"{'way':<50} {'median ms':>10} {'worst ms':>9} {'x restart kill -9':>18} {'dups':>5}")
    for label, gaps, dups in rows:
        med = statistics.median(gaps)
        print(f"{label:<50} {med:>10.0f} {max(gaps):>9.0f} {med / base:>18.2f} {dups:>5}")


if __name__ == "__main__":
    main()
