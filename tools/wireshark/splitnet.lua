-- splitnet.lua: Wireshark dissector for the splitnet fabric protocol, version 1
-- (docs/protocol.md; the Rust encoders in messaging/src/wire/ and messaging/src/adapter/op.rs
-- are the reference).
--
-- A host-driver opens two TCP connections to an ioc-driver's fabric address (port 7400 by
-- default): channel 0 (control), then channel 1 (data). Each carries a stream of
-- channel-adapter operations: a 32-byte header (opcode, length, memory handle, remote
-- address, immediate data) and `length` payload bytes. A SEND carries one message (12-byte
-- common header: function, version, transaction context; then the body); an RDMA WRITE
-- (WITH IMMEDIATE) carries a frame: a 10-byte little-endian virtio-net header and an Ethernet
-- frame without FCS, which is handed to Wireshark's Ethernet dissector (so the ICMP, TCP...
-- inside shows). Operations split over TCP segments are reassembled, and every operation in a
-- segment is decoded. The channel of a connection is learnt from its Hello (or AuthHello).
--
-- Use:
--   tshark -X lua_script:tools/wireshark/splitnet.lua -r cap.pcapng
--   tshark -X lua_script:tools/wireshark/splitnet.lua -r cap.pcapng -V -Y 'splitnet.function == 0x0301'
--   wireshark -X lua_script:tools/wireshark/splitnet.lua cap.pcapng
-- or copy this file into Wireshark's personal Lua plugin folder (Linux and macOS:
-- ~/.local/lib/wireshark/plugins/, Windows: %APPDATA%\Wireshark\plugins\; Help > About
-- Wireshark > Folders shows it) and restart Wireshark. Capture with e.g.
--   dumpcap -i fab0 -f 'tcp port 7400' -w cap.pcapng
-- Another port: Edit > Preferences > Protocols > SPLITNET, or "Decode As..." (TCP port), or
-- rely on the heuristic (a connection whose first segment starts with a valid SEND).
--
-- Display filters: every field is under "splitnet." (splitnet.op.*, splitnet.function,
-- splitnet.hello.*, splitnet.pool.*, splitnet.run.*, splitnet.cfg.*, splitnet.vnet.*...).
-- Expert infos: splitnet.expert.* (malformed or truncated operations and messages are errors
-- of group "Malformed"; unknown functions, non-zero reserved fields, bad versions, idata that
-- disagrees with the write are warnings).

local splitnet = Proto("splitnet", "splitnet Fabric Protocol")

local OP_HEADER_LEN = 32
local MSG_HEADER_LEN = 12
local MAX_MESSAGE_LEN = 65536 + 1024
-- A write is at most one element, and elements are at most 1 MiB: an operation header
-- announcing more is not splitnet (or the stream is out of step).
local MAX_OP_PAYLOAD = 1048576
local VNET_HDR_LEN = 10
local DEFAULT_PORT = 7400

-- ---------------------------------------------------------------------------------------------
-- Names

local OPCODES = { [1] = "SEND", [2] = "RDMA WRITE", [3] = "RDMA WRITE WITH IMMEDIATE" }
-- The smallest max_message a Hello or HelloReply may carry (docs/protocol.md, section 8).
local MIN_MAX_MESSAGE = 66560

local FUNCTIONS = {
    [0x0001] = "Hello",
    [0x0002] = "HelloReply",
    [0x0003] = "Keepalive",
    [0x0004] = "Goodbye",
    [0x0005] = "AuthHello",
    [0x0006] = "AuthReply",
    [0x0101] = "BufferRecvPool",
    [0x0102] = "BufferRecvPoolGet",
    [0x0103] = "BufferRecvPoolUpdate",
    [0x0104] = "BufferPoolFlushRequest",
    [0x0105] = "BufferPoolFlushReply",
    [0x0201] = "SendData",
    [0x0202] = "BufferRDMAIndicate",
    [0x0301] = "CfgUtilRequest",
    [0x0302] = "CfgUtilReply",
}

local ERROR_CODES = {
    [0] = "Ok", [1] = "UnsupportedVersion", [2] = "Malformed", [3] = "UnknownFunction",
    [4] = "Protection", [5] = "Credit", [6] = "ResourceLimit", [7] = "UnknownSession",
    [8] = "ShuttingDown", [9] = "Unsupported", [10] = "Refused", [11] = "Timeout", [12] = "Busy",
}

local CFG_CODES = {
    [1] = "GetMac", [2] = "SetMac", [3] = "GetMtu", [4] = "SetMtu", [5] = "GetLink",
    [6] = "GetStats", [7] = "SetPromisc", [8] = "SetMulticast", [9] = "GetFeatures",
    [10] = "SetFeatures", [11] = "LinkChange",
}

local ROLES = { [1] = "host", [2] = "IOC" }
local CHANNELS = { [0] = "control" }
for i = 1, 16 do CHANNELS[i] = "data" end
CHANNELS[3] = "control, in shared memory"
CHANNELS[2] = "data, in shared memory"
CHANNELS[4] = "data, over an RDMA queue pair"
CHANNELS[5] = "control, over an RDMA queue pair"
local GSO_TYPES = { [0] = "none", [1] = "TCPv4", [3] = "UDP", [4] = "TCPv6", [5] = "UDP_L4" }
local LINK_STATES = { [0] = "down", [1] = "up" }
local ONOFF = { [0] = "off", [1] = "on" }
local PROMISC_MODES = { [0] = "off", [1] = "promiscuous", [2] = "all multicast" }

local function name_of(t, v, what)
    return t[v] or string.format("Unknown %s %d", what, v)
end

-- ---------------------------------------------------------------------------------------------
-- Fields

local pf = {
    -- operation header
    op = ProtoField.none("splitnet.op", "Operation header"),
    opcode = ProtoField.uint8("splitnet.op.opcode", "Opcode", base.DEC, OPCODES),
    op_reserved = ProtoField.bytes("splitnet.op.reserved", "Reserved"),
    length = ProtoField.uint32("splitnet.op.length", "Payload length", base.DEC),
    handle = ProtoField.uint64("splitnet.op.handle", "Memory handle", base.HEX),
    handle_slot = ProtoField.uint32("splitnet.op.handle.slot", "Slot", base.DEC),
    handle_gen = ProtoField.uint32("splitnet.op.handle.generation", "Generation", base.DEC),
    addr = ProtoField.uint64("splitnet.op.addr", "Remote address", base.HEX),
    imm = ProtoField.uint32("splitnet.op.imm", "Immediate data", base.HEX),
    imm_pool = ProtoField.uint32("splitnet.imm.pool", "Pool reference", base.DEC, nil, 0xff000000),
    imm_element = ProtoField.uint32("splitnet.imm.element", "Element", base.DEC, nil, 0x00ff0000),
    imm_length = ProtoField.uint32("splitnet.imm.length", "Bytes written", base.DEC, nil, 0x0000ffff),
    op_reserved2 = ProtoField.bytes("splitnet.op.reserved2", "Reserved"),
    channel = ProtoField.uint8("splitnet.channel", "Channel", base.DEC, CHANNELS),
    direction = ProtoField.string("splitnet.direction", "Direction"),
    -- RDMA writes, resolved against the pools the target advertised
    write_pool = ProtoField.uint32("splitnet.write.pool", "Pool reference (from the handle)", base.DEC),
    write_element = ProtoField.uint32("splitnet.write.element", "Element (from the address)", base.DEC),
    write_adv_in = ProtoField.framenum("splitnet.write.advertised_in", "Pool advertised in", base.NONE),
    payload = ProtoField.bytes("splitnet.payload", "Payload"),
    noise = ProtoField.bytes("splitnet.auth.noise", "Noise handshake message"),
    sealed = ProtoField.bytes("splitnet.sealed", "Sealed control message"),
    sealed_record = ProtoField.bytes("splitnet.sealed_record", "Sealed data record"),
    reply_flags = ProtoField.uint32("splitnet.hello_reply.flags", "Flags agreed to (bit 0: data channel sealed)", base.HEX),
    -- common message header
    message = ProtoField.none("splitnet.message", "Message"),
    func = ProtoField.uint16("splitnet.function", "Function", base.HEX, FUNCTIONS),
    version = ProtoField.uint16("splitnet.version", "Version", base.DEC),
    txn = ProtoField.uint64("splitnet.txn", "Transaction context", base.HEX),
    request_in = ProtoField.framenum("splitnet.request_in", "Request in", base.NONE, frametype.REQUEST),
    response_in = ProtoField.framenum("splitnet.response_in", "Response in", base.NONE, frametype.RESPONSE),
    reserved = ProtoField.bytes("splitnet.reserved", "Reserved"),
    -- Hello / HelloReply / Goodbye
    hello_min = ProtoField.uint16("splitnet.hello.min_version", "Minimum version", base.DEC),
    hello_max = ProtoField.uint16("splitnet.hello.max_version", "Maximum version", base.DEC),
    hello_role = ProtoField.uint8("splitnet.hello.role", "Role", base.DEC, ROLES),
    hello_channel = ProtoField.uint8("splitnet.hello.channel", "Channel", base.DEC, CHANNELS),
    hello_queue = ProtoField.uint8("splitnet.hello.queue", "Queue", base.DEC),
    hello_queues = ProtoField.uint8("splitnet.hello.queues", "Queues (0: 1)", base.DEC),
    hello_session = ProtoField.uint64("splitnet.hello.session", "Session token", base.HEX),
    hello_node = ProtoField.uint64("splitnet.hello.node_id", "Node id", base.HEX),
    hello_maxmsg = ProtoField.uint32("splitnet.hello.max_message", "Largest SEND accepted", base.DEC),
    reply_version = ProtoField.uint16("splitnet.hello_reply.version", "Version (chosen; on a refusal the listener's highest)", base.DEC),
    reply_status = ProtoField.uint16("splitnet.hello_reply.status", "Status", base.DEC, ERROR_CODES),
    reply_session = ProtoField.uint64("splitnet.hello_reply.session", "Session token", base.HEX),
    reply_maxmsg = ProtoField.uint32("splitnet.hello_reply.max_message", "Largest SEND accepted", base.DEC),
    goodbye_code = ProtoField.uint16("splitnet.goodbye.code", "Code", base.DEC, ERROR_CODES),
    -- lists
    count = ProtoField.uint16("splitnet.count", "Count", base.DEC),
    pool = ProtoField.none("splitnet.pool", "Pool"),
    pool_ref = ProtoField.uint32("splitnet.pool.ref", "Pool reference", base.DEC),
    pool_count = ProtoField.uint32("splitnet.pool.element_count", "Element count", base.DEC),
    pool_size = ProtoField.uint32("splitnet.pool.element_size", "Element size", base.DEC),
    pool_addr = ProtoField.uint64("splitnet.pool.address", "Address", base.HEX),
    pool_handle = ProtoField.uint64("splitnet.pool.handle", "Memory handle", base.HEX),
    pool_context = ProtoField.uint64("splitnet.pool.context", "Context", base.HEX),
    get_size = ProtoField.uint32("splitnet.pool_get.element_size", "Element size wanted", base.DEC),
    get_count = ProtoField.uint32("splitnet.pool_get.element_count", "Element count wanted", base.DEC),
    run = ProtoField.none("splitnet.run", "Run"),
    run_pool = ProtoField.uint32("splitnet.run.pool_ref", "Pool reference", base.DEC),
    run_first = ProtoField.uint32("splitnet.run.first_element", "First element", base.DEC),
    run_count = ProtoField.uint32("splitnet.run.element_count", "Element count", base.DEC),
    credits = ProtoField.uint32("splitnet.credits", "Credits returned", base.DEC),
    flush_ref = ProtoField.uint32("splitnet.flush.pool_ref", "Pool reference", base.DEC),
    -- SendData / BufferRDMAIndicate
    senddata_len = ProtoField.uint32("splitnet.senddata.length", "Frame length", base.DEC),
    ind_pool = ProtoField.uint32("splitnet.indicate.pool_ref", "Pool reference", base.DEC),
    ind_element = ProtoField.uint32("splitnet.indicate.element", "Element", base.DEC),
    ind_length = ProtoField.uint32("splitnet.indicate.length", "Bytes written", base.DEC),
    -- CfgUtil
    cfg_code = ProtoField.uint16("splitnet.cfg.code", "Code", base.DEC, CFG_CODES),
    cfg_status = ProtoField.uint16("splitnet.cfg.status", "Status", base.DEC, ERROR_CODES),
    cfg_size = ProtoField.uint32("splitnet.cfg.data_size", "Data size", base.DEC),
    cfg_data = ProtoField.bytes("splitnet.cfg.data", "Data"),
    cfg_mac = ProtoField.ether("splitnet.cfg.mac", "MAC address"),
    cfg_mtu = ProtoField.uint32("splitnet.cfg.mtu", "MTU", base.DEC),
    cfg_mtu_max = ProtoField.uint32("splitnet.cfg.mtu_max", "Largest MTU", base.DEC),
    cfg_link = ProtoField.uint8("splitnet.cfg.link", "Link", base.DEC, LINK_STATES),
    cfg_promisc = ProtoField.uint8("splitnet.cfg.promisc", "Promiscuous", base.DEC, PROMISC_MODES),
    cfg_multicast = ProtoField.ether("splitnet.cfg.multicast", "Multicast address"),
    cfg_features = ProtoField.uint64("splitnet.cfg.features", "Features", base.HEX),
    feat_vnet = ProtoField.bool("splitnet.cfg.features.vnet_hdr", "VNET_HDR", 8, nil, 0x01),
    feat_csum = ProtoField.bool("splitnet.cfg.features.csum", "CSUM", 8, nil, 0x02),
    feat_tso4 = ProtoField.bool("splitnet.cfg.features.tso4", "TSO4", 8, nil, 0x04),
    feat_tso6 = ProtoField.bool("splitnet.cfg.features.tso6", "TSO6", 8, nil, 0x08),
    feat_uso = ProtoField.bool("splitnet.cfg.features.uso", "USO", 8, nil, 0x10),
    feat_ecn = ProtoField.bool("splitnet.cfg.features.ecn", "ECN", 8, nil, 0x20),
    feat_express = ProtoField.bool("splitnet.cfg.features.express", "EXPRESS (express lane)", 8, nil, 0x40),
    -- virtio-net header (little-endian)
    vnet = ProtoField.none("splitnet.vnet", "virtio-net header"),
    vnet_flags = ProtoField.uint8("splitnet.vnet.flags", "Flags", base.HEX),
    vnet_needs_csum = ProtoField.bool("splitnet.vnet.flags.needs_csum", "NEEDS_CSUM", 8, nil, 0x01),
    vnet_data_valid = ProtoField.bool("splitnet.vnet.flags.data_valid", "DATA_VALID", 8, nil, 0x02),
    vnet_gso_type = ProtoField.uint8("splitnet.vnet.gso_type", "GSO type", base.DEC, GSO_TYPES, 0x7f),
    vnet_gso_ecn = ProtoField.bool("splitnet.vnet.gso_ecn", "GSO ECN", 8, nil, 0x80),
    vnet_hdr_len = ProtoField.uint16("splitnet.vnet.hdr_len", "Header length", base.DEC),
    vnet_gso_size = ProtoField.uint16("splitnet.vnet.gso_size", "GSO size", base.DEC),
    vnet_csum_start = ProtoField.uint16("splitnet.vnet.csum_start", "Checksum start", base.DEC),
    vnet_csum_offset = ProtoField.uint16("splitnet.vnet.csum_offset", "Checksum offset", base.DEC),
}

local STATS = {
    "rx_frames", "rx_bytes", "tx_frames", "tx_bytes",
    "rx_dropped", "tx_dropped", "protocol_errors", "protection_errors",
}
local pf_stats = {}
for i, n in ipairs(STATS) do
    pf_stats[i] = ProtoField.uint64("splitnet.cfg.stats." .. n, n, base.DEC)
end

local fields = {}
for _, f in pairs(pf) do fields[#fields + 1] = f end
for _, f in ipairs(pf_stats) do fields[#fields + 1] = f end
splitnet.fields = fields

-- ---------------------------------------------------------------------------------------------
-- Expert infos

local G, SEV = expert.group, expert.severity
local function new_expert(abbr, text, group, severity)
    return ProtoExpert.new("splitnet.expert." .. abbr, text, group, severity)
end
local ef = {
    -- errors: the receiver would drop the connection
    truncated = new_expert("truncated", "Truncated", G.MALFORMED, SEV.ERROR),
    length = new_expert("length", "Length mismatch", G.MALFORMED, SEV.ERROR),
    opcode = new_expert("unknown_opcode", "Unknown opcode", G.MALFORMED, SEV.ERROR),
    too_long = new_expert("too_long", "Operation too long", G.MALFORMED, SEV.ERROR),
    frame = new_expert("frame", "Frame shorter than its headers", G.MALFORMED, SEV.ERROR),
    -- warnings: understood, but not what the protocol allows
    func = new_expert("unknown_function", "Unknown function", G.PROTOCOL, SEV.WARN),
    version = new_expert("version", "Unsupported version", G.PROTOCOL, SEV.WARN),
    reserved = new_expert("reserved", "Reserved field not zero", G.PROTOCOL, SEV.WARN),
    value = new_expert("bad_value", "Value out of range", G.PROTOCOL, SEV.WARN),
    cfg_data = new_expert("cfg_data", "CfgUtil data does not match the code", G.PROTOCOL, SEV.WARN),
    idata = new_expert("idata", "Immediate data disagrees with the write", G.PROTOCOL, SEV.WARN),
    ctrl_write = new_expert("control_write", "RDMA write on channel 0 (protection error, row E4)", G.PROTOCOL, SEV.ERROR),
    -- notes and chats
    status = new_expert("status", "Error status", G.RESPONSE_CODE, SEV.NOTE),
    unknown_code = new_expert("unknown_code", "Unknown code", G.PROTOCOL, SEV.NOTE),
    goodbye = new_expert("goodbye", "Goodbye", G.SEQUENCE, SEV.CHAT),
}
local experts = {}
for _, e in pairs(ef) do experts[#experts + 1] = e end
splitnet.experts = experts

-- ---------------------------------------------------------------------------------------------
-- Preferences and state

splitnet.prefs.tcp_port = Pref.uint("TCP port", DEFAULT_PORT, "TCP port of the IOC's fabric listener")
splitnet.prefs.frames = Pref.bool("Dissect frames", true,
    "Hand the Ethernet frames of RDMA writes and SendData to the Ethernet dissector")

local eth_dissector = Dissector.get("eth_withoutfcs")
local f_tcp_stream = Field.new("tcp.stream")

-- Per capture (cleared by init): what the first pass learnt.
local streams    -- tcp.stream -> { channel = n, host = "addr:port", sealed } (from the Hello)
local pools      -- "owner addr/handle" -> { ref, size, count, address, frame }
local requests   -- "requester addr/kind/txn" -> frame of the request
local replies    -- "frame/kind/txn" -> frame of the request (for replies)
local responses  -- "frame/kind/txn" -> frame of the reply (for requests)

local function reset_state()
    streams, pools, requests, replies, responses = {}, {}, {}, {}, {}
end
reset_state()
splitnet.init = reset_state

-- The outer TCP segment being dissected. An Ethernet frame inside a write changes pinfo's
-- addresses and ports, so they are saved before the operations of a segment are dissected.
local seg = {}
-- Where generated items point: the start of the operation being dissected.
local gen_range

-- ---------------------------------------------------------------------------------------------
-- A cursor over a message body: every read is bounds-checked; a short body is reported once as
-- truncated (malformed) and what was present stays decoded.

local Cursor = {}
Cursor.__index = Cursor

local function cursor(tvb, off, stop, item)
    return setmetatable({ tvb = tvb, off = off, stop = stop, item = item, short = false }, Cursor)
end

function Cursor:left() return self.stop - self.off end

function Cursor:take(n)
    if self.short then return nil end
    if self.off + n > self.stop then
        self.short = true
        self.item:add_proto_expert_info(ef.truncated, string.format(
            "Truncated: %d more bytes needed, %d present", n, self.stop - self.off))
        return nil
    end
    local r = self.tvb(self.off, n)
    self.off = self.off + n
    return r
end

-- Adds FIELD over the next N bytes to TREE; returns the range (nil when truncated).
function Cursor:add(tree, field, n, le)
    local r = self:take(n)
    if r then
        if le then tree:add_le(field, r) else tree:add(field, r) end
    end
    return r
end

function Cursor:uint(tree, field, n)
    local r = self:add(tree, field, n)
    return r and r:uint()
end

function Cursor:uint64(tree, field)
    local r = self:add(tree, field, 8)
    return r and r:uint64()
end

-- A reserved field: must be zero.
function Cursor:reserved(tree, field, n)
    local r = self:add(tree, field or pf.reserved, n)
    if r then
        for i = 0, n - 1 do
            if r(i, 1):uint() ~= 0 then
                tree:add_tvb_expert_info(ef.reserved, r, "Reserved field is not zero")
                break
            end
        end
    end
end

-- Every byte must have been consumed.
function Cursor:finish()
    if not self.short and self:left() > 0 then
        self.item:add_tvb_expert_info(ef.length, self.tvb(self.off, self:left()),
            string.format("%d trailing bytes after the message body", self:left()))
    end
end

-- A list count (u16 count, u16 reserved) that must be at least 1 and match the bytes present.
-- Returns how many entries can be decoded.
function Cursor:count(tree, entry_len)
    local n = self:uint(tree, pf.count, 2)
    self:reserved(tree, nil, 2)
    if not n then return 0 end
    if n == 0 then
        self.item:add_proto_expert_info(ef.value, "Empty list (count must be at least 1)")
    end
    if n * entry_len ~= self:left() then
        self.item:add_proto_expert_info(ef.length, string.format(
            "Count %d needs %d bytes, %d follow", n, n * entry_len, self:left()))
    end
    return math.min(n, math.floor(self:left() / entry_len))
end

-- ---------------------------------------------------------------------------------------------
-- Helpers

local function generated(tree, field, value)
    local it = tree:add(field, gen_range, value)
    it:set_generated()
    return it
end

local function u64hex(v) return "0x" .. v:tohex() end

-- Appends to the Info column: the first operation of a frame replaces TCP's text.
local function info(pinfo, text)
    if pinfo.private["splitnet_info"] then
        pinfo.cols.info:append(", " .. text)
    else
        pinfo.private["splitnet_info"] = "1"
        pinfo.cols.info = text
    end
end

-- Links a request and its reply by transaction context. KIND names the transaction type,
-- REQUESTER is the address of the side that sent the request.
local function track_request(pinfo, tree, kind, requester, txn)
    local k = kind .. "/" .. u64hex(txn)
    if not pinfo.visited then requests[requester .. "/" .. k] = pinfo.number end
    local resp = responses[pinfo.number .. "/" .. k]
    if resp then generated(tree, pf.response_in, resp) end
end

local function track_reply(pinfo, tree, kind, requester, txn)
    local k = kind .. "/" .. u64hex(txn)
    if not pinfo.visited then
        local req = requests[requester .. "/" .. k]
        if req then
            replies[pinfo.number .. "/" .. k] = req
            responses[req .. "/" .. k] = pinfo.number
        end
    end
    local req = replies[pinfo.number .. "/" .. k]
    if req then generated(tree, pf.request_in, req) end
end

-- ---------------------------------------------------------------------------------------------
-- Frames: virtio-net header, then Ethernet without FCS.

local function dissect_frame(tvb, off, len, pinfo, tree, summary)
    if len < VNET_HDR_LEN + 14 then
        tree:add_tvb_expert_info(ef.frame, tvb(off, len),
            string.format("Frame of %d bytes is shorter than the virtio-net and Ethernet headers", len))
        info(pinfo, summary)
        return
    end
    local v = tree:add(pf.vnet, tvb(off, VNET_HDR_LEN))
    local fl = v:add(pf.vnet_flags, tvb(off, 1))
    fl:add(pf.vnet_needs_csum, tvb(off, 1))
    fl:add(pf.vnet_data_valid, tvb(off, 1))
    v:add(pf.vnet_gso_type, tvb(off + 1, 1))
    v:add(pf.vnet_gso_ecn, tvb(off + 1, 1))
    v:add_le(pf.vnet_hdr_len, tvb(off + 2, 2))
    v:add_le(pf.vnet_gso_size, tvb(off + 4, 2))
    v:add_le(pf.vnet_csum_start, tvb(off + 6, 2))
    v:add_le(pf.vnet_csum_offset, tvb(off + 8, 2))
    local flags, gso = tvb(off, 1):uint(), tvb(off + 1, 1):uint()
    local gso_type = gso % 0x80 -- bit 7 is ECN
    v:append_text(string.format(", flags 0x%02x, GSO %s", flags, name_of(GSO_TYPES, gso_type, "type")))
    if flags > 3 then
        v:add_proto_expert_info(ef.value, string.format("Unknown virtio-net flags 0x%02x", flags))
    end
    if not GSO_TYPES[gso_type] then
        v:add_proto_expert_info(ef.value, string.format("Unknown GSO type 0x%02x", gso))
    end
    if not (splitnet.prefs.frames and eth_dissector) then
        info(pinfo, summary)
        return
    end
    -- "<summary>: <what the Ethernet dissector says>"; the fence keeps our part of the column.
    info(pinfo, summary .. ":")
    pinfo.cols.info:append(" ")
    pinfo.cols.info:fence()
    local dl, doff, cd = pinfo.desegment_len, pinfo.desegment_offset, pinfo.can_desegment
    eth_dissector:call(tvb(off + VNET_HDR_LEN, len - VNET_HDR_LEN):tvb(), pinfo, tree)
    -- An inner TCP must not leave its reassembly requests to the outer one.
    pinfo.desegment_len, pinfo.desegment_offset, pinfo.can_desegment = dl, doff, cd
    pinfo.cols.info:fence()
    local inner = tostring(pinfo.cols.protocol)
    if inner ~= "splitnet" and not inner:find("^splitnet/") then
        pinfo.cols.protocol = "splitnet/" .. inner
    end
end

-- ---------------------------------------------------------------------------------------------
-- CfgUtil data, by code. Each returns a short text for the Info column (or nil).

local function cfg_mac(c, t) local r = c:add(t, pf.cfg_mac, 6); return r and tostring(r:ether()) end
local function cfg_u32(field) return function(c, t) return tostring(c:uint(t, field, 4)) end end
local function cfg_u8(field, names)
    return function(c, t)
        local v = c:uint(t, field, 1)
        if v and not names[v] then t:add_proto_expert_info(ef.value, "Value out of range") end
        return v and name_of(names, v, "value")
    end
end
local function cfg_features(c, t)
    local r = c:add(t, pf.cfg_features, 8)
    if not r then return nil end
    local low = r(7, 1)
    for _, f in ipairs({ pf.feat_vnet, pf.feat_csum, pf.feat_tso4, pf.feat_tso6, pf.feat_uso, pf.feat_ecn, pf.feat_express }) do
        t:add(f, low)
    end
    return u64hex(r:uint64())
end
local function cfg_mtu_reply(c, t)
    local cur = c:uint(t, pf.cfg_mtu, 4)
    local max = c:uint(t, pf.cfg_mtu_max, 4)
    return cur and max and string.format("%d (max %d)", cur, max)
end
local function cfg_stats(c, t)
    for i = 1, #STATS do c:add(t, pf_stats[i], 8) end
end
local function cfg_multicast(c, t)
    local n = math.floor(c:left() / 6)
    if c:left() % 6 ~= 0 or n > 256 then
        t:add_proto_expert_info(ef.cfg_data, "SetMulticast data must be at most 256 6-byte addresses")
    end
    for _ = 1, n do c:add(t, pf.cfg_multicast, 6) end
    return n .. " addresses"
end
local function cfg_link_change(c, t)
    local up = cfg_u8(pf.cfg_link, LINK_STATES)(c, t)
    local mtu = c:uint(t, pf.cfg_mtu, 4)
    return up and mtu and string.format("link %s, MTU %d", up, mtu)
end

-- code -> { length of the data (nil: any), decoder }
local CFG_REQUEST_DATA = {
    [1] = { 0 }, [3] = { 0 }, [5] = { 0 }, [6] = { 0 }, [9] = { 0 },
    [2] = { 6, cfg_mac },
    [4] = { 4, cfg_u32(pf.cfg_mtu) },
    [7] = { 1, cfg_u8(pf.cfg_promisc, PROMISC_MODES) },
    [8] = { nil, cfg_multicast },
    [10] = { 8, cfg_features },
    [11] = { 5, cfg_link_change },
}
local CFG_REPLY_DATA = {
    [1] = { 6, cfg_mac },
    [3] = { 8, cfg_mtu_reply },
    [5] = { 1, cfg_u8(pf.cfg_link, LINK_STATES) },
    [6] = { 64, cfg_stats },
    [9] = { 8, cfg_features },
    [2] = { 0 }, [4] = { 0 }, [7] = { 0 }, [8] = { 0 }, [10] = { 0 }, [11] = { 0 },
}

-- The data of a CfgUtil message: typed when the code and size are known, else raw bytes.
local function cfg_data(c, t, code, table_, typed)
    local size = c:uint(t, pf.cfg_size, 4)
    if not size then return nil end
    if size ~= c:left() then
        t:add_proto_expert_info(ef.length, string.format("data_size %d but %d bytes follow", size, c:left()))
    end
    local n = math.min(size, c:left())
    if n == 0 then return nil end
    local spec = typed and table_[code]
    if spec and (spec[1] == nil or spec[1] == n) and spec[2] then
        local dc = cursor(c.tvb, c.off, c.off + n, t)
        local text = spec[2](dc, t)
        dc:finish()
        t:add(pf.cfg_data, c:take(n)):set_hidden()
        return text
    end
    if spec and typed then
        t:add_proto_expert_info(ef.cfg_data, string.format("%d bytes of data for %s", n, name_of(CFG_CODES, code, "code")))
    end
    c:add(t, pf.cfg_data, n)
    return nil
end

-- ---------------------------------------------------------------------------------------------
-- Message bodies: one function each. ctx = { pinfo, item (the message subtree), txn, src,
-- dst, stream }. Each returns the text that follows the message name in the Info column.

local body = {}

body[0x0001] = function(c, t, ctx) -- Hello
    c:uint(t, pf.hello_min, 2)
    c:uint(t, pf.hello_max, 2)
    local role = c:uint(t, pf.hello_role, 1)
    local ch = c:uint(t, pf.hello_channel, 1)
    local queue = c:uint(t, pf.hello_queue, 1)
    local queues = c:uint(t, pf.hello_queues, 1)
    local session = c:uint64(t, pf.hello_session)
    c:uint64(t, pf.hello_node)
    local maxmsg = c:uint(t, pf.hello_maxmsg, 4)
    if maxmsg and maxmsg < MIN_MAX_MESSAGE then
        t:add_proto_expert_info(ef.value, string.format(
            "max_message %d is below the protocol's %d (refused: row H3)", maxmsg, MIN_MAX_MESSAGE))
    end
    if role and not ROLES[role] then t:add_proto_expert_info(ef.value, "Role must be 1 (host) or 2 (IOC)") end
    if ch and ch > 16 then t:add_proto_expert_info(ef.value, "Channel must be 0..16") end
    if queue and queues and (queues > 16 or queue >= math.max(queues, 1)) then
        t:add_proto_expert_info(ef.value, "Queue must be below the queue count (1..16)")
    end
    if ch and ctx.stream and not ctx.pinfo.visited then
        streams[ctx.stream] = { channel = ch, host = ctx.src }
    end
    if ch and session and queue and queues and queues > 1 then
        return string.format(" ch=%d queue=%d/%d session=%s", ch, queue, queues, u64hex(session))
    end
    return ch and session and string.format(" ch=%d session=%s", ch, u64hex(session)) or ""
end

body[0x0002] = function(c, t, ctx) -- HelloReply
    c:uint(t, pf.reply_version, 2)
    local status = c:uint(t, pf.reply_status, 2)
    c:uint(t, pf.reply_flags, 4)
    local session = c:uint64(t, pf.reply_session)
    local maxmsg = c:uint(t, pf.reply_maxmsg, 4)
    if status == 0 and maxmsg and maxmsg < MIN_MAX_MESSAGE then
        t:add_proto_expert_info(ef.value, string.format(
            "max_message %d is below the protocol's %d (refused: row H9)", maxmsg, MIN_MAX_MESSAGE))
    end
    if status and status ~= 0 then
        t:add_proto_expert_info(ef.status, "Hello refused: " .. name_of(ERROR_CODES, status, "code"))
    end
    return status and session
        and string.format(" %s session=%s", name_of(ERROR_CODES, status, "code"), u64hex(session)) or ""
end

-- AuthHello (docs/protocol.md 5.1): the Hello and the host's key travel encrypted; the
-- channel is in the clear (the transaction context). A control channel on its socket seals
-- every later message.
body[0x0005] = function(c, t, ctx)
    local n = c:left()
    c:add(t, pf.noise, n)
    local ch = ctx.txn:tonumber()
    -- 148 bytes: the Hello, its timestamp and flags; a data channel's flags ask for its
    -- stream sealed (docs/protocol.md 5.1). Each direction's bytes after its handshake
    -- message (frame by frame) are then sealed records.
    local sealed_data = (ch == 1 and n == 148)
    if ctx.stream and not ctx.pinfo.visited then
        streams[ctx.stream] = { channel = ch, host = ctx.src, sealed = (ch == 0),
                                sealed_data = sealed_data, handshake = { [ctx.src] = ctx.pinfo.number } }
    end
    return string.format(" ch=%d (Noise IK, %d bytes: key and Hello encrypted%s)", ch, n,
        sealed_data and "; asks for the data channel sealed" or "")
end

body[0x0006] = function(c, t, ctx) -- AuthReply: the HelloReply travels encrypted
    local n = c:left()
    c:add(t, pf.noise, n)
    local st = ctx.stream and streams[ctx.stream]
    if st and st.handshake and not ctx.pinfo.visited then
        st.handshake[ctx.src] = ctx.pinfo.number
    end
    return string.format(" (Noise IK, %d bytes: status and session encrypted)", n)
end

-- Whether a segment's bytes in frame `number` from `src` on `stream` are sealed data
-- records: a data channel that asked for it, after that direction's handshake message.
local function in_sealed_records(stream, src, number)
    local st = stream and streams[stream]
    if not (st and st.sealed_data and st.handshake) then return false end
    local after = st.handshake[src]
    return after ~= nil and number > after
end

body[0x0003] = function() return "" end -- Keepalive

body[0x0004] = function(c, t) -- Goodbye
    local code = c:uint(t, pf.goodbye_code, 2)
    c:reserved(t, nil, 2)
    if not code then return "" end
    local name = name_of(ERROR_CODES, code, "code")
    t:add_proto_expert_info(ef.goodbye, "Goodbye: " .. name)
    if code ~= 0 and code ~= 8 then
        t:add_proto_expert_info(ef.status, "Connection closed on error: " .. name)
    end
    return " " .. name
end

body[0x0101] = function(c, t, ctx) -- BufferRecvPool
    local n = c:count(t, 40)
    local refs = {}
    for i = 1, n do
        local p = t:add(pf.pool, c.tvb(c.off, 40))
        local ref = c:uint(p, pf.pool_ref, 4)
        local count = c:uint(p, pf.pool_count, 4)
        local size = c:uint(p, pf.pool_size, 4)
        c:reserved(p, nil, 4)
        local address = c:uint64(p, pf.pool_addr)
        local handle = c:uint64(p, pf.pool_handle)
        c:uint64(p, pf.pool_context)
        p:append_text(string.format(" %d: %d x %d bytes, handle %s", ref, count, size, u64hex(handle)))
        if not ctx.pinfo.visited then
            pools[ctx.src_addr .. "/" .. u64hex(handle)] =
                { ref = ref, size = size, count = count, address = address, frame = ctx.pinfo.number }
        end
        refs[i] = ref .. "(" .. size .. "x" .. count .. ")"
    end
    return " " .. table.concat(refs, ",")
end

body[0x0102] = function(c, t) -- BufferRecvPoolGet
    local size = c:uint(t, pf.get_size, 4)
    local count = c:uint(t, pf.get_count, 4)
    return size and count and string.format(" %d x %d bytes", count, size) or ""
end

body[0x0103] = function(c, t) -- BufferRecvPoolUpdate
    local n = c:count(t, 12)
    local total = 0
    local runs = {}
    for i = 1, n do
        local r = t:add(pf.run, c.tvb(c.off, 12))
        local ref = c:uint(r, pf.run_pool, 4)
        local first = c:uint(r, pf.run_first, 4)
        local count = c:uint(r, pf.run_count, 4)
        if count == 0 then r:add_proto_expert_info(ef.value, "Run of 0 elements") end
        if first + count > 0xffffffff then r:add_proto_expert_info(ef.value, "first + count overflows 32 bits") end
        r:append_text(string.format(": pool %d, elements %d..%d", ref, first, first + count - 1))
        total = total + count
        runs[i] = string.format("%d:%d+%d", ref, first, count)
    end
    generated(t, pf.credits, total)
    return string.format(" %s (%d credits)", table.concat(runs, ","), total)
end

body[0x0104] = function(c, t, ctx) -- BufferPoolFlushRequest
    local n = c:count(t, 4)
    local refs = {}
    for i = 1, n do refs[i] = c:uint(t, pf.flush_ref, 4) end
    track_request(ctx.pinfo, t, "flush", ctx.src_addr, ctx.txn)
    return " pools=" .. table.concat(refs, ",")
end

body[0x0105] = function(_, t, ctx) -- BufferPoolFlushReply
    track_reply(ctx.pinfo, t, "flush", ctx.dst_addr, ctx.txn)
    return ""
end

body[0x0201] = function(c, t, ctx) -- SendData
    local len = c:uint(t, pf.senddata_len, 4)
    if not len then return "" end
    if len ~= c:left() then
        t:add_proto_expert_info(ef.length, string.format("Length %d but %d bytes follow", len, c:left()))
    end
    local n = math.min(len, c:left())
    ctx.frame = { off = c.off, len = n }
    c:take(n)
    -- On the control channel: the express lane (protocol 6.6).
    local st = ctx.stream and streams[ctx.stream]
    local lane = (st and st.channel == 0) and " (express lane)" or ""
    return string.format(" %d bytes%s", len, lane)
end

body[0x0202] = function(c, t) -- BufferRDMAIndicate
    local ref = c:uint(t, pf.ind_pool, 4)
    local el = c:uint(t, pf.ind_element, 4)
    local len = c:uint(t, pf.ind_length, 4)
    return ref and el and len and string.format(" pool=%d elem=%d len=%d", ref, el, len) or ""
end

body[0x0301] = function(c, t, ctx) -- CfgUtilRequest
    local code = c:uint(t, pf.cfg_code, 2)
    c:reserved(t, nil, 2)
    if not code then return "" end
    if not CFG_CODES[code] then t:add_proto_expert_info(ef.unknown_code, "Unknown CfgUtil code " .. code) end
    track_request(ctx.pinfo, t, "cfg", ctx.src_addr, ctx.txn)
    local text = cfg_data(c, t, code, CFG_REQUEST_DATA, true)
    return " " .. name_of(CFG_CODES, code, "code") .. (text and (" " .. text) or "")
end

body[0x0302] = function(c, t, ctx) -- CfgUtilReply
    local code = c:uint(t, pf.cfg_code, 2)
    local status = c:uint(t, pf.cfg_status, 2)
    if not (code and status) then return "" end
    track_reply(ctx.pinfo, t, "cfg", ctx.dst_addr, ctx.txn)
    if status ~= 0 then
        t:add_proto_expert_info(ef.status, name_of(CFG_CODES, code, "code") .. ": " .. name_of(ERROR_CODES, status, "code"))
    end
    local text = cfg_data(c, t, code, CFG_REPLY_DATA, status == 0)
    return string.format(" %s %s%s", name_of(CFG_CODES, code, "code"), name_of(ERROR_CODES, status, "code"),
        text and (" " .. text) or "")
end

-- ---------------------------------------------------------------------------------------------
-- Operations

local function dissect_send(tvb, pinfo, tree, ctx)
    local len = tvb:len() - OP_HEADER_LEN
    if len > MAX_MESSAGE_LEN then
        tree:add_proto_expert_info(ef.too_long, string.format("SEND of %d bytes exceeds %d", len, MAX_MESSAGE_LEN))
    end
    if len < MSG_HEADER_LEN then
        tree:add_proto_expert_info(ef.truncated, string.format("SEND of %d bytes is shorter than the message header", len))
        info(pinfo, "SEND (truncated)")
        return
    end
    local off = OP_HEADER_LEN
    local fcode = tvb(off, 2):uint()
    -- After an authenticated handshake on channel 0, every message is sealed: no function,
    -- no fields, only its length (AuthHello and AuthReply excepted).
    local st = ctx.stream and streams[ctx.stream]
    if st and st.sealed and fcode ~= 0x0005 and fcode ~= 0x0006 then
        tree:add(pf.sealed, tvb(off, len))
        tree:append_text(", sealed")
        info(pinfo, string.format("Sealed control message (%d bytes)", len))
        return
    end
    local fname = FUNCTIONS[fcode] or string.format("Unknown function 0x%04x", fcode)
    local m = tree:add(pf.message, tvb(off, len))
    m:set_text("Message: " .. fname)
    local fi = m:add(pf.func, tvb(off, 2))
    local ver = tvb(off + 2, 2):uint()
    local vi = m:add(pf.version, tvb(off + 2, 2))
    ctx.txn = tvb(off + 4, 8):uint64()
    m:add(pf.txn, tvb(off + 4, 8))
    tree:append_text(", " .. fname)
    if ver ~= 1 and fcode ~= 0x0001 and fcode ~= 0x0005 then
        vi:add_proto_expert_info(ef.version, "Version " .. ver .. " (only 1 exists; Hello and AuthHello excepted)")
    end
    local fn = body[fcode]
    if not fn then
        fi:add_proto_expert_info(ef.func, string.format("Unknown function 0x%04x", fcode))
        if len > MSG_HEADER_LEN then m:add(pf.payload, tvb(off + MSG_HEADER_LEN, len - MSG_HEADER_LEN)) end
        info(pinfo, fname)
        return
    end
    local c = cursor(tvb, off + MSG_HEADER_LEN, tvb:len(), m)
    local summary = fname .. fn(c, m, ctx)
    c:finish()
    if ctx.frame then
        dissect_frame(tvb, ctx.frame.off, ctx.frame.len, pinfo, m, summary)
    else
        info(pinfo, summary)
    end
end

local function dissect_write(tvb, pinfo, tree, ctx, opcode)
    local len = tvb:len() - OP_HEADER_LEN
    local st = ctx.stream and streams[ctx.stream]
    if st and st.channel == 0 then
        tree:add_proto_expert_info(ef.ctrl_write, "RDMA write on channel 0: refused before placing a byte")
    end
    local handle = tvb(8, 8):uint64()
    local addr = tvb(16, 8):uint64()
    local summary
    local pool = pools[ctx.dst_addr .. "/" .. u64hex(handle)]
    local element
    if pool then
        generated(tree, pf.write_pool, pool.ref)
        generated(tree, pf.write_adv_in, pool.frame)
        if addr >= pool.address and pool.size > 0 then
            element = ((addr - pool.address) / pool.size):tonumber()
            generated(tree, pf.write_element, element)
        end
    end
    if opcode == 3 then
        local imm = tvb(24, 4):uint()
        local ipool, iel, ilen = math.floor(imm / 0x1000000), math.floor(imm / 0x10000) % 0x100, imm % 0x10000
        summary = string.format("RDMA WRITE imm pool=%d elem=%d len=%d", ipool, iel, ilen)
        if ilen ~= len then
            tree:add_proto_expert_info(ef.idata, string.format("Immediate data says %d bytes, the write has %d", ilen, len))
        end
        if pool and (pool.ref ~= ipool or (element and element ~= iel)) then
            tree:add_proto_expert_info(ef.idata, string.format(
                "Immediate data names pool %d element %d, the handle and address pool %d element %s",
                ipool, iel, pool.ref, tostring(element)))
        end
    else
        summary = string.format("RDMA WRITE handle=%s len=%d", u64hex(handle), len)
        if pool then summary = summary .. string.format(" (pool=%d elem=%s)", pool.ref, tostring(element)) end
    end
    if pool and len > pool.size then
        tree:add_proto_expert_info(ef.value, string.format("Write of %d bytes into %d-byte elements", len, pool.size))
    end
    tree:append_text(summary:gsub("^RDMA WRITE ?i?m?m?", ""))
    if len > 0 then
        dissect_frame(tvb, OP_HEADER_LEN, len, pinfo, tree, summary)
    else
        info(pinfo, summary)
    end
end

-- One operation: tvb holds exactly its header and payload (dissect_tcp_pdus saw to that).
local function dissect_op(tvb, pinfo, tree)
    if not tostring(pinfo.cols.protocol):find("^splitnet") then pinfo.cols.protocol = "splitnet" end
    local total = tvb:len()
    local t = tree:add(splitnet, tvb())
    gen_range = tvb(0, 0)
    if in_sealed_records(seg.stream, seg.src, pinfo.number) then
        t:add(pf.sealed_record, tvb())
        t:append_text(", sealed data record")
        info(pinfo, string.format("Sealed data record (%d bytes)", total))
        return total
    end
    if total < OP_HEADER_LEN then
        t:add_proto_expert_info(ef.truncated, string.format("Operation of %d bytes is shorter than its 32-byte header", total))
        info(pinfo, "splitnet (truncated)")
        return total
    end
    local opcode = tvb(0, 1):uint()
    local ctx = {
        pinfo = pinfo,
        src_addr = seg.src_addr, dst_addr = seg.dst_addr,
        src = seg.src, stream = seg.stream,
    }
    local h = t:add(pf.op, tvb(0, OP_HEADER_LEN))
    local oi = h:add(pf.opcode, tvb(0, 1))
    local r0 = h:add(pf.op_reserved, tvb(1, 3))
    h:add(pf.length, tvb(4, 4))
    local hi = h:add(pf.handle, tvb(8, 8))
    hi:add(pf.handle_slot, tvb(8, 4))
    hi:add(pf.handle_gen, tvb(12, 4))
    local ai = h:add(pf.addr, tvb(16, 8))
    local ii = h:add(pf.imm, tvb(24, 4))
    if opcode == 3 then
        ii:add(pf.imm_pool, tvb(24, 4))
        ii:add(pf.imm_element, tvb(24, 4))
        ii:add(pf.imm_length, tvb(24, 4))
    end
    local r1 = h:add(pf.op_reserved2, tvb(28, 4))
    if tvb(1, 3):uint() ~= 0 then r0:add_proto_expert_info(ef.reserved, "Reserved bytes 1..3 are not zero") end
    if tvb(28, 4):uint() ~= 0 then r1:add_proto_expert_info(ef.reserved, "Reserved bytes 28..31 are not zero") end
    if opcode == 1 and (tvb(8, 8):uint64() ~= UInt64(0) or tvb(16, 8):uint64() ~= UInt64(0)) then
        ai:add_proto_expert_info(ef.reserved, "A SEND carries no handle or address")
    end
    if opcode ~= 3 and tvb(24, 4):uint() ~= 0 then
        ii:add_proto_expert_info(ef.reserved, "Immediate data on an operation without one")
    end

    -- Which connection, which way.
    local st = ctx.stream and streams[ctx.stream]
    if st then
        generated(t, pf.channel, st.channel)
    elseif opcode == 1 and total >= OP_HEADER_LEN + MSG_HEADER_LEN + 6 and tvb(OP_HEADER_LEN, 2):uint() == 0x0001 then
        generated(t, pf.channel, tvb(OP_HEADER_LEN + MSG_HEADER_LEN + 5, 1):uint()) -- this Hello's
    elseif opcode == 1 and total >= OP_HEADER_LEN + MSG_HEADER_LEN and tvb(OP_HEADER_LEN, 2):uint() == 0x0005 then
        generated(t, pf.channel, tvb(OP_HEADER_LEN + 11, 1):uint()) -- this AuthHello's, in the clear
    end
    local to_ioc
    if st and st.host then to_ioc = (st.host == ctx.src) else to_ioc = (seg.dst_port == seg.port) end
    generated(t, pf.direction, to_ioc and "host -> IOC" or "IOC -> host")

    if not OPCODES[opcode] then
        oi:add_proto_expert_info(ef.opcode, string.format("Unknown opcode %d (stream out of step or not splitnet)", opcode))
        info(pinfo, string.format("Unknown opcode %d", opcode))
        return total
    end
    t:append_text(": " .. OPCODES[opcode])
    if total - OP_HEADER_LEN ~= tvb(4, 4):uint() then
        t:add_proto_expert_info(ef.truncated, string.format("Header announces %d payload bytes, %d present",
            tvb(4, 4):uint(), total - OP_HEADER_LEN))
    end
    if opcode == 1 then
        dissect_send(tvb, pinfo, t, ctx)
    else
        dissect_write(tvb, pinfo, t, ctx, opcode)
    end
    return total
end

-- Length of the operation at OFFSET (header and payload). A header that cannot be splitnet
-- takes the rest of the segment, which is then reported instead of waiting for megabytes.
local function op_len(tvb, pinfo, offset)
    if in_sealed_records(seg.stream, seg.src, pinfo.number) then
        return 2 + tvb(offset, 2):uint()
    end
    local opcode = tvb(offset, 1):uint()
    local len = tvb(offset + 4, 4):uint()
    if not OPCODES[opcode] or len > MAX_OP_PAYLOAD then
        return tvb:len() - offset
    end
    return OP_HEADER_LEN + len
end

function splitnet.dissector(tvb, pinfo, tree)
    -- TCP may call this more than once per frame (a reassembled operation, then the rest of
    -- the segment), and a frame inside a write rewrites pinfo's addresses and ports, so the
    -- fabric's are kept in the frame's private table at the first call.
    local p = pinfo.private
    if not p["splitnet_src"] then
        local s = f_tcp_stream()
        p["splitnet_src"] = tostring(pinfo.src)
        p["splitnet_dst"] = tostring(pinfo.dst)
        p["splitnet_sport"] = tostring(pinfo.src_port)
        p["splitnet_dport"] = tostring(pinfo.dst_port)
        p["splitnet_stream"] = s and tostring(s.value) or ""
    end
    seg = {
        src_addr = p["splitnet_src"], dst_addr = p["splitnet_dst"],
        src = p["splitnet_src"] .. ":" .. p["splitnet_sport"],
        dst_port = tonumber(p["splitnet_dport"]), port = splitnet.prefs.tcp_port,
        stream = tonumber(p["splitnet_stream"]),
    }
    dissect_tcp_pdus(tvb, tree, OP_HEADER_LEN, op_len, dissect_op, true)
    return tvb:len()
end

-- ---------------------------------------------------------------------------------------------
-- Registration: the TCP port (a preference), "Decode As", and a heuristic for other ports
-- that accepts a connection whose segment starts with a plausible SEND of a known message.

local tcp_port_table = DissectorTable.get("tcp.port")
local registered_port = DEFAULT_PORT
tcp_port_table:add(registered_port, splitnet)
tcp_port_table:add_for_decode_as(splitnet)

function splitnet.prefs_changed()
    if splitnet.prefs.tcp_port ~= registered_port then
        if registered_port ~= 0 then tcp_port_table:remove(registered_port, splitnet) end
        registered_port = splitnet.prefs.tcp_port
        if registered_port ~= 0 then tcp_port_table:add(registered_port, splitnet) end
    end
end

local function heuristic(tvb, pinfo, tree)
    if tvb:len() < OP_HEADER_LEN + MSG_HEADER_LEN then return false end
    -- SEND, reserved bytes, handle, address, immediate data and reserved word all zero
    if tvb(0, 4):uint() ~= 0x01000000 or tvb(24, 4):uint() ~= 0 or tvb(28, 4):uint() ~= 0 then
        return false
    end
    if tvb(8, 8):uint64() ~= UInt64(0) or tvb(16, 8):uint64() ~= UInt64(0) then return false end
    local len = tvb(4, 4):uint()
    if len < MSG_HEADER_LEN or len > MAX_MESSAGE_LEN then return false end
    if not FUNCTIONS[tvb(OP_HEADER_LEN, 2):uint()] then return false end
    local ver = tvb(OP_HEADER_LEN + 2, 2):uint()
    local fcode = tvb(OP_HEADER_LEN, 2):uint()
    if ver ~= 1 and fcode ~= 0x0001 and fcode ~= 0x0005 then return false end
    pinfo.conversation = splitnet
    splitnet.dissector(tvb, pinfo, tree)
    return true
end
splitnet:register_heuristic("tcp", heuristic)
