#!/usr/bin/env python3
"""A ping through sd0 split into legs, hop by hop, from capture timestamps.

Sets up bench/run.py's reference topology with splitnet (over TCP, or shared memory with
`--mode splitnet-shm`), captures on every interface a ping crosses (sd0 and fab0 in the host's
namespace, fab1 and lan0 in the IOC's, lan1 in the LAN peer's), pings the LAN peer from the
host, optionally beside an iperf3 transfer (`--load upload|download`, paced with `--rate`),
and finds each echo request and reply in every capture by its ICMP header (type, code,
checksum, identifier, sequence: unique per ping since the payload carries ping's timestamp).
Over the TCP fabric the frames are searched for inside the TCP segments, so the data channel
must be cleartext (bench/run.py's default). All namespaces share one clock, so the
differences between captures are the legs:

    out:  host-driver (sd0 -> fab0), fabric (fab0 -> fab1), IOC (fab1 -> lan0), LAN (lan0 -> lan1)
    peer: the LAN peer's kernel (lan1 request -> lan1 reply)
    back: LAN (lan1 -> lan0), IOC (lan0 -> fab1), fabric (fab1 -> fab0), host-driver (fab0 -> sd0)
    host: ping's round trip less sd0's (the host's stack and ping's wake-up)

Over shared memory there is no fabric to capture: "splitnet" is both daemons together. Prints
the median and p99 of each leg in us and the share of the round trip it takes. Capture
timestamps are the kernel's, in microseconds (dumpcap's pcap); a capture on the fabric under
a full-speed transfer costs the daemons CPU, so the fabric's legs are captured only with
`--load none` unless `--fabric` asks for them (what they cost then is part of the figure).

    sudo bench/legs.py [--mode splitnet|splitnet-shm] [--load none|upload|download]
                       [--rate 2G] [--count 300] [--interval 0.01] [--fabric]
                       [--express] [--rx-queues N]

Needs root, dumpcap (wireshark's, tests/setup.sh installs it), iperf3, iputils-ping, and
`cargo build --release` done.
"""
import argparse
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402  (the topology and daemons of bench/run.py)

CAP = "/tmp/sd-legs"
# Capture points in the order a request crosses them: (name, namespace, interface, fabric?).
POINTS = [("sd0", "sd-host", "sd0", False), ("fab0", "sd-host", "fab0", True),
          ("fab1", "sd-ioc", "fab1", True), ("lan0", "sd-ioc", "lan0", False),
          ("lan1", "sd-lan", "lan1", False)]


def read_pcap(path):
    """(timestamp s, bytes) of every record of a classic pcap file (dumpcap -P): microsecond
    or nanosecond resolution, either byte order. By hand: the format is a 24-byte header and
    16 bytes per record, and Python's standard library has no reader (scapy or dpkt would be
    a dependency for twenty lines)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        return []
    magic = data[:4]
    orders = {b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\xa1\xb2\xc3\xd4": (">", 1e-6),
              b"\x4d\x3c\xb2\xa1": ("<", 1e-9), b"\xa1\xb2\x3c\x4d": (">", 1e-9)}
    if magic not in orders:
        raise RuntimeError(f"{path}: not a pcap file")
    order, unit = orders[magic]
    out, off = [], 24
    while off + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack_from(order + "IIII", data, off)
        off += 16
        out.append((sec + frac * unit, data[off:off + incl]))
        off += incl
    return out


def echoes(frames):
    """The ICMP echo requests and replies among Ethernet frames: {(type, id, seq): (time,
    8-byte ICMP header)}, the first sighting of each."""
    found = {}
    for t, b in frames:
        if len(b) < 14 + 20 + 8 or b[12:14] != b"\x08\x00" or b[14] >> 4 != 4 or b[23] != 1:
            continue
        icmp = 14 + (b[14] & 0xF) * 4
        head = b[icmp:icmp + 8]
        if len(head) < 8 or head[0] not in (0, 8):
            continue
        ident, seq = struct.unpack("!HH", head[4:8])
        found.setdefault((head[0], ident, seq), (t, head))
    return found


def sightings(frames, heads, after):
    """For each ICMP header in `heads` ({key: header}), the time of the first frame at or
    after `after[key]` - 1 ms that holds it anywhere (inside a TCP segment on the fabric)."""
    out = {}
    for key, head in heads.items():
        start = after[key] - 0.001
        for t, b in frames:
            if t >= start and head in b:
                out[key] = t
                break
    return out


def ping_rtts(text):
    """ping's own round trip per sequence number, in s."""
    rtts = {}
    for line in text.splitlines():
        if "icmp_seq=" in line and "time=" in line:
            seq = int(line.split("icmp_seq=")[1].split()[0])
            rtts[seq] = float(line.split("time=")[1].split()[0]) / 1000
    return rtts


def stats(xs):
    """(median, p99) in us of a list of seconds."""
    xs = sorted(x * 1e6 for x in xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("splitnet", "splitnet-shm"), default="splitnet")
    ap.add_argument("--load", choices=("none", "upload", "download"), default="none")
    ap.add_argument("--rate", default=None, help="pace the transfer (iperf3 -b), e.g. 2G")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--interval", type=float, default=0.01)
    ap.add_argument("--fabric", action="store_true",
                    help="capture the fabric under load too (costs the daemons CPU)")
    ap.add_argument("--express", action="store_true",
                    help="the host asks for the express lane (fabric.express = true)")
    ap.add_argument("--rx-queues", type=int, default=None,
                    help="the IOC's lan.rx_queues (default: the shipped ioc.toml's)")
    a = ap.parse_args()
    bench.EXPRESS = a.express
    bench.RX_QUEUES = a.rx_queues
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    for tool in ("dumpcap", "iperf3", "ping", "ip"):
        if not shutil.which(tool):
            sys.exit(f"missing tool: {tool}")
    shm = a.mode == "splitnet-shm"
    fabric = not shm and (a.load == "none" or a.fabric)
    points = [p for p in POINTS if fabric or not p[3]]
    os.makedirs(CAP, exist_ok=True)
    caps, load, srv = [], None, None
    try:
        bench.setup_splitnet(local="shm" if shm else None)
        for name, ns, dev, on_fabric in points:
            path = f"{CAP}/{name}.pcap"
            if os.path.exists(path):
                os.unlink(path)
            filt = "tcp" if on_fabric else "icmp"
            caps.append((name, path, subprocess.Popen(
                ["ip", "netns", "exec", ns, "dumpcap", "-q", "-P", "-i", dev, "-f", filt,
                 "-w", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)))
        time.sleep(1.5)
        secs = int(a.count * a.interval) + 3
        if a.load != "none":
            srv = bench.bg("ip netns exec sd-lan iperf3 -s -1 -p 5398", f"{CAP}/iperf-srv.log")
            time.sleep(0.4)
            pace = f"-b {a.rate}" if a.rate else ""
            rev = "-R" if a.load == "download" else ""
            load = subprocess.Popen(
                f"ip netns exec sd-host iperf3 -c 10.50.0.2 -p 5398 -t {secs} {pace} {rev}",
                shell=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True)
            time.sleep(1)
        out = bench.sh(f"ip netns exec sd-host ping -c {a.count} -i {a.interval} 10.50.0.2",
                       check=False)
        if load:
            load.communicate(timeout=secs + 30)
        time.sleep(0.5)
    finally:
        for _, _, p in caps:
            try:
                os.killpg(p.pid, signal.SIGINT)
                p.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if srv:
            try:
                os.killpg(srv.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        bench.cleanup()

    frames = {name: read_pcap(path) for name, path, _ in caps}
    at_sd0 = echoes(frames["sd0"])
    heads = {k: h for k, (_, h) in at_sd0.items()}
    first = {k: t for k, (t, _) in at_sd0.items()}
    seen = {"sd0": first}
    for name, _, _, on_fabric in points[1:]:
        seen[name] = (sightings(frames[name], heads, first) if on_fabric
                      else {k: t for k, (t, _) in echoes(frames[name]).items()})
    rtts = ping_rtts(out)
    path = [n for n, *_ in points]
    # Each leg: (label, point, its key's type, point, its type): request type 8, reply 0.
    legs = []
    for x, y in zip(path, path[1:]):
        legs.append((f"out  {x} -> {y}", x, 8, y, 8))
    legs.append(("peer lan1 -> lan1", "lan1", 8, "lan1", 0))
    back = path[::-1]
    for x, y in zip(back, back[1:]):
        legs.append((f"back {x} -> {y}", x, 0, y, 0))
    samples = {label: [] for label, *_ in legs}
    samples["host stack and ping"] = []
    complete = 0
    for _, ident, seq in [k for k in heads if k[0] == 8]:
        times = {(n, ty): seen[n].get((ty, ident, seq)) for n in path for ty in (8, 0)}
        if any(v is None for v in times.values()) or seq not in rtts:
            continue
        complete += 1
        for label, x, tx, y, ty in legs:
            samples[label].append(times[(y, ty)] - times[(x, tx)])
        samples["host stack and ping"].append(rtts[seq] - (times[("sd0", 0)] - times[("sd0", 8)]))
    load_text = a.load if a.load == "none" else f"{a.load} at {a.rate or 'full speed'}"
    print(f"== {a.mode}, ping every {a.interval}s x {a.count}, beside: {load_text}; "
          f"{complete} pings seen at every point ({', '.join(path)})")
    if not complete:
        sys.exit("no ping was seen at every capture point")
    total = statistics.median(rtts[s] for s in rtts) * 1e6
    print(f"  ping's round trip: median {total:.0f} us over {len(rtts)} replies")
    print(f"  {'leg':<24} {'median us':>10} {'p99 us':>8} {'share':>6}")
    for label, xs in samples.items():
        med, p99 = stats(xs)
        print(f"  {label:<24} {med:>10.1f} {p99:>8.1f} {med / total:>6.0%}")


if __name__ == "__main__":
    main()
