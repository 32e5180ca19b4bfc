#!/usr/bin/env python3
"""The part of systemd a restart test needs, for namespaces without it: runs a daemon with
NOTIFY_SOCKET and FDSTORE set, keeps the descriptors it stores (sd_notify FDSTORE=1 with
FDNAME=), and on SIGUSR1 restarts it as `systemctl restart` does: SIGTERM, wait for the
exit, start it again with the kept descriptors (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID).
SIGTERM stops the daemon and exits, releasing the descriptors, as `systemctl stop`. As
systemd does for a service, it reaps the daemon's orphans (a child subreaper), and takes the
process a `MAINPID=` message names as the daemon from then on (an upgrade's hand-over);
`BARRIER=1` is answered by closing the descriptor it carries. As NotifyAccess=main, only the
main process's messages are taken; another's are recorded ("refused PID: MESSAGE") and dropped.

    tests/fdstore.py STATE_DIR -- COMMAND...

STATE_DIR gets notify.sock, and `events`, a line per start ("started PID"), per READY=1
("ready PID"), per MAINPID= ("mainpid PID"), per stored or removed descriptor, and per exit
("exited PID STATUS", the main process's; "reaped PID STATUS", another's).
"""
import ctypes
import os
import signal
import socket
import struct
import subprocess
import sys

state, cmd = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
kept = {}  # name -> fd
restart = False
stop = False
events = open(os.path.join(state, "events"), "a", buffering=1)


def on_usr1(*_):
    global restart
    restart = True


def on_term(*_):
    global stop
    stop = True


PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGTERM, on_term)
path = os.path.join(state, "notify.sock")
if os.path.exists(path):
    os.unlink(path)
notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
notify.bind(path)
notify.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
notify.settimeout(0.05)


def start():
    names = list(kept)
    fds = [kept[n] for n in names]
    env = dict(os.environ, NOTIFY_SOCKET=path, FDSTORE="4")
    env.pop("LISTEN_PID", None)
    if fds:
        env.update(LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=":".join(names))

    def place():
        # The kept descriptors at 3, 4, ... as systemd passes them (dup2 clears CLOEXEC).
        dups = [os.dup(fd) for fd in fds]
        for i, fd in enumerate(dups):
            os.dup2(fd, 3 + i)

    # LISTEN_PID is the daemon's own pid: the shell's, which exec keeps.
    shell = ['sh', '-c', '[ -n "${LISTEN_FDS:-}" ] && export LISTEN_PID=$$; exec "$@"', 'sh']
    p = subprocess.Popen(shell + cmd, env=env, preexec_fn=place, close_fds=False)
    events.write(f"started {p.pid} fds={','.join(names) or '-'}\n")
    return p.pid


def recv():
    """One message: its text, the descriptors it carries, and its sender's pid."""
    msg, anc, _, _ = notify.recvmsg(4096, socket.CMSG_SPACE(8 * 4) + socket.CMSG_SPACE(12))
    fds, pid = [], None
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += list(struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
        elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("3i", data[:12])[0]
    return msg, fds, pid


def receive():
    try:
        msg, fds, sender = recv()
    except (socket.timeout, BlockingIOError):
        return
    if msg.strip() == b"BARRIER=1":
        # As systemd: a barrier is answered whoever sends it, by closing its descriptor.
        for fd in fds:
            os.close(fd)
        return
    if sender != main:
        # As systemd's NotifyAccess=main: only the main process is heard.
        for fd in fds:
            os.close(fd)
        events.write(f"refused {sender}: {msg.decode(errors='replace')!r}\n")
        return
    fields = dict(l.split("=", 1) for l in msg.decode().splitlines() if "=" in l)
    name = fields.get("FDNAME", "stored")
    for fd in fds:
        # Ours alone until passed at 3, 4, ... (recvmsg gives them inheritable).
        os.set_inheritable(fd, False)
    if fields.get("FDSTORE") == "1":
        for fd in fds:
            if name in kept:
                os.close(kept[name])
            kept[name] = fd
            events.write(f"stored {name}\n")
    elif fields.get("FDSTOREREMOVE") == "1":
        if name in kept:
            os.close(kept.pop(name))
            events.write(f"removed {name}\n")
    else:
        for fd in fds:
            os.close(fd)
    if fields.get("READY") == "1":
        events.write(f"ready {main}\n")
    if "MAINPID" in fields:
        set_main(int(fields["MAINPID"]))


def set_main(pid):
    global main
    main = pid
    events.write(f"mainpid {pid}\n")


def reap():
    """The main process's exit status once it ended (None while it runs); others reaped."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        code = os.waitstatus_to_exitcode(status)
        if pid == main:
            events.write(f"exited {pid} {code}\n")
            return code
        events.write(f"reaped {pid} {code}\n")


def end_main():
    os.kill(main, signal.SIGTERM)
    while reap() is None:
        receive()


main = start()
while True:
    receive()
    code = reap()
    if code is not None and (stop or not restart):
        # Stopped or failed: released (systemd keeps them only while it restarts).
        break
    if stop:
        end_main()
        break
    if restart:
        if code is None:
            end_main()
        restart = False
        main = start()
