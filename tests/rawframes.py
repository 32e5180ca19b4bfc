#!/usr/bin/env python3
"""Raw Ethernet frames for the tests, with VLAN tags the kernel has no device for.

  rawframes.py send IFACE HEX...          sends each frame (hex) on IFACE as it is
  rawframes.py recv IFACE OUTFILE SECONDS [MAC,...]
                                           writes every frame received on IFACE whose
                                           ethertype (after any VLAN tags) is 0x88b5, or
                                           whose source is one of the MACs given, as hex,
                                           one per line, for SECONDS; "ready" on stdout once
                                           listening
  rawframes.py kinds FILE                  counts the announcements among FILE's frames:
                                           "garp=N rarp=N na=N igmp=N mld=N" and each
                                           RARP's MAC ("rarp:MAC")

The kernel takes the outermost VLAN tag out of a received frame and reports it in
PACKET_AUXDATA (this kernel has no VLAN devices to hand it to); `recv` puts it back, with
the TPID the kernel reports, so OUTFILE holds frames as they were on the wire.
"""
import ctypes
import socket
import struct
import sys
import time

SOL_PACKET = 263
SO_ATTACH_FILTER = 26
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


def recv(iface, out, seconds, sources=()):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    if sources:
        # Beside a transfer: TCP never reaches the socket (classic BPF), so the reader
        # keeps up and no announcement is lost to a full receive buffer.
        prog = [(0x28, 0, 0, 12), (0x15, 0, 2, 0x0800), (0x30, 0, 0, 23), (0x15, 1, 0, 6),
                (0x06, 0, 0, 0x40000), (0x06, 0, 0, 0)]
        code = b"".join(struct.pack("HBBI", *i) for i in prog)
        buf = ctypes.create_string_buffer(code)
        fprog = struct.pack("HL", len(prog), ctypes.addressof(buf))
        s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
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
            if inner_ethertype(data) == TEST_ETHERTYPE or data[6:12] in sources:
                f.write(data.hex() + "\n")
                f.flush()


def send(iface, frames):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    for h in frames:
        s.send(bytes.fromhex(h))


def kinds(path):
    """What each announcement frame of `path` is, by its headers (no checksum checked here:
    the LAN's bridge checks those of the reports it learns from)."""
    n = {"garp": 0, "rarp": 0, "na": 0, "igmp": 0, "mld": 0}
    rarps = []
    for line in open(path):
        f = bytes.fromhex(line.strip())
        kind = struct.unpack_from("!H", f, 12)[0] if len(f) >= 14 else None
        if kind == 0x0806 and len(f) >= 42 and f[28:32] == f[38:42]:
            n["garp"] += 1
        elif kind == 0x8035 and len(f) >= 42:
            n["rarp"] += 1
            rarps.append(f[32:38].hex(":"))
        elif kind == 0x0800 and len(f) >= 34 and f[23] == 2:
            n["igmp"] += 1
        elif kind == 0x86DD and len(f) >= 62 and f[20] == 58 and f[54] == 136:
            n["na"] += 1
        elif kind == 0x86DD and len(f) >= 63 and f[20] == 0 and f[54] == 58 and f[62] == 143:
            n["mld"] += 1
    print(" ".join(f"{k}={v}" for k, v in n.items()))
    for mac in rarps:
        print(f"rarp:{mac}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "send":
        send(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) in (5, 6) and sys.argv[1] == "recv":
        macs = sys.argv[5].split(",") if len(sys.argv) == 6 else []
        sources = {bytes.fromhex(m.replace(":", "")) for m in macs}
        recv(sys.argv[2], sys.argv[3], float(sys.argv[4]), sources)
    elif len(sys.argv) == 3 and sys.argv[1] == "kinds":
        kinds(sys.argv[2])
    else:
        sys.exit(__doc__)
