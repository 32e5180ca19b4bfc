#!/usr/bin/env python3
"""Sends UDP datagrams to ADDR:PORT at about MBPS megabits per second for SECONDS.

Used by the end-to-end tests to flood one host from the LAN; prints what it sent.
"""
import socket
import sys
import time

addr, port, mbps, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
size = 1400
payload = b"\x5a" * size
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
per_tick = max(1, int(mbps * 1e6 / 8 / size / 100))  # datagrams per 10 ms
sent = 0
end = time.monotonic() + seconds
tick = time.monotonic()
while time.monotonic() < end:
    for _ in range(per_tick):
        try:
            s.sendto(payload, (addr, port))
            sent += 1
        except OSError:
            pass
    tick += 0.01
    delay = tick - time.monotonic()
    if delay > 0:
        time.sleep(delay)
print(f"sent {sent} datagrams of {size} bytes in {seconds:.0f} s")
