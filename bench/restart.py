#!/usr/bin/env python3
"""How long an IOC restart cuts its host off, seen from the LAN: the longest gap between the
replies to a ping every 10 ms from the LAN peer to sd0, across each way of restarting, median
and worst of N runs, all in one invocation (so only the ratios between them count):

- kill -9, and a new ioc-driver started at once (a crash, restarted by hand);
- SIGTERM, wait for the exit, start again (what `systemctl restart` did before the store);
- the same with the listening sockets in the service manager's descriptor store
  (tests/fdstore.py standing in for systemd), the IOC saying Goodbye Restarting;
- `splitnetctl upgrade` under the same stand-in: the running IOC starts the binary again,
  hands it its sockets, and says Goodbye Restarting once the new process is ready.

    sudo bench/restart.py [--runs 5]

Needs root, iputils-ping, iproute2, and `cargo build --release` done.
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the reference topology and the daemons' configurations)

STORE = "/tmp/sd-bench-store"


def gap_ms(out):
    """The longest gap between replies in `ping -D` output, and the duplicates."""
    t = [float(m) for m in re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from", out, re.M)]
    dups = out.count("DUP!")
    if len(t) < 2:
        return None, dups
    return max(b - a for a, b in zip(t, t[1:])) * 1000, dups


def ioc_cmd():
    return (f"ip netns exec sd-ioc {run.BIN}/ioc-driver --config {run.ioc_config()}"
            " --control-socket /tmp/sd-bench-ioc.sock")


def readies():
    """How many times the IOC under the store's stand-in said READY."""
    try:
        with open(os.path.join(STORE, "events")) as f:
            return sum(1 for line in f if line.startswith("ready "))
    except FileNotFoundError:
        return 0


class Ioc:
    """The IOC, run plainly or under the descriptor store's stand-in (`kept`)."""

    def __init__(self, kept):
        self.kept = kept
        self.start()

    def start(self):
        if self.kept:
            os.makedirs(STORE, exist_ok=True)
            open(os.path.join(STORE, "events"), "w").close()
            store = os.path.join(run.ROOT, "tests", "fdstore.py")
            self.p = run.bg(f"exec python3 {store} {STORE} -- {ioc_cmd()}", "/tmp/sd-bench-ioc.log")
            self.wait(lambda: readies() >= 1)
        else:
            self.p = run.bg("exec " + ioc_cmd(), "/tmp/sd-bench-ioc.log")
            self.wait(lambda: "7400" in run.sh("ip netns exec sd-ioc ss -Hltn 'sport = :7400'",
                                               check=False))

    def wait(self, ok, secs=10):
        end = time.time() + secs
        while time.time() < end:
            if ok():
                return
            time.sleep(0.01)
        raise RuntimeError("the IOC did not come up")

    def restart(self, how):
        if how == "upgrade":
            run.sh(f"{run.BIN}/splitnetctl -s /tmp/sd-bench-ioc.sock upgrade")
            return
        if how == "kept":
            before = readies()
            self.p.send_signal(signal.SIGUSR1)
            self.wait(lambda: readies() > before)
            return
        self.p.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        self.p.wait()
        self.start()


def one(ioc, how):
    ping = subprocess.Popen("ip netns exec sd-lan ping -D -i 0.01 -w 4 -W 1 10.50.0.1",
                            shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.5)
    ioc.restart(how)
    out, _ = ping.communicate()
    return gap_ms(out)


def measure(runs):
    """Each way's label, gaps (ms) and duplicated replies over `runs` restarts."""
    ways = [("kill", "kill -9, a new one at once"),
            ("term", "SIGTERM, wait, start (no store)"),
            ("kept", "SIGTERM, wait, start, sockets kept"),
            ("upgrade", "splitnetctl upgrade (hand-over)")]
    results = {}
    try:
        for how, label in ways:
            run.base(1)
            ioc = Ioc(kept=how in ("kept", "upgrade"))
            run.bg(f"CREDENTIALS_DIRECTORY={run.KEYS}/host1 ip netns exec sd-host {run.BIN}/host-driver"
                   f" --config {run.host_config(1)} --control-socket /tmp/sd-bench-host1.sock",
                   "/tmp/sd-bench-host1.log")
            for _ in range(100):
                if run.sh("ip -n sd-host link show sd0", check=False):
                    break
                time.sleep(0.05)
            run.sh("ip -n sd-host addr add 10.50.0.1/24 dev sd0; ip -n sd-host link set sd0 up")
            run.wait_carrier("sd-host")
            run.sh("ip netns exec sd-lan ping -c 3 -i 0.2 -W 1 10.50.0.1")
            gaps, dups = [], 0
            for _ in range(runs):
                g, d = one(ioc, how)
                dups += d
                if g is None:
                    raise RuntimeError(f"{label}: no replies")
                gaps.append(g)
                time.sleep(1)
            results[how] = (label, gaps, dups)
            run.cleanup()
    finally:
        run.cleanup()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    results = measure(a.runs)
    base = statistics.median(results["kill"][1])
    print(f"\nIOC restart gap (ping every 10 ms from the LAN to sd0; {a.runs} runs each)")
    print(f"{'way':<38} {'median ms':>10} {'worst ms':>9} {'x kill -9':>10} {'dups':>5}")
    for how, (label, gaps, dups) in results.items():
        med = statistics.median(gaps)
        print(f"{label:<38} {med:>10.0f} {max(gaps):>9.0f} {med / base:>10.2f} {dups:>5}")


if __name__ == "__main__":
    main()
