#!/usr/bin/env python3
"""Alternating benchmark harness for tpv3: AF_PACKET receive with recvmmsg against a
TPACKET_V3 ring, and transmit with sendmmsg against a TX ring, over a veth pair between two
namespaces (tp-a, tp-b) that only carries these raw frames.

    cd bench/tpacket && gcc -O2 -Wall -o tpv3 tpv3.c && sudo ./topo.sh up &&
        sudo python3 bench.py 3 5 out.jsonl [pin|same]; sudo ./topo.sh down
"""
import subprocess, sys, time, json, os

ROUNDS, SECS, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
PINMODE = sys.argv[4] if len(sys.argv) > 4 else 'none'
PIN = PINMODE if PINMODE != 'none' else False
CPUS = {'pin': (0, 1), 'same': (0, 0)}.get(PINMODE)
B = './tpv3'
HZ = os.sysconf('SC_CLK_TCK')

def kv(line):
    d = {}
    for tok in line.split():
        if '=' in tok:
            k, v = tok.split('=', 1)
            try: v = float(v)
            except ValueError: pass
            d[k] = v
    return d

def procstat():
    with open('/proc/stat') as f:
        p = f.readline().split()[1:]
    p = list(map(int, p))
    busy = p[0] + p[1] + p[2] + p[5] + p[6] + p[7]
    return busy, p[6]

def ksoft():
    t = 0
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            with open(f'/proc/{pid}/stat') as f: st = f.read()
        except OSError: continue
        if '(ksoftirqd/' in st:
            fl = st.rsplit(')', 1)[1].split()
            t += int(fl[11]) + int(fl[12])
    return t

def ns(n, cpu, args):
    pre = ['ip', 'netns', 'exec', n]
    if PIN: pre += ['taskset', '-c', str(CPUS[0] if n == 'tp-a' else CPUS[1])]
    return pre + [B] + args

def run(kind, mode, size, extra):
    # kind rx: measured = receiver (tp-b), generator = tx-mmsg in tp-a
    # kind tx: measured = sender (tp-a), receiver = plain rx-mmsg counter in tp-b
    if kind == 'rx':
        rargs = ['-i', 'tpb', '-M', str(SECS + 10), '-s', str(size)] + extra + [mode]
        sargs = ['-i', 'tpa', '-t', str(SECS), '-s', str(size), 'tx-mmsg']
    else:
        rargs = ['-i', 'tpb', '-M', str(SECS + 10), '-s', str(size), '-n', '0', '-a', 'rx-mmsg']
        sargs = ['-i', 'tpa', '-t', str(SECS), '-s', str(size)] + extra + [mode]
    b0, s0 = procstat(); k0 = ksoft(); t0 = time.time()
    rp = subprocess.Popen(ns('tp-b', 1, rargs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    sp = subprocess.run(ns('tp-a', 0, sargs), capture_output=True, text=True, timeout=SECS + 20)
    ro, re_ = rp.communicate(timeout=SECS + 30)
    b1, s1 = procstat(); k1 = ksoft(); t1 = time.time()
    r = {'kind': kind, 'mode': mode, 'extra': ' '.join(extra), 'size': size, 'pin': PIN,
         'snd': kv(sp.stdout), 'rcv': kv(ro), 'snd_err': sp.stderr.strip()[:300], 'rcv_err': re_.strip()[:300],
         'sys_busy_s': (b1 - b0) / HZ, 'sys_softirq_s': (s1 - s0) / HZ, 'ksoftirqd_s': (k1 - k0) / HZ,
         'wall': t1 - t0}
    return r

CONFIGS = [
    ('rx', 'rx-mmsg', []),
    ('rx', 'rx-ring', []),
    ('tx', 'tx-mmsg', []),
    ('tx', 'tx-ring', []),          # V3 TX ring, blocking kick
    ('tx', 'tx-ring', ['-k']),      # V3 TX ring, MSG_DONTWAIT kick
]
with open(OUT, 'a') as out:
    for rnd in range(ROUNDS):
        for size in (1514, 64):
            cfgs = CONFIGS if rnd % 2 == 0 else CONFIGS[::-1]
            for kind, mode, extra in cfgs:
                r = run(kind, mode, size, extra)
                r['round'] = rnd
                out.write(json.dumps(r) + '\n'); out.flush()
                m = r['rcv'] if kind == 'rx' else r['snd']
                print(rnd, size, kind, mode, r['extra'], 'fps=%.0f cpu/f=%.3f drops=%s gen_fps=%.0f busy=%.2f' % (
                    m.get('fps', 0), m.get('cpu_us_per_frame', 0), r['rcv'].get('drops'),
                    r['snd'].get('fps', 0), r['sys_busy_s']), r['snd_err'][:80], r['rcv_err'][:80], flush=True)
