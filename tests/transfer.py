#!/usr/bin/env python3
"""A TCP transfer whose bytes are checked end to end, paced to last a while (across a restart).

    tests/transfer.py recv PORT OUT          # listens, writes "BYTES SHA256" to OUT at the end
    tests/transfer.py send ADDR PORT SECONDS MBYTES   # sends MBYTES of seeded random bytes
                                                      # over SECONDS; prints "BYTES SHA256"
"""
import hashlib
import random
import socket
import sys
import time

if sys.argv[1] == "recv":
    port, out = int(sys.argv[2]), sys.argv[3]
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    c, _ = s.accept()
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        h.update(b)
        n += len(b)
    open(out, "w").write(f"{n} {h.hexdigest()}\n")
else:
    addr, port, secs, mb = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(42)
    chunk, total = 1 << 16, mb << 20
    c = socket.create_connection((addr, port), timeout=30)
    h, sent, start = hashlib.sha256(), 0, time.monotonic()
    while sent < total:
        b = rng.randbytes(min(chunk, total - sent))
        c.sendall(b)
        h.update(b)
        sent += len(b)
        # Paced: no further ahead than the share of SECONDS gone by.
        ahead = start + secs * sent / total - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    c.shutdown(socket.SHUT_WR)
    c.recv(1)
    c.close()
    print(f"{sent} {h.hexdigest()}")
