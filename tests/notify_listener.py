#!/usr/bin/env python3
"""A NOTIFY_SOCKET for the tests: binds a unix datagram socket and prints every message it
receives (one per line, newlines inside a message shown as '|') until killed."""
import socket
import sys

s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
while True:
    msg = s.recv(4096).decode(errors="replace")
    print(msg.replace("\n", "|"), flush=True)
