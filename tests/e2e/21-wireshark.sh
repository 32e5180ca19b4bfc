#!/usr/bin/env bash
# The Wireshark dissector (tools/wireshark/splitnet.lua) decodes a real fabric capture: tshark
# loads it without error; every message the scenario produces is named (handshake, pools,
# credits, CfgUtil, keepalives, flush, Goodbye, RDMA writes with immediate data and the ICMP
# inside them); no frame is malformed or carries an error; and TCP reassembly works: every byte
# of both connections belongs to exactly one decoded operation, operations spanning segments
# and segments holding several operations included.
# Scenario: capture on fab0, start both daemons, ping v4 (inline SendData) and v6, a 1000-byte
# ping (into a pool element), a 2 s iperf3 capped at 40 Mb/s (bounds the capture), SetMtu 1400,
# promiscuous on, then SIGTERM on host-driver (flush both ways, Goodbye): all of it with the
# plain handshake (open admission, a host without keys), so every control message shows. Then
# the host again with its keys (docs/protocol.md 5.1): AuthHello and AuthReply decode, and its
# control channel's messages show as sealed.
. "$(dirname "$0")/../lib.sh"
need_root
command -v tshark >/dev/null 2>&1 || fail "missing tool: tshark (apt install tshark; it brings dumpcap)"
need_tool ip ping iperf3 python3 ss tshark dumpcap; need_daemons
LUA=$ROOT/tools/wireshark/splitnet.lua
[ -r "$LUA" ] || fail "dissector not found: $LUA"
CAP=$T/fabric.pcapng

# tshark_run OUT ARGS...: tshark with the dissector on the capture, output in OUT; fails on an
# error exit or on anything it prints on stderr (Lua errors included) but its warning for root.
tshark_run() {
    local out=$1 err
    shift
    tshark -n -X "lua_script:$LUA" -r "$CAP" "$@" >"$out" 2>"$T/tshark.err" ||
        fail "tshark $* failed: $(tail -n 5 "$T/tshark.err")"
    err=$(grep -v -e '^Running as user "root"' -e '^$' "$T/tshark.err")
    [ -z "$err" ] || fail "tshark $* reports: $(head -n 5 <<<"$err")"
}

# The script loads and registers its protocol.
tshark -G protocols -X "lua_script:$LUA" >"$T/protocols.txt" 2>"$T/load.err" ||
    fail "tshark -G protocols failed: $(tail -n 5 "$T/load.err")"
err=$(grep -v -e '^Running as user "root"' -e '^$' "$T/load.err")
[ -z "$err" ] || fail "tshark reports loading $LUA: $(head -n 5 <<<"$err")"
grep -q "splitnet" "$T/protocols.txt" || fail "tshark does not list the splitnet protocol"

topo_up 1
# Capture the fabric where the host sees it (64 MB at most); wait until the capture really runs.
ip netns exec sd-host dumpcap -i fab0 -f 'tcp port 7400' -B 64 -a filesize:65536 -w "$CAP" >"$T/capture.log" 2>&1 &
CAP_PID=$!
PIDS+=("$CAP_PID")
for _ in $(seq 100); do
    grep -q "Capturing on" "$T/capture.log" && [ -s "$CAP" ] && break
    kill -0 "$CAP_PID" 2>/dev/null || fail "dumpcap exited at start: $(tail -n 3 "$T/capture.log")"
    sleep 0.05
done
grep -q "Capturing on" "$T/capture.log" || fail "dumpcap did not start capturing within 5 s"

open_admission
KEYED_HOST_CONF=$HOST_CONF
sed 's/^ioc_public_key = /# ioc_public_key = /' "$HOST_CONF" >"$T/host-plain.toml"
start_ioc; HOST_CONF=$T/host-plain.toml start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
ping_ok sd-host fd50::2 -6
ping_ok sd-host 10.50.0.2 -s 1000
rate=$(iperf sd-host 10.50.0.2 5201 -t 2 -b 40M) || fail "iperf3 host -> LAN: $rate"
ip -n sd-host link set sd0 mtu 1400
for _ in $(seq 30); do grep -q "MTU accepted by the IOC mtu=1400" "$T/host1.log" && break; sleep 0.1; done
grep -q "MTU accepted by the IOC mtu=1400" "$T/host1.log" || fail "MTU 1400 not agreed with the IOC"
ip -n sd-host link set sd0 promisc on
for _ in $(seq 30); do grep -q "promiscuous mode changed.*promisc=true" "$T/host1.log" && break; sleep 0.1; done
grep -q "promiscuous mode changed.*promisc=true" "$T/host1.log" || fail "promiscuous mode not passed on"
sleep 0.5 # idle: keepalives both ways
stop_host 1 TERM
[ "$STOP_RC" = 0 ] || fail "host-driver exited $STOP_RC on SIGTERM"
# The same host with its keys: an authenticated handshake, a sealed control channel.
HOST_CONF=$KEYED_HOST_CONF start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
stop_host 1 TERM
[ "$STOP_RC" = 0 ] || fail "host-driver with keys exited $STOP_RC on SIGTERM"
sleep 0.3 # the last ACKs and FINs
kill -TERM "$CAP_PID" 2>/dev/null
wait "$CAP_PID" 2>/dev/null
[ -s "$CAP" ] || fail "no capture written: $(tail -n 3 "$T/capture.log")"
log "capture: $(du -k "$CAP" | cut -f1) KiB, iperf3 ${rate} Gb/s"

# Malformed frames, Lua errors, errors of any dissector (the dissector's own checks included).
tshark_run "$T/bad.txt" -Y '_ws.malformed || _ws.lua.error || _ws.expert.severity == error'
[ -s "$T/bad.txt" ] && fail "malformed or erroneous frames: $(head -n 5 "$T/bad.txt")"
# Every operation (frames inside not dissected: the only TCP fields are the fabric's).
tshark_run "$T/fields.tsv" -o splitnet.frames:FALSE -T fields -E separator=/t -E occurrence=a -E aggregator=, \
    -e frame.number -e tcp.len -e tcp.analysis.retransmission -e tcp.segment.count \
    -e splitnet.op.opcode -e splitnet.op.length -e splitnet.function -e splitnet.cfg.code
# The full decode (PDML: each field with the name and label the dissector gave it) of every frame
# but those holding large writes (iperf3's 64 KiB frames would make it hundreds of MB).
tshark_run "$T/fabric.pdml" -Y 'splitnet && !(splitnet.op.length > 2048) && !tcp.segment.count' -T pdml

python3 - "$T/fields.tsv" "$T/fabric.pdml" >"$T/summary.txt" 2>&1 <<'PY' || fail "decoded capture: $(cat "$T/summary.txt")"
import collections, re, sys
import xml.etree.ElementTree as ET

# What every message of the scenario must show: its name (from the dissector's own tables) and
# the fields of its layout (docs/protocol.md).
S = "splitnet."
HEADER = [S + "function", S + "version", S + "txn"]
REQUIRED = {
    "Hello": ["hello.min_version", "hello.max_version", "hello.role", "hello.channel",
              "hello.session", "hello.node_id", "hello.max_message"],
    "HelloReply": ["hello_reply.version", "hello_reply.status", "hello_reply.session",
                   "hello_reply.max_message"],
    "Keepalive": [],
    "Goodbye": ["goodbye.code"],
    "AuthHello": ["auth.noise"],
    "AuthReply": ["auth.noise"],
    "SEND": ["sealed"],  # a SEND without a message: sealed (5.1)
    "BufferRecvPool": ["count", "pool.ref", "pool.element_count", "pool.element_size",
                       "pool.address", "pool.handle", "pool.context"],
    "BufferRecvPoolGet": ["pool_get.element_size", "pool_get.element_count"],
    "BufferRecvPoolUpdate": ["count", "run.pool_ref", "run.first_element", "run.element_count"],
    "BufferPoolFlushRequest": ["count", "flush.pool_ref"],
    "BufferPoolFlushReply": ["request_in"],
    "CfgUtilRequest": ["cfg.code", "cfg.data_size"],
    "CfgUtilReply": ["cfg.code", "cfg.status", "cfg.data_size", "request_in"],
    "SendData": ["senddata.length", "vnet.flags", "vnet.gso_type", "vnet.hdr_len",
                 "vnet.gso_size", "vnet.csum_start", "vnet.csum_offset"],
    "BufferRDMAIndicate": ["indicate.pool_ref", "indicate.element", "indicate.length"],
    "RDMA WRITE": ["op.handle", "op.addr", "write.pool", "write.element", "vnet.flags", "vnet.gso_type"],
    "RDMA WRITE WITH IMMEDIATE": ["op.handle", "op.addr", "imm.pool", "imm.element", "imm.length",
                                  "write.pool", "write.element", "vnet.flags", "vnet.gso_type"],
}
CFG_REQUIRED = {  # by code: typed data
    ("CfgUtilRequest", "SetMtu"): ["cfg.mtu"], ("CfgUtilRequest", "SetPromisc"): ["cfg.promisc"],
    ("CfgUtilRequest", "SetFeatures"): ["cfg.features", "cfg.features.vnet_hdr"],
    ("CfgUtilRequest", "LinkChange"): ["cfg.link", "cfg.mtu"],
    ("CfgUtilReply", "GetMac"): ["cfg.mac"], ("CfgUtilReply", "GetMtu"): ["cfg.mtu", "cfg.mtu_max"],
    ("CfgUtilReply", "GetLink"): ["cfg.link"],
}
WANT = ["Hello", "HelloReply", "BufferRecvPool", "BufferRecvPoolUpdate", "BufferPoolFlushRequest",
        "BufferPoolFlushReply", "CfgUtilRequest", "CfgUtilReply", "Keepalive", "Goodbye", "SendData",
        "RDMA WRITE WITH IMMEDIATE", "ICMP in an RDMA write", "CfgUtil SetMtu", "CfgUtil SetPromisc",
        "CfgUtil LinkChange", "AuthHello", "AuthReply", "sealed control message"]

def shown(el):  # "Function: Hello (0x0001)" -> "Hello"
    m = re.match(r"[^:]*: (.*) \((?:0x)?[0-9a-f]+\)$", el.get("showname", ""))
    return m.group(1) if m else el.get("show", "")

def names(el):
    return {e.get("name") for e in el.iter()}

count = collections.Counter()
errors = []

# 1. Every operation of the capture: the names its function or opcode has in the PDML decode,
# and TCP reassembly (the operations cover every byte of both connections).
tcp_bytes = op_bytes = segments = ops = spanning = multi = 0
functions = collections.Counter()
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t") + [""] * 8
    num, tlen, retrans, segs, opcodes, lens, funcs, codes = f[:8]
    if int(tlen or 0) and not retrans:
        tcp_bytes += int(tlen)
        segments += 1
    n = len([x for x in opcodes.split(",") if x])
    ops += n
    multi += n > 1
    spanning += int(segs or 0) > 1
    op_bytes += sum(32 + int(x) for x in lens.split(",") if x)
    for o in opcodes.split(","):
        if o and o != "1":
            functions["opcode " + o] += 1
    for f in funcs.split(","):
        if f:
            functions[int(f, 16)] += 1
    for c in codes.split(","):
        if c:
            functions["code " + c] += 1

# 2. The decode: each operation named, with the fields of its layout.
named = {}
authenticated = False  # from the first AuthHello on
for _, pkt in ET.iterparse(sys.argv[2]):
    if pkt.tag != "packet":
        continue
    num = pkt.find("proto[@name='frame']/field[@name='frame.number']").get("show")
    for op in (p for p in pkt if p.get("name") == "splitnet"):
        opcode = op.find("field[@name='splitnet.op']/field[@name='splitnet.op.opcode']")
        msg = op.find("field[@name='splitnet.message']")
        if msg is not None:
            func = msg.find("field[@name='splitnet.function']")
            name = shown(func)
            named[int(func.get("show"), 16)] = name
            have, need = names(msg), HEADER + [S + f for f in REQUIRED.get(name, [])]
            code = msg.find("field[@name='splitnet.cfg.code']")
            if code is not None:
                named["code " + code.get("show")] = "CfgUtil " + shown(code)
                need += [S + f for f in CFG_REQUIRED.get((name, shown(code)), [])]
        else:
            name = shown(opcode)
            named["opcode " + opcode.get("show")] = name
            have, need = names(op), [S + f for f in REQUIRED.get(name, [])]
            if S + "sealed" in have:
                count["sealed control message"] += 1
            if op.find("proto[@name='icmp']") is not None:
                count["ICMP in an RDMA write"] += 1
        if name == "AuthHello":
            authenticated = True
        if authenticated:
            # A reply on the data channel may answer a request sealed on the control channel.
            need = [f for f in need if f != S + "request_in"]
        lacking = [f for f in need if f not in have]
        if lacking or name not in REQUIRED:
            errors.append("frame %s: %s%s" % (num, name, " lacks " + ", ".join(lacking) if lacking else ""))
    pkt.clear()
for k, n in functions.items():
    if k not in named:
        errors.append("%s: %d operations, none in the PDML decode" % (k, n))
    count[named.get(k, k)] += n

print("  operations and messages:")
for k in sorted(count, key=lambda k: (k.startswith("CfgUtil "), k)):
    print("    %-44s %6d" % (k + (" (requests + replies)" if k.startswith("CfgUtil ") else ""), count[k]))
print("  %d operations in %d TCP data segments (%d bytes): %d reassembled from "
      "several segments, %d segments holding several operations"
      % (ops, segments, tcp_bytes, spanning, multi))
missing = [w for w in WANT if not count[w]]
if missing:
    errors.append("not decoded: " + ", ".join(missing))
if op_bytes != tcp_bytes:
    errors.append("reassembly: operations cover %d bytes, the TCP streams carry %d" % (op_bytes, tcp_bytes))
if not spanning or not multi:
    errors.append("reassembly: %d operations spanning segments, %d segments with several operations "
                  "(want both)" % (spanning, multi))
if errors:
    sys.exit("\n".join(errors[:20]))
PY
cat "$T/summary.txt"
pass "tshark with tools/wireshark/splitnet.lua decodes the fabric: every message named with its fields, nothing malformed"
