#!/usr/bin/env python3
"""Moves one file over one TCP connection and prints what moved, for checks in the VMs.

    tcpfile.py listen PORT send|recv FILE [TIMEOUT]     one connection, then exits
    tcpfile.py connect ADDR PORT send|recv FILE [TIMEOUT]

The sender writes FILE and half-closes; the receiver reads to end of stream into FILE, then
closes, so the sender ends only once everything arrived. Both print one line,
`bytes=N sha256=HEX seconds=S`, and exit 0; any error (or TIMEOUT seconds, default 300, of
silence) exits 1 with a message. busybox nc is not enough: it exits as soon as either side
half-closes, and may cut the transfer short.
"""
import hashlib
import socket
import sys
import time


def send(sock, path):
    digest, total = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(65536):
            sock.sendall(chunk)
            digest.update(chunk)
            total += len(chunk)
    sock.shutdown(socket.SHUT_WR)
    # Wait for the receiver's close: it has everything then.
    while sock.recv(65536):
        pass
    return total, digest.hexdigest()


def recv(sock, path):
    digest, total = hashlib.sha256(), 0
    with open(path, "wb") as f:
        while chunk := sock.recv(65536):
            f.write(chunk)
            digest.update(chunk)
            total += len(chunk)
    return total, digest.hexdigest()


def main(argv):
    if len(argv) >= 5 and argv[1] == "listen":
        _, _, port, direction, path, *rest = argv
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", int(port)))
        srv.listen(1)
        srv.settimeout(float(rest[0]) if rest else 300)
        sock, _ = srv.accept()
        srv.close()
    elif len(argv) >= 6 and argv[1] == "connect":
        _, _, addr, port, direction, path, *rest = argv
        sock = socket.create_connection((addr, int(port)), timeout=float(rest[0]) if rest else 300)
    else:
        sys.exit(__doc__)
    sock.settimeout(float(rest[0]) if rest else 300)
    start = time.monotonic()
    if direction == "send":
        total, hexdigest = send(sock, path)
    elif direction == "recv":
        total, hexdigest = recv(sock, path)
    else:
        sys.exit("direction must be send or recv, not %r" % direction)
    sock.close()
    print("bytes=%d sha256=%s seconds=%.2f" % (total, hexdigest, time.monotonic() - start))


if __name__ == "__main__":
    try:
        main(sys.argv)
    except (OSError, ValueError) as e:
        sys.exit("tcpfile.py: %s" % e)
