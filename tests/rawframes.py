#!/usr/bin/env python3
"""Raw Ethernet frames for the tests, with VLAN tags the kernel has no device for.

  rawframes.py send IFACE HEX...          sends each frame (hex) on IFACE as it is
  rawframes.py recv IFACE OUTFILE SECONDS  writes every frame received on IFACE whose
                                           ethertype (after any VLAN tags) is 0x88b5, as hex,
                                           one per line, for SECONDS; "ready" on stdout once
                                           listening

The kernel takes the outermost VLAN tag out of a received frame and reports it in
PACKET_AUXDATA (this kernel has no VLAN devices to hand it to); `recv` puts it back, with
the TPID the kernel reports, so OUTFILE holds frames as they were on the wire.
"""
import socket
import struct
import sys
import time

SOL_PACKET = 263
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6
ETH_P_ALL = 0x0003
TEST_ETHERTYPE = 0x88B5
TAGS = (0x8100, 0x88A8)


def inner_ethertype(frame):
    at = 12
    while len(frame) >= at + 2 and struct.unpack_from("!H", frame, at)[0] in TAGS:
        at += 4
    return struct.unpack_from("!H", frame, at)[0] if len(frame) >= at + 2 else None


def recv(iface, out, seconds):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    s.bind((iface, ETH_P_ALL))
    s.settimeout(0.1)
    print("ready", flush=True)
    end = time.monotonic() + seconds
    with open(out, "w") as f:
        while time.monotonic() < end:
            try:
                data, anc, _flags, addr = s.recvmsg(65536, socket.CMSG_SPACE(20))
            except socket.timeout:
                continue
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            for level, kind, aux in anc:
                if level != SOL_PACKET or kind != PACKET_AUXDATA or len(aux) < 20:
                    continue
                status, _len, _snap, _mac, _net, tci, tpid = struct.unpack_from("=IIIHHHH", aux)
                if status & TP_STATUS_VLAN_VALID:
                    if not status & TP_STATUS_VLAN_TPID_VALID:
                        tpid = 0x8100
                    data = data[:12] + struct.pack("!HH", tpid, tci) + data[12:]
            if inner_ethertype(data) == TEST_ETHERTYPE:
                f.write(data.hex() + "\n")
                f.flush()


def send(iface, frames):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    for h in frames:
        s.send(bytes.fromhex(h))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "send":
        send(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 5 and sys.argv[1] == "recv":
        recv(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(__doc__)
