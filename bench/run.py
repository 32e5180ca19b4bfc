#!/usr/bin/env python3
"""splitnet against its peers, in one invocation, on the reference topology.

Measures direct veth (the limit), kernel VXLAN + bridge, OpenVPN tap (cipher none) + bridge,
and splitnet: each daemon's idle CPU, iperf3 TCP each way (best of N runs), ping RTT (every
5 ms; every 0.2 s; every 10 ms beside an iperf3 upload and beside a download, each at full
speed and paced to 2 Gb/s), TCP request/response latency (sockperf ping-pong, 64-byte
messages: one-way), every latency as average and p99, CPU seconds and TCP retransmits per
GB moved; then splitnet with 1, 2, 4 and 8 hosts sharing one IOC (aggregate), one
host with 1 and 2 TAP queues under 4 TCP flows, and the slow-consumer figure (a host that
stops reading while the LAN floods it: the other host's throughput before and during). Prints a table of absolute figures and
ratios, writes bench/out/results.json and bench/out/chart.svg. Ports mode (lan.mode = "ports")
is measured on a Linux bridge (splitnet-ports, by default) and, with --only, on Open vSwitch's
userspace datapath without offloads (splitnet-ports-ovs) and with userspace TSO
(splitnet-ports-ovs-tso), both with net.core.rmem_default raised as README advises; its ratios to shared mode over TCP are ports_*_vs_splitnet.

    sudo bench/run.py [--seconds 5] [--runs 3] [--hosts 1,2,4,8] [--queues 1,2]
                      [--only direct,vxlan,...] [--sched fifo:10|nice:-10] [--express]
                      [--spin-max-us US] [--ioc-spin-max-us US] [--busy] [--rx-ring]
    sudo bench/run.py --syscalls [--seconds 5]   # the daemons' system calls per frame (perf)
    sudo bench/run.py --profile [--seconds 5]    # where the daemons' CPU goes (perf record)

Needs root, iperf3, sockperf, openvpn, iputils-ping, iproute2, and `cargo build --release` done.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SPLITNET_BIN") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release"
)
OUT = os.path.join(ROOT, "bench", "out")
WORKERS = None  # the IOC's fabric.workers (--workers); None: the shipped configuration's
SPIN_MAX_US = None  # the hosts' fabric.spin_max_us (--spin-max-us); None: the shipped one's
IOC_SPIN_MAX_US = None  # the IOC's fabric.spin_max_us (--ioc-spin-max-us); None: the shipped one's
SCHED = None  # both daemons' [scheduling] (--sched fifo:P or nice:N); None: the shipped "normal"
EXPRESS = False  # the hosts' fabric.express (--express); the shipped host.toml has it off
BUSY = False  # both daemons' fabric.busy_poll (--busy); the shipped configurations have it off
RX_RING = False  # the IOC's lan.rx_ring (--rx-ring); the shipped configuration has it off
RX_QUEUES = None  # the IOC's lan.rx_queues (--rx-queues); None: the shipped configuration's
NS = ["sd-host", "sd-ioc", "sd-lan"] + [f"sd-host{k}" for k in range(2, 9)]
procs = []


def sh(cmd, check=True, **kw):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd}: {r.stderr.strip()}")
    return r.stdout


def bg(cmd, log):
    p = subprocess.Popen(cmd, shell=True, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    procs.append(p)
    return p


def cleanup():
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    procs.clear()
    sh("pkill -9 -f 'openvpn --dev tap' ; true", check=False)
    if RMEM_DEFAULT:
        sh(f"sysctl -qw net.core.rmem_default={RMEM_DEFAULT.pop()}", check=False)
    for n in NS:
        sh(f"ip netns del {n}", check=False)


def base(hosts=1, bridge_fabric=False):
    cleanup()
    for n in ["sd-ioc", "sd-lan"]:
        sh(f"ip netns add {n}; ip -n {n} link set lo up")
    sh("ip link add lan0 netns sd-ioc type veth peer name lan1 netns sd-lan")
    sh("ip -n sd-ioc link set lan0 up")
    sh("ip -n sd-lan addr add 10.50.0.2/24 dev lan1; ip -n sd-lan link set lan1 up")
    if not bridge_fabric:
        sh("ip netns add sd-host; ip -n sd-host link set lo up")
        sh("ip link add fab0 netns sd-host type veth peer name fab1 netns sd-ioc")
        sh("ip -n sd-host addr add 10.200.0.1/24 dev fab0; ip -n sd-host link set fab0 up")
        sh("ip -n sd-ioc addr add 10.200.0.2/24 dev fab1; ip -n sd-ioc link set fab1 up")
        return
    sh("ip -n sd-ioc link add fabbr type bridge; ip -n sd-ioc addr add 10.200.0.2/24 dev fabbr")
    sh("ip -n sd-ioc link set fabbr up")
    for k in range(1, hosts + 1):
        ns = host_ns(k)
        sh(f"ip netns add {ns}; ip -n {ns} link set lo up")
        sh(f"ip link add fab0 netns {ns} type veth peer name fab{2*k-1} netns sd-ioc")
        ip = "10.200.0.1" if k == 1 else f"10.200.0.{10+k}"
        sh(f"ip -n {ns} addr add {ip}/24 dev fab0; ip -n {ns} link set fab0 up")
        sh(f"ip -n sd-ioc link set fab{2*k-1} master fabbr; ip -n sd-ioc link set fab{2*k-1} up")


def host_ns(k):
    return "sd-host" if k == 1 else f"sd-host{k}"


def host_ip(k):
    return "10.50.0.1" if k == 1 else f"10.50.0.{k+1}"


def setup_direct():
    cleanup()
    for n in ["sd-host", "sd-lan"]:
        sh(f"ip netns add {n}; ip -n {n} link set lo up")
    sh("ip link add h0 netns sd-host type veth peer name lan1 netns sd-lan")
    sh("ip -n sd-host addr add 10.50.0.1/24 dev h0; ip -n sd-host link set h0 up")
    sh("ip -n sd-lan addr add 10.50.0.2/24 dev lan1; ip -n sd-lan link set lan1 up")


def setup_vxlan():
    base()
    sh("ip -n sd-host link add gt0 type vxlan id 42 local 10.200.0.1 remote 10.200.0.2 dstport 4789")
    sh("ip -n sd-host addr add 10.50.0.1/24 dev gt0; ip -n sd-host link set gt0 up")
    sh("ip -n sd-ioc link add gt1 type vxlan id 42 local 10.200.0.2 remote 10.200.0.1 dstport 4789")
    sh("ip -n sd-ioc link add br0 type bridge; ip -n sd-ioc link set gt1 master br0")
    sh("ip -n sd-ioc link set lan0 master br0; ip -n sd-ioc link set gt1 up; ip -n sd-ioc link set br0 up")


def setup_openvpn():
    base()
    common = ("--dev-type tap --proto udp --cipher none --auth none --data-ciphers none "
              "--allow-compression no --verb 0")
    bg(f"ip netns exec sd-ioc openvpn --dev tap1 {common} --local 10.200.0.2 --lport 1194 "
       f"--remote 10.200.0.1 --rport 1194", "/tmp/sd-ovpn1.log")
    bg(f"ip netns exec sd-host openvpn --dev tap0 {common} --local 10.200.0.1 --lport 1194 "
       f"--remote 10.200.0.2 --rport 1194", "/tmp/sd-ovpn0.log")
    time.sleep(2)
    sh("ip -n sd-host addr add 10.50.0.1/24 dev tap0; ip -n sd-host link set tap0 up")
    sh("ip -n sd-ioc link add br0 type bridge; ip -n sd-ioc link set tap1 master br0")
    sh("ip -n sd-ioc link set lan0 master br0; ip -n sd-ioc link set tap1 up; ip -n sd-ioc link set br0 up")
    time.sleep(1)


def wait_carrier(ns, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        if "LOWER_UP" in sh(f"ip -n {ns} link show sd0", check=False):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sd0 in {ns} has no carrier")


KEYS = "/tmp/sd-bench-keys"
KEY_HOSTS = 8


def keys():
    """The keys an operator makes (README, "Admitting a host"): the IOC's in KEYS/ioc.key,
    host K's in KEYS/hostK/splitnet.key (its credential directory); returns the IOC's public
    key and the hosts' public keys. Made once per invocation."""
    ctl = os.path.join(BIN, "splitnetctl")
    if not os.path.exists(os.path.join(KEYS, "ioc.pub")):
        os.makedirs(KEYS, mode=0o700, exist_ok=True)
        old = os.umask(0o077)
        try:
            for name in ["ioc"] + [f"host{k}/splitnet" for k in range(1, KEY_HOSTS + 1)]:
                key = os.path.join(KEYS, name + ".key")
                os.makedirs(os.path.dirname(key), exist_ok=True)
                sh(f"{ctl} genkey >{key} && {ctl} pubkey <{key} >{key[:-4]}.pub")
        finally:
            os.umask(old)
    read = lambda name: open(os.path.join(KEYS, name + ".pub")).read().strip()
    return read("ioc"), [read(f"host{k}/splitnet") for k in range(1, KEY_HOSTS + 1)]


def host_config(queues, local=None, plain=False, sealed=False):
    """The shipped host configuration with the IOC's public key (none when `plain`: the
    unauthenticated handshake of open admission), `queues` TAP queues; `local`: over the IOC's
    local socket, the data channel in shared memory ("shm") or on the socket ("unix");
    `sealed`: the data channel encrypted (auth.encrypt_data)."""
    src = os.path.join(ROOT, "systemd", "host.toml")
    path = f"/tmp/sd-bench-host-{queues}q-{local}-{SPIN_MAX_US}-{SCHED}-{int(BUSY)}-{int(plain)}-{int(sealed)}-{int(EXPRESS)}.toml"
    ioc_pub, _ = keys()
    with open(src) as f, open(path, "w") as out:
        text = f.read().replace("\nqueues = 1\n", f"\nqueues = {queues}\n")
        if not plain:
            text = text.replace("\n# ioc_public_key = ", f'\nioc_public_key = "{ioc_pub}"\n# was: ')
        if sealed:
            text = text.replace("\n# encrypt_data = false\n", "\nencrypt_data = true\n")
        if local:
            shm = "true" if local == "shm" else "false"
            text = text.replace('\nioc = "10.200.0.2:7400"\n', f'\nioc = "unix:{LOCAL_SOCKET}"\n')
            text = text.replace("\nshared_memory = true\n", f"\nshared_memory = {shm}\n")
        if SPIN_MAX_US is not None:
            text = text.replace("\nspin_max_us = 0\n", f"\nspin_max_us = {SPIN_MAX_US}\n")
        if EXPRESS:
            text = text.replace("\nexpress = false\n", "\nexpress = true\n")
        text = with_busy(text)
        text = with_sched(text)
        out.write(text)
    return path


LOCAL_SOCKET = "/tmp/sd-bench-fabric.sock"


def with_busy(text):
    """A daemon's TOML `text` with fabric.busy_poll set when --busy."""
    if not BUSY:
        return text
    if "\nbusy_poll = false\n" not in text:
        sys.exit("no 'busy_poll = false' line in the shipped configuration")
    return text.replace("\nbusy_poll = false\n", "\nbusy_poll = true\n")


def with_sched(text):
    """A daemon's TOML `text` with its [scheduling] class from --sched ("fifo:10", "nice:-10")."""
    if SCHED is None:
        return text
    cls, value = SCHED.split(":")
    key = {"fifo": "priority", "nice": "nice"}[cls]
    new = f'\nclass = "{cls}"\n{key} = {int(value)}\n'
    if '\nclass = "normal"\n' not in text:
        sys.exit("no 'class = \"normal\"' line in the shipped configuration")
    return text.replace('\nclass = "normal"\n', new)


def ioc_config(local=False, plain=False, ports=None):
    """The shipped IOC configuration with its key and the bench's hosts admitted (`plain`:
    open admission), with `--workers` workers when given, and listening on LOCAL_SOCKET too
    when `local`; `ports` ("bridge", "ovs", "ovs-tso"): in ports mode, each host's port in
    sd-ioc's br0 (joined directly, or by hooks/port-ovs)."""
    src = os.path.join(ROOT, "systemd", "ioc.toml")
    path = f"/tmp/sd-bench-ioc-{WORKERS}w-{RX_QUEUES}rq-{int(RX_RING)}r-{SCHED}-{IOC_SPIN_MAX_US}-{int(BUSY)}-{int(local)}-{int(plain)}-{ports}.toml"
    _, host_pubs = keys()
    with open(src) as f, open(path, "w") as out:
        text = with_busy(with_sched(f.read()))
        if WORKERS is not None:
            text = text.replace("\nworkers = 0\n", f"\nworkers = {WORKERS}\n")
        if RX_QUEUES is not None:
            text = text.replace("\nrx_queues = 1\n", f"\nrx_queues = {RX_QUEUES}\n")
        if RX_RING:
            if "\nrx_ring = false\n" not in text:
                sys.exit("no 'rx_ring = false' line in the shipped ioc.toml")
            text = text.replace("\nrx_ring = false\n", "\nrx_ring = true\n")
        if IOC_SPIN_MAX_US is not None:
            if "\nspin_max_us = 0\n" not in text:
                sys.exit("no 'spin_max_us = 0' line in the shipped ioc.toml")
            text = text.replace("\nspin_max_us = 0\n", f"\nspin_max_us = {IOC_SPIN_MAX_US}\n")
        if local:
            text = text.replace("\n[lan]\n", f'\nlisten_local = "{LOCAL_SOCKET}"\n\n[lan]\n', 1)
        text = text.replace("\n# private_key_file = ", f'\nprivate_key_file = "{KEYS}/ioc.key"\n# was: ')
        if plain:
            text = text.replace('\nadmission = "keys"\n', '\nadmission = "open"\n')
        if ports:
            lan = '\nmode = "ports"\n' + ('bridge = "br0"\n' if ports == "bridge" else
                                           f'port_hook = "{ROOT}/hooks/port-ovs"\n')
            text, n = re.subn(r'\ninterface = [^\n]*\n', lan, text, count=1)
            if ports == "ovs":
                # OVS's userspace datapath reads the ports as plain packet sockets.
                text = text.replace("\noffload = true\n", "\noffload = false\n")
            if not n:
                sys.exit("no lan.interface line in the shipped ioc.toml")
        for k, pub in enumerate(host_pubs, 1):
            # Every queue count the bench runs a host with ([[auth.hosts]] queues).
            text += f'\n[[auth.hosts]]\nname = "host{k}"\npublic_key = "{pub}"\nqueues = 16\n'
        out.write(text)
    return path


OVS_DIR = "/tmp/sd-bench-ovs"
# The machine's net.core.rmem_default while an OVS mode raised it (cleanup puts it back).
RMEM_DEFAULT = []
# What README advises for OVS's userspace datapath: the packet socket it reads each port
# with takes the default receive buffer, which at 208 KiB holds three 64 KiB TSO frames.
OVS_RMEM = 4 << 20


def switch_up(ports):
    """sd-ioc's switch for ports mode: br0 holding lan0, a Linux bridge or an Open vSwitch
    of the bench's own (userspace datapath, files in OVS_DIR; "ovs-tso": with userspace TSO;
    net.core.rmem_default at OVS_RMEM meanwhile, the machine's own: not namespaced).
    Returns the environment the IOC's hook needs."""
    if ports == "bridge":
        sh("ip -n sd-ioc link add br0 type bridge; ip -n sd-ioc link set lan0 master br0")
        sh("ip -n sd-ioc link set br0 up")
        return ""
    shutil.rmtree(OVS_DIR, ignore_errors=True)
    os.makedirs(OVS_DIR)
    with open("/proc/sys/net/core/rmem_default") as f:
        RMEM_DEFAULT.append(int(f.read()))
    sh(f"sysctl -qw net.core.rmem_default={OVS_RMEM}")
    d = OVS_DIR
    env = f"env OVS_RUNDIR={d} OVS_LOGDIR={d} OVS_DBDIR={d}"
    sh(f"ovsdb-tool create {d}/conf.db /usr/share/openvswitch/vswitch.ovsschema")
    bg(f"ip netns exec sd-ioc {env} ovsdb-server {d}/conf.db --remote=punix:{d}/db.sock "
       f"--pidfile={d}/ovsdb.pid --unixctl={d}/ovsdb.ctl", f"{d}/ovsdb-server.out")
    vsctl = f"ovs-vsctl --timeout=10 --db=unix:{d}/db.sock"
    for _ in range(100):
        if os.path.exists(f"{d}/db.sock"):
            break
        time.sleep(0.05)
    sh(f"{vsctl} --no-wait init")
    if ports == "ovs-tso":
        sh(f"{vsctl} --no-wait set Open_vSwitch . other_config:userspace-tso-enable=true")
    else:
        # Without userspace TSO, OVS forwards what it reads from lan0 as it is: a veth
        # peer's frames with their checksums left to offload would reach the hosts unfinished
        # (a real NIC's frames arrive complete), so the LAN peer computes its own.
        sh("ip netns exec sd-lan ethtool -K lan1 tx off")
    bg(f"ip netns exec sd-ioc {env} ovs-vswitchd unix:{d}/db.sock --pidfile={d}/vswitchd.pid "
       f"--unixctl={d}/vswitchd.ctl", f"{d}/ovs-vswitchd.out")
    sh(f"{vsctl} add-br br0 -- set bridge br0 datapath_type=netdev -- add-port br0 lan0")
    return f"SPLITNET_OVS_BRIDGE=br0 SPLITNET_OVS_DB=unix:{d}/db.sock "


def setup_splitnet(hosts=1, queues=1, drivers=None, local=None, plain=False, sealed=False,
                   ports=None):
    """The IOC and `drivers` (default: all) of `hosts` host namespaces with a host-driver;
    `local` ("shm", "unix"): over the IOC's local Unix socket (daemons on one machine);
    `plain`: open admission and hosts without keys (no handshake proof, control unsealed);
    `sealed`: hosts that encrypt their data channel; `ports`: the IOC in ports mode on a
    switch of that kind (switch_up)."""
    base(hosts, bridge_fabric=hosts > 1)
    env = switch_up(ports) if ports else ""
    bg(f"{env}ip netns exec sd-ioc {BIN}/ioc-driver --config {ioc_config(local is not None, plain, ports)}"
       " --control-socket /tmp/sd-bench-ioc.sock", "/tmp/sd-bench-ioc.log")
    time.sleep(0.5)
    drivers = hosts if drivers is None else drivers
    for k in range(1, drivers + 1):
        ns = host_ns(k)
        bg(f"CREDENTIALS_DIRECTORY={KEYS}/host{k} ip netns exec {ns} {BIN}/host-driver"
           f" --config {host_config(queues, local, plain, sealed)}"
           f" --control-socket /tmp/sd-bench-host{k}.sock", f"/tmp/sd-bench-host{k}.log")
        for _ in range(100):
            if sh(f"ip -n {ns} link show sd0", check=False):
                break
            time.sleep(0.05)
        sh(f"ip -n {ns} addr add {host_ip(k)}/24 dev sd0; ip -n {ns} link set sd0 up")
    for k in range(1, drivers + 1):
        wait_carrier(host_ns(k))
    time.sleep(0.5)


def cpu_busy():
    """System-wide busy CPU seconds so far (all cores)."""
    with open("/proc/stat") as f:
        v = list(map(int, f.readline().split()[1:]))
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def iperf(ns_list, secs, reverse=False, parallel=1):
    """Concurrent iperf3 clients (`parallel` flows each) from each namespace; returns
    (Gb/s sum, bytes, cpu s, TCP retransmits of the senders)."""
    servers = []
    for i, _ in enumerate(ns_list):
        servers.append(bg(f"ip netns exec sd-lan iperf3 -s -1 -p {5300+i}", f"/tmp/sd-bench-srv{i}.log"))
    time.sleep(0.4)
    c0 = cpu_busy()
    clients = [subprocess.Popen(
        f"ip netns exec {ns} iperf3 -c 10.50.0.2 -p {5300+i} -t {secs} -P {parallel} -J"
        f" {'-R' if reverse else ''}",
        shell=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for i, ns in enumerate(ns_list)]
    outs = [c.communicate(timeout=secs + 30)[0] for c in clients]
    c1 = cpu_busy()
    gbps, nbytes, retrans = 0.0, 0, 0
    for o in outs:
        d = json.loads(o)
        if "error" in d:
            raise RuntimeError(d["error"])
        s = d["end"]["sum_received"]
        gbps += s["bits_per_second"] / 1e9
        nbytes += s["bytes"]
        # The sender's count (the server's, with -R: iperf3 passes it back at the end).
        retrans += d["end"].get("sum_sent", {}).get("retransmits", 0) or 0
    for s in servers:
        try:
            os.killpg(s.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return gbps, nbytes, c1 - c0, retrans


def ping(ns="sd-host", count=300, interval=0.005):
    out = sh(f"ip netns exec {ns} ping -c {count} -i {interval} 10.50.0.2", check=False)
    rtts = sorted(float(l.split("time=")[1].split()[0]) * 1000 for l in out.splitlines() if "time=" in l)
    if not rtts:
        return None, None
    return sum(rtts) / len(rtts), rtts[min(len(rtts) - 1, int(0.99 * len(rtts)))]


def sockperf(secs):
    """TCP ping-pong of 64-byte messages from the host to the LAN for `secs` seconds, one at a
    time: the request/response latency an RPC or a shell sees. Returns sockperf's one-way
    latency (half the round trip) in us: (average, p99)."""
    srv = bg("ip netns exec sd-lan sockperf server --tcp -i 10.50.0.2 -p 11111",
             "/tmp/sd-bench-sockperf-srv.log")
    time.sleep(0.5)
    out = sh(f"ip netns exec sd-host sockperf ping-pong --tcp -i 10.50.0.2 -p 11111 -m 64 -t {secs}",
             check=False)
    try:
        os.killpg(srv.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    avg = p99 = None
    for line in out.splitlines():
        if "avg-latency=" in line:
            avg = float(line.split("avg-latency=")[1].split()[0])
        elif "percentile 99.000 =" in line:
            p99 = float(line.split("=")[-1])
    return avg, p99


def ping_under_load(secs, reverse, rate=None):
    """Ping every 10 ms while one iperf3 flow runs (upload, or download with `reverse`), at
    full speed or paced to `rate` (iperf3 -b, "2G"): how long interactive traffic waits
    behind bulk. Returns (avg us, p99 us, bulk Gb/s)."""
    srv = bg("ip netns exec sd-lan iperf3 -s -1 -p 5399", "/tmp/sd-bench-load-srv.log")
    time.sleep(0.4)
    pace = f"-b {rate}" if rate else ""
    bulk = subprocess.Popen(
        f"ip netns exec sd-host iperf3 -c 10.50.0.2 -p 5399 -t {secs + 2} {pace} -J"
        f" {'-R' if reverse else ''}",
        shell=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(1)
    avg, p99 = ping(count=secs * 100, interval=0.01)
    out = bulk.communicate(timeout=secs + 30)[0]
    try:
        os.killpg(srv.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        gbps = json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9
    except (ValueError, KeyError):
        gbps = None
    return avg, p99, gbps


def daemons_of(mode):
    """The processes that carry `mode`'s traffic, by name (none: the kernel alone)."""
    if mode.startswith("splitnet-ports-ovs"):
        return ("ioc-driver", "host-driver", "ovs-vswitchd")
    if mode.startswith("splitnet"):
        return ("ioc-driver", "host-driver")
    return ("openvpn",) if mode == "openvpn" else ()


def cpu_ticks(name):
    """User and system clock ticks so far of every process called `name`."""
    total = 0
    for pid in sh(f"pgrep -x {name}", check=False).split():
        try:
            with open(f"/proc/{pid}/stat") as f:
                # Fields after the command (which may hold spaces): utime and stime are the
                # 12th and 13th.
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (FileNotFoundError, IndexError, ValueError):
            pass
    return total


def idle_cpu(mode, secs=5):
    """Per daemon of `mode`, the share of one core (%) it used over `secs` seconds with no
    traffic: what an idle link costs (its timers, keepalives and polls)."""
    names = daemons_of(mode)
    before = {n: cpu_ticks(n) for n in names}
    time.sleep(secs)
    tick = os.sysconf("SC_CLK_TCK")
    return {n: round(100 * (cpu_ticks(n) - before[n]) / tick / secs, 2) for n in names}


# The ping probes beside a transfer: (key, reverse, rate). "up"/"down" at full speed, "up2g"/
# "down2g" paced to 2 Gb/s (a moderate load: the wait behind bulk rather than for a core).
LOAD_PROBES = (("upload", False, None), ("download", True, None), ("upload_2g", False, "2G"),
               ("download_2g", True, "2G"))


def measure(name, setup, secs, runs):
    setup()
    r = {"mode": name}
    # Before any traffic: settled after its start, nothing to do but stay alive.
    time.sleep(1)
    r["idle_cpu_pct"] = idle_cpu(name)
    for d, rev in (("tx", False), ("rx", True)):
        best, cpu_per_gb, retrans_per_gb = 0.0, None, None
        for _ in range(runs):
            gbps, nbytes, cpu, retrans = iperf(["sd-host"], secs, rev)
            if gbps > best:
                best, cpu_per_gb = gbps, cpu / (nbytes / 1e9) if nbytes else None
                retrans_per_gb = retrans / (nbytes / 1e9) if nbytes else None
        r[f"{d}_gbps"] = round(best, 2)
        r[f"{d}_cpu_s_per_gb"] = round(cpu_per_gb, 3) if cpu_per_gb else None
        r[f"{d}_retrans_per_gb"] = round(retrans_per_gb, 1) if retrans_per_gb is not None else None
    avg, p99 = ping()
    r["ping_avg_us"] = round(avg) if avg else None
    r["ping_avg_p99_us"] = round(p99) if p99 else None
    avg, p99 = ping(count=25, interval=0.2)
    r["ping_idle_us"] = round(avg) if avg else None
    r["ping_idle_p99_us"] = round(p99) if p99 else None
    avg, p99 = sockperf(secs)
    r["rr_oneway_us"] = round(avg, 1) if avg else None
    r["rr_oneway_p99_us"] = round(p99, 1) if p99 else None
    for k, rev, rate in LOAD_PROBES:
        avg, p99, gbps = ping_under_load(secs, rev, rate)
        r[f"ping_{k}_us"] = round(avg) if avg else None
        r[f"ping_{k}_p99_us"] = round(p99) if p99 else None
        r[f"{k}_gbps"] = round(gbps, 2) if gbps else None
    if name.startswith("splitnet"):
        r["rss_kib"] = {p: rss(p) for p in ("ioc-driver", "host-driver")}
    cleanup()
    print(f"  {name:<14} tx {r['tx_gbps']:>6} Gb/s  rx {r['rx_gbps']:>6} Gb/s  "
          f"ping {r['ping_avg_us']} us (p99 {r['ping_avg_p99_us']}), every 0.2 s {r['ping_idle_us']} us "
          f"(p99 {r['ping_idle_p99_us']}), beside an upload {r['ping_upload_us']} us "
          f"(p99 {r['ping_upload_p99_us']}), a download {r['ping_download_us']} us "
          f"(p99 {r['ping_download_p99_us']}), a 2 Gb/s upload {r['ping_upload_2g_us']} us "
          f"(p99 {r['ping_upload_2g_p99_us']}), a 2 Gb/s download {r['ping_download_2g_us']} us "
          f"(p99 {r['ping_download_2g_p99_us']}), "
          f"TCP request/response one-way {r['rr_oneway_us']} us (p99 {r['rr_oneway_p99_us']}), "
          f"retransmits per GB {r['tx_retrans_per_gb']} up, {r['rx_retrans_per_gb']} down, "
          f"idle CPU % of a core {r['idle_cpu_pct']}",
          flush=True)
    return r


def rss(proc):
    out = sh(f"pgrep -x {proc}", check=False).split()
    for pid in out:
        try:
            with open(f"/proc/{pid}/status") as f:
                for l in f:
                    if l.startswith("VmRSS"):
                        return int(l.split()[1])
        except FileNotFoundError:
            pass
    return None


def scale(hosts_list, secs):
    res = []
    for n in hosts_list:
        setup_splitnet(n)
        gbps, _, _, _ = iperf([host_ns(k) for k in range(1, n + 1)], secs)
        rgbps, _, _, _ = iperf([host_ns(k) for k in range(1, n + 1)], secs, reverse=True)
        cleanup()
        res.append({"hosts": n, "tx_gbps": round(gbps, 2), "rx_gbps": round(rgbps, 2)})
        print(f"  {n} host(s): aggregate tx {gbps:.2f} Gb/s, rx {rgbps:.2f} Gb/s", flush=True)
    return res


def slow_consumer(secs):
    """Two hosts on one IOC: a real host-driver, and a host that keeps its session alive but
    never reads its data channel (examples/rogue `slow`) while the LAN floods it with 800 Mb/s
    of UDP. Returns the good host's LAN->host throughput before and during the flood."""
    rogue = os.path.join(BIN, "examples", "rogue")
    if not os.access(rogue, os.X_OK):
        print("  skipped: no examples/rogue (cargo build --release --examples)", flush=True)
        return None
    # The rogue speaks the plain handshake: open admission.
    setup_splitnet(2, drivers=1, plain=True)
    before, _, _, _ = iperf(["sd-host"], secs, reverse=True)
    slow = bg(f"ip netns exec sd-host2 {rogue} slow 10.200.0.2:7400 {secs * 3 + 10}",
              "/tmp/sd-bench-slow.log")
    mac = None
    for _ in range(100):
        with open("/tmp/sd-bench-slow.log") as f:
            mac = next((l.split()[1] for l in f if l.startswith("mac ")), None)
        if mac:
            break
        time.sleep(0.05)
    if not mac:
        cleanup()
        raise RuntimeError("the slow host did not connect")
    sh(f"ip -n sd-lan neigh replace 10.50.0.99 lladdr {mac} dev lan1 nud permanent")
    bg(f"ip netns exec sd-lan python3 {ROOT}/tests/udp_flood.py 10.50.0.99 9 800 {secs * 2 + 4}",
       "/tmp/sd-bench-flood.log")
    time.sleep(2)
    during, _, _, _ = iperf(["sd-host"], secs, reverse=True)
    alive = slow.poll() is None
    cleanup()
    r = {"good_rx_before_gbps": round(before, 2), "good_rx_during_gbps": round(during, 2),
         "ratio": round(during / before, 2) if before else None, "slow_host_kept": alive}
    print(f"  good host LAN->host {before:.2f} Gb/s before, {during:.2f} Gb/s while the slow host"
          f" is flooded ({r['ratio']}x); slow host still connected: {alive}", flush=True)
    return r


def queues(queue_list, secs, flows=4):
    """One host with 1, 2, ... TAP queues (a thread and a session each), `flows` TCP flows."""
    res = []
    for q in queue_list:
        setup_splitnet(1, queues=q)
        gbps, _, _, _ = iperf(["sd-host"], secs, parallel=flows)
        rgbps, _, _, _ = iperf(["sd-host"], secs, reverse=True, parallel=flows)
        cleanup()
        res.append({"queues": q, "flows": flows, "tx_gbps": round(gbps, 2), "rx_gbps": round(rgbps, 2)})
        print(f"  {q} queue(s), {flows} flows: tx {gbps:.2f} Gb/s, rx {rgbps:.2f} Gb/s", flush=True)
    return res


def svg(results, scaling, path):
    """Two bar charts as plain SVG: tx/rx per mode and the multi-host aggregate; then the
    latencies of each mode on a log scale (they span from tens of us to milliseconds)."""
    import math
    w, h, pad = 760, 340, 50
    vmax = max([r["tx_gbps"] for r in results] + [r["rx_gbps"] for r in results] +
               [s["tx_gbps"] for s in scaling] + [1])
    items = [(r["mode"], r["tx_gbps"], r["rx_gbps"]) for r in results]
    items += [(f"{s['hosts']}h agg", s["tx_gbps"], s["rx_gbps"]) for s in scaling]
    bw = (w - 2 * pad) / max(len(items), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{2 * h}" font-family="sans-serif" font-size="11">',
             f'<text x="{pad}" y="20" font-size="14">iperf3 TCP throughput (Gb/s): tx dark, rx light</text>']
    for i, (name, tx, rx) in enumerate(items):
        x = pad + i * bw
        for j, (v, color) in enumerate(((tx, "#2b5c8a"), (rx, "#8ab6e0"))):
            bh = (h - 2 * pad) * v / vmax
            parts.append(f'<rect x="{x + 4 + j * (bw - 8) / 2:.1f}" y="{h - pad - bh:.1f}" '
                         f'width="{(bw - 8) / 2:.1f}" height="{bh:.1f}" fill="{color}"/>')
            parts.append(f'<text x="{x + 4 + j * (bw - 8) / 2:.1f}" y="{h - pad - bh - 3:.1f}">{v:.1f}</text>')
        parts.append(f'<text x="{x + 4:.1f}" y="{h - pad + 15}">{name}</text>')
    parts.append(f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>')
    # Latency panel: one group per mode, one bar per measure, log10 scale from 1 us.
    keys = [("rr_oneway_us", "TCP req/resp 1-way", "#4d8a2b"), ("ping_avg_us", "ping 5 ms", "#2b5c8a"),
            ("ping_idle_us", "ping 0.2 s", "#8ab6e0"), ("ping_upload_us", "ping under upload", "#c0504d"),
            ("ping_download_us", "ping under download", "#e0a08a")]
    top = h
    lmax = max([r.get(k) or 1 for r in results for k, _, _ in keys] + [10])
    decades = math.log10(lmax) or 1
    parts.append(f'<text x="{pad}" y="{top + 20}" font-size="14">latency (us, log scale): '
                 + ", ".join(f'<tspan fill="{c}">{label}</tspan>' for _, label, c in keys) + '</text>')
    gw = (w - 2 * pad) / max(len(results), 1)
    for i, r in enumerate(results):
        x = pad + i * gw
        bar = (gw - 8) / len(keys)
        for j, (k, _, color) in enumerate(keys):
            v = r.get(k)
            if not v:
                continue
            bh = (h - 2 * pad) * max(math.log10(v), 0) / decades
            parts.append(f'<rect x="{x + 4 + j * bar:.1f}" y="{top + h - pad - bh:.1f}" '
                         f'width="{bar:.1f}" height="{bh:.1f}" fill="{color}"/>')
            parts.append(f'<text x="{x + 4 + j * bar:.1f}" y="{top + h - pad - bh - 3:.1f}" font-size="9">{v:g}</text>')
        parts.append(f'<text x="{x + 4:.1f}" y="{top + h - pad + 15}">{r["mode"]}</text>')
    parts.append(f'<line x1="{pad}" y1="{top + h - pad}" x2="{w - pad}" y2="{top + h - pad}" stroke="black"/>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts))


def daemon_pid(name):
    """The pid of the running daemon `name` (host-driver of the first host, or ioc-driver)."""
    want = "sd-bench-host1.sock" if name == "host-driver" else "sd-bench-ioc.sock"
    for pid in sh(f"pgrep -x {name}", check=False).split():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if want.encode() in f.read():
                return int(pid)
    raise RuntimeError(f"{name} is not running")


def frames(ns="sd-host", dev="sd0"):
    """Frames sd0 sent and received so far (each GSO frame once: what crosses the fabric)."""
    st = f"/sys/class/net/{dev}/statistics"
    return int(sh(f"ip netns exec {ns} cat {st}/tx_packets")) + int(sh(f"ip netns exec {ns} cat {st}/rx_packets"))


def syscalls_during(load):
    """System calls each daemon made while `load()` ran (perf's raw_syscalls tracepoint, all
    threads), and frames sd0 moved meanwhile: {"host": n, "ioc": n, "frames": n}."""
    pids = {"host": daemon_pid("host-driver"), "ioc": daemon_pid("ioc-driver")}
    counters = {k: subprocess.Popen(
        ["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", str(pid)],
        stderr=subprocess.PIPE, text=True) for k, pid in pids.items()}
    time.sleep(0.3)
    f0 = frames()
    load()
    f1 = frames()
    out = {"frames": f1 - f0}
    for k, c in counters.items():
        c.send_signal(signal.SIGINT)
        err = c.communicate(timeout=10)[1]
        n = [l.split(",")[0] for l in err.splitlines() if "raw_syscalls:sys_enter" in l]
        out[k] = int(n[0]) if n and n[0].isdigit() else None
    return out


def syscalls(secs):
    """System calls per frame of both daemons, over TCP and over shared memory: a sparse ping
    (every 10 ms, each frame alone), a bulk upload and a bulk download (iperf3). The figure to
    set beside the verbs calls per frame the RDMA queue pairs log (tests/e2e/50-rdma-vms.sh)."""
    loads = {
        "ping every 10 ms": lambda: ping(count=secs * 100, interval=0.01),
        "upload": lambda: iperf(["sd-host"], secs),
        "download": lambda: iperf(["sd-host"], secs, reverse=True),
    }
    rows = []
    for mode, setup in (("splitnet", setup_splitnet), ("splitnet-shm", lambda: setup_splitnet(local="shm"))):
        setup()
        for name, load in loads.items():
            r = syscalls_during(load)
            per = {k: (round(r[k] / r["frames"], 2) if r[k] is not None and r["frames"] else None)
                   for k in ("host", "ioc")}
            rows.append({"mode": mode, "load": name, "frames": r["frames"],
                         "host_per_frame": per["host"], "ioc_per_frame": per["ioc"]})
            print(f"{mode:<13} {name:<17} frames {r['frames']:>9}  syscalls per frame:"
                  f" host-driver {per['host']}, ioc-driver {per['ioc']}", flush=True)
        cleanup()
    return rows


def profile(secs, top=12):
    """Where each daemon's CPU goes under a full-speed upload and download, over TCP and over
    shared memory: `perf record` of both daemons (all threads) while iperf3 runs, and the top
    `top` symbols by self time of each, written to bench/out/profile-MODE-LOAD-DAEMON.txt."""
    loads = {"upload": lambda: iperf(["sd-host"], secs),
             "download": lambda: iperf(["sd-host"], secs, reverse=True)}
    rows = []
    for mode, setup in (("splitnet", setup_splitnet), ("splitnet-shm", lambda: setup_splitnet(local="shm"))):
        setup()
        for name, load in loads.items():
            recs = {}
            for d in ("host-driver", "ioc-driver"):
                data = f"/tmp/sd-bench-perf-{d}.data"
                recs[d] = (data, subprocess.Popen(
                    ["perf", "record", "-F", "2999", "-o", data, "-p", str(daemon_pid(d))],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(0.3)
            load()
            for d, (data, rec) in recs.items():
                rec.send_signal(signal.SIGINT)
                rec.wait(timeout=30)
                report = sh(f"perf report -i {data} --stdio --no-children --sort dso,symbol"
                            " --percent-limit 0.5 2>/dev/null", check=False)
                lines = [" ".join(l.split()).removesuffix(" - -") for l in report.splitlines()
                         if l.strip() and not l.startswith("#")][:top]
                objects = sh(f"perf report -i {data} --stdio --no-children --sort dso 2>/dev/null",
                             check=False)
                shares = [" ".join(l.split()) for l in objects.splitlines()
                          if l.strip() and not l.startswith("#")][:4]
                path = os.path.join(OUT, f"profile-{mode}-{name}-{d}.txt")
                with open(path, "w") as f:
                    f.write(report)
                print(f"\n{mode} {name}: {d}; by object: {', '.join(shares)}; top symbols by self time:")
                for l in lines:
                    print("  " + l)
                rows.append({"mode": mode, "load": name, "daemon": d, "objects": shares, "top": lines})
        cleanup()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hosts", default="1,2,4,8")
    ap.add_argument("--queues", default="1,2", help="TAP queues of one host to compare (4 flows)")
    ap.add_argument("--only", default="direct,vxlan,openvpn,splitnet,splitnet-shm,splitnet-unix,splitnet-ports",
                    help="modes to measure; a splitnet mode ending in -qN (splitnet-shm-q4)"
                         " gives its host N TAP queues")
    ap.add_argument("--workers", type=int, default=None,
                    help="the IOC's fabric.workers (default: the shipped ioc.toml's)")
    ap.add_argument("--rx-queues", type=int, default=None,
                    help="the IOC's lan.rx_queues (default: the shipped ioc.toml's)")
    ap.add_argument("--rx-ring", action="store_true",
                    help="the IOC reads the NIC through mapped rings (lan.rx_ring = true)")
    ap.add_argument("--spin-max-us", type=int, default=None,
                    help="the hosts' fabric.spin_max_us (default: the shipped host.toml's)")
    ap.add_argument("--ioc-spin-max-us", type=int, default=None,
                    help="the IOC's fabric.spin_max_us (default: the shipped ioc.toml's)")
    ap.add_argument("--sched", default=None,
                    help="both daemons' [scheduling]: fifo:PRIORITY or nice:LEVEL (default: normal)")
    ap.add_argument("--busy", action="store_true",
                    help="both daemons poll always (fabric.busy_poll = true): a core per data-path"
                         " thread; needs --workers")
    ap.add_argument("--express", action="store_true",
                    help="the hosts ask for the express lane (fabric.express = true)")
    ap.add_argument("--no-slow", dest="slow", action="store_false",
                    help="skip the slow-consumer figure")
    ap.add_argument("--syscalls", action="store_true",
                    help="only the daemons' system calls per frame (perf), over TCP and shared memory")
    ap.add_argument("--profile", action="store_true",
                    help="only where the daemons' CPU goes under a full-speed transfer (perf record)")
    a = ap.parse_args()
    global WORKERS, SPIN_MAX_US, IOC_SPIN_MAX_US, RX_QUEUES, RX_RING, SCHED, EXPRESS, BUSY
    RX_RING = a.rx_ring
    WORKERS = a.workers
    EXPRESS = a.express
    BUSY = a.busy
    if BUSY and (a.spin_max_us or a.ioc_spin_max_us or (a.sched or "").startswith("fifo")
                 or not a.workers):
        sys.exit("--busy needs --workers N (each busy worker takes a core) and neither"
                 " --spin-max-us, --ioc-spin-max-us nor --sched fifo (the daemons refuse them)")
    SCHED = a.sched
    RX_QUEUES = a.rx_queues
    SPIN_MAX_US = a.spin_max_us
    IOC_SPIN_MAX_US = a.ioc_spin_max_us
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    perf_only = a.syscalls or a.profile
    tools = ("iperf3", "ip", "ping") + (("perf",) if perf_only else ("sockperf",)) + \
        (("openvpn",) if "openvpn" in a.only and not perf_only else ())
    for tool in tools:
        if not shutil.which(tool):
            sys.exit(f"missing tool: {tool}")
    for b in ("host-driver", "ioc-driver"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            sys.exit(f"missing {BIN}/{b}: run cargo build --release")
    os.makedirs(OUT, exist_ok=True)
    for wanted, perf_mode, name in ((a.profile, profile, "profile"), (a.syscalls, syscalls, "syscalls")):
        if not wanted:
            continue
        try:
            rows = perf_mode(a.seconds)
        finally:
            cleanup()
        with open(os.path.join(OUT, f"{name}.json"), "w") as f:
            json.dump(rows, f, indent=2)
        print(f"\nwrote {OUT}/{name}.json")
        return
    setups = {"direct": setup_direct, "vxlan": setup_vxlan, "openvpn": setup_openvpn}
    variants = {"splitnet": {}, "splitnet-plain": {"plain": True},
                "splitnet-encrypted": {"sealed": True}, "splitnet-shm": {"local": "shm"},
                "splitnet-unix": {"local": "unix"}, "splitnet-ports": {"ports": "bridge"},
                "splitnet-ports-ovs": {"ports": "ovs"}, "splitnet-ports-ovs-tso": {"ports": "ovs-tso"}}
    for m in a.only.split(","):
        # A splitnet mode with "-qN": its host with N TAP queues.
        base, _, q = m.rpartition("-q")
        kw = dict(variants[base], queues=int(q)) if base in variants and q.isdigit() \
            else variants.get(m)
        if kw is not None:
            setups[m] = lambda kw=kw: setup_splitnet(**kw)
    results = []
    try:
        print(f"== peers and splitnet: iperf3 {a.seconds}s x best of {a.runs}, ping 300 x 5 ms")
        for m in a.only.split(","):
            results.append(measure(m, setups[m], a.seconds, a.runs))
        print("== splitnet, hosts sharing one IOC (aggregate)")
        scaling = scale([int(x) for x in a.hosts.split(",") if x], a.seconds)
        print("== splitnet, one host with several queues (4 TCP flows)")
        by_queues = queues([int(x) for x in a.queues.split(",") if x], a.seconds)
        slow = None
        if a.slow:
            print("== splitnet, a host that stops reading its data channel, flooded from the LAN")
            slow = slow_consumer(a.seconds)
    finally:
        cleanup()
    by = {r["mode"]: r for r in results}
    print()
    # Latencies as "average/p99" in us.
    lat = [("ping_avg", "ping 5ms"), ("ping_idle", "every 0.2s"), ("ping_upload", "up"),
           ("ping_download", "down"), ("ping_upload_2g", "up 2G"), ("ping_download_2g", "down 2G"),
           ("rr_oneway", "rr 1-way")]
    print(f"{'mode':<14} {'tx Gb/s':>8} {'rx Gb/s':>8} "
          + " ".join(f"{h:>11}" for _, h in lat)
          + f" {'cpu s/GB tx':>11} {'cpu s/GB rx':>11} {'retx/GB tx':>10} {'retx/GB rx':>10}"
          f" {'idle cpu %':>10}")
    print(f"{'':<14} {'':>8} {'':>8} " + " ".join(f"{'avg/p99 us':>11}" for _ in lat))
    for r in results:
        pair = lambda k: f"{r.get(k + '_us')}/{r.get(k + '_p99_us')}"
        idle = "+".join(str(v) for v in r["idle_cpu_pct"].values()) or "-"
        print(f"{r['mode']:<14} {r['tx_gbps']:>8} {r['rx_gbps']:>8} "
              + " ".join(f"{pair(k):>11}" for k, _ in lat)
              + f" {str(r['tx_cpu_s_per_gb']):>11} {str(r['rx_cpu_s_per_gb']):>11}"
              f" {str(r['tx_retrans_per_gb']):>10} {str(r['rx_retrans_per_gb']):>10} {idle:>10}")
    ratios = {}
    # splitnet over TCP (two machines); on one machine over shared memory ("shm_") and over
    # the IOC's local socket ("unix_").
    for mode, pre in (("splitnet", ""), ("splitnet-shm", "shm_"), ("splitnet-unix", "unix_"),
                      ("splitnet-encrypted", "enc_"), ("splitnet-ports", "ports_"),
                      ("splitnet-ports-ovs", "ovs_"), ("splitnet-ports-ovs-tso", "ovs_tso_")):
        s = by.get(mode)
        for peer in ("direct", "vxlan", "openvpn", "splitnet", "splitnet-plain"):
            p = by.get(peer)
            if not s or peer == mode or not (p and p["tx_gbps"] and p["rx_gbps"]):
                continue
            ratios[f"{pre}tx_vs_{peer}"] = round(s["tx_gbps"] / p["tx_gbps"], 2)
            ratios[f"{pre}rx_vs_{peer}"] = round(s["rx_gbps"] / p["rx_gbps"], 2)
            for k in ("ping_avg", "ping_idle", "ping_upload", "ping_download", "ping_upload_2g",
                      "ping_download_2g", "rr_oneway"):
                for sfx in ("_us", "_p99_us"):
                    if p.get(k + sfx) and s.get(k + sfx):
                        name = k + ("_p99" if sfx == "_p99_us" else "")
                        ratios[f"{pre}{name}_vs_{peer}"] = round(s[k + sfx] / p[k + sfx], 2)
            for d in ("tx", "rx"):
                k = f"{d}_cpu_s_per_gb"
                if p.get(k) and s.get(k):
                    ratios[f"{pre}cpu_per_gb_{d}_vs_{peer}"] = round(s[k] / p[k], 2)
                # Retransmits per GB: a ratio only against a peer that had some.
                k = f"{d}_retrans_per_gb"
                if p.get(k) and s.get(k) is not None:
                    ratios[f"{pre}retrans_per_gb_{d}_vs_{peer}"] = round(s[k] / p[k], 2)
    s = by.get("splitnet")
    if s:
        if scaling and scaling[0]["tx_gbps"]:
            last = scaling[-1]
            ratios[f"agg_{last['hosts']}h_vs_1h_tx"] = round(last["tx_gbps"] / scaling[0]["tx_gbps"], 2)
            ratios[f"agg_{last['hosts']}h_vs_1h_rx"] = round(last["rx_gbps"] / scaling[0]["rx_gbps"], 2)
        if len(by_queues) > 1 and by_queues[0]["tx_gbps"]:
            last = by_queues[-1]
            ratios[f"q{last['queues']}_vs_q1_tx"] = round(last["tx_gbps"] / by_queues[0]["tx_gbps"], 2)
            ratios[f"q{last['queues']}_vs_q1_rx"] = round(last["rx_gbps"] / by_queues[0]["rx_gbps"], 2)
    if slow and slow["ratio"] is not None:
        ratios["slow_consumer_good_rx_during_vs_before"] = slow["ratio"]
    print("\nratios (splitnet / peer):", json.dumps(ratios))
    if s:
        print("resident memory (KiB):", s.get("rss_kib"))
    doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": a.seconds,
           "runs": a.runs, "results": results, "scaling": scaling, "queues": by_queues,
           "slow_consumer": slow, "ratios": ratios}
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(doc, f, indent=2)
    svg(results, scaling, os.path.join(OUT, "chart.svg"))
    print(f"\nwrote {OUT}/results.json and {OUT}/chart.svg")


if __name__ == "__main__":
    main()
