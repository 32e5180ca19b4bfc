//! An upgrade without a stopped service: the running daemon starts its binary again (the
//! new one, once a package replaced the file) with its listening sockets, and the new
//! process says when it is ready; only then does the old one tell systemd that the new one
//! is the service's main process (`MAINPID=`) and end. A new binary that exits, or is not
//! ready in time, is ended and the old one goes on serving.
//!
//! The sockets pass by inheritance, as HAProxy and Envoy pass theirs over a Unix socket: the
//! successor is our own child, so it needs no socket in between. Each keeps its descriptor
//! number, named in `SPLITNET_HANDOVER_FDS` (`name=fd,...`); the successor writes one byte
//! on the pipe `SPLITNET_HANDOVER_READY` names when it is ready. std passes a child only
//! its standard streams, so the close-on-exec flag of the passed ones is cleared around the
//! spawn by hand (the daemon spawns nothing else, from no other thread); the raw descriptor
//! numbers taken at the other end are the `unsafe` this module alone allows.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The variable naming the passed descriptors: `name=fd` pairs, comma-separated.
pub const FDS_VAR: &str = "SPLITNET_HANDOVER_FDS";
/// The variable naming the descriptor the successor says it is ready on.
pub const READY_VAR: &str = "SPLITNET_HANDOVER_READY";
/// What the service manager passed this process, which the successor must not take as its
/// own (systemd's `LISTEN_PID` and `WATCHDOG_PID` name the old process).
const NOT_PASSED_ON: [&str; 4] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_PID"];
/// The most descriptors one hand-over passes.
const MAX_FDS: usize = 16;

/// Set from the moment this process names a successor the main process: the service
/// manager hears no more from this one, and what it would remove at exit (a socket's file)
/// is the successor's.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);
/// The pipe to the predecessor, until [`ready`] writes on it.
static READY_PIPE: Mutex<Option<OwnedFd>> = Mutex::new(None);
/// Set once the passed descriptors are read from the environment: each is owned once.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Why a successor did not take over; the old process serves on.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// It could not be started.
    #[error("cannot start {}: {source}", path.display())]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// It ended before it was ready (its log says why).
    #[error("the new process ended before it was ready")]
    Exited,
    /// It was not ready in time, and was killed.
    #[error("the new process was not ready within {0:?}; killed")]
    TimedOut(Duration),
    /// Waiting for it failed.
    #[error("waiting for the new process: {0}")]
    Wait(io::Error),
}

impl HandoverError {
    /// Whether the new binary is to blame (it did not run, ended or was late), rather than
    /// this machine's resources: the old process then serves on and the service is not to
    /// be restarted onto that binary.
    pub fn is_the_new_binarys(&self) -> bool {
        match self {
            HandoverError::Spawn { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENOENT | libc::EACCES | libc::ENOEXEC | libc::ELIBBAD | libc::ETXTBSY)
            ),
            HandoverError::Exited | HandoverError::TimedOut(_) | HandoverError::Wait(_) => true,
        }
    }
}

/// A started successor that said it is ready, not yet the service's main process: killed
/// when dropped unless [`Successor::become_main`] made it so.
#[derive(Debug)]
pub struct Successor {
    pending: Pending,
}

/// Why a ready successor did not become the service's main process.
#[derive(Debug, thiserror::Error)]
pub enum MainError {
    /// It ended before it could be named; nothing changed.
    #[error("the new process ended after it said it was ready")]
    Ended,
    /// The service manager could not be told; the successor was killed, nothing changed.
    #[error("cannot tell the service manager of the new main process: {0}")]
    NotSent(io::Error),
    /// It was told, but did not confirm it read that: the successor serves, and which
    /// process the manager takes for the main one is not known.
    #[error("the service manager did not confirm the new main process: {0}")]
    Unconfirmed(io::Error),
}

impl Successor {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pending.pid
    }

    /// Tells the service manager that the successor is the service's main process now
    /// (`MAINPID=`, with a watchdog ping on its behalf: the manager's watchdog timer runs
    /// on, and the successor's first ping comes half an interval after its start), and
    /// waits up to `timeout` for it to have read that (sd_notify(3) `BARRIER=1`), so that
    /// this process's exit is never taken for the service's. Without a service manager
    /// there is nothing to tell. Its pid.
    pub async fn become_main(mut self, timeout: Duration) -> Result<u32, MainError> {
        if self.pending.ended() {
            return Err(MainError::Ended);
        }
        let pid = self.pending.pid;
        HANDED_OVER.store(true, Ordering::SeqCst);
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            return Ok(self.pending.ready());
        }
        if let Err(e) = sd_notify::notify(&[
            sd_notify::NotifyState::MainPid(pid),
            sd_notify::NotifyState::Watchdog,
        ]) {
            HANDED_OVER.store(false, Ordering::SeqCst);
            return Err(MainError::NotSent(e));
        }
        self.pending.ready();
        barrier(timeout).await.map_err(MainError::Unconfirmed)?;
        Ok(pid)
    }
}

/// The binary this process runs: the path it was started from, also once a package
/// replaced the file (the kernel then names the old one "PATH (deleted)").
pub fn own_binary() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let text = exe.as_os_str().to_string_lossy();
    match text.strip_suffix(" (deleted)") {
        Some(path) => Ok(PathBuf::from(path)),
        None => Ok(exe),
    }
}

/// Starts `binary` with `args` and the descriptors `fds` (each under its name), and waits
/// up to `timeout` for it to say it is ready ([`ready`]). A successor that ends first, or
/// is not ready in time (it is then killed), is an error, and nothing is handed over.
///
/// The successor is started as a daemon starts itself, by a second fork: its parent exits
/// at once, so it is the service manager's child (the manager reaps orphans), not ours.
/// systemd then supervises it as it supervised us once it is named the main process; a
/// main process that is another process's child is one whose stop it cannot wait for
/// where cgroups do not report empty (a container on cgroup v1), and it would kill it at
/// once.
pub async fn start(
    binary: &Path,
    args: &[OsString],
    fds: &[(&str, BorrowedFd<'_>)],
    timeout: Duration,
) -> Result<Successor, HandoverError> {
    let spawn_err = |source| HandoverError::Spawn {
        path: binary.to_path_buf(),
        source,
    };
    let (reader, writer) = io::pipe().map_err(spawn_err)?;
    // Where the first child says the successor's pid, before it exits.
    let (mut pid_reader, pid_writer) = io::pipe().map_err(spawn_err)?;
    let names = fds
        .iter()
        .map(|(name, fd)| format!("{name}={}", fd.as_raw_fd()))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = command(binary, args, &names, writer.as_raw_fd());
    let pid_fd = pid_writer.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (fork, write, _exit); it touches no memory but its own
    // stack and the copied descriptor number.
    unsafe {
        cmd.pre_exec(move || match libc::fork() {
            -1 => Err(io::Error::last_os_error()),
            // The successor: on to exec.
            0 => Ok(()),
            pid => {
                let bytes = pid.to_ne_bytes();
                libc::write(pid_fd, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0)
            }
        });
    }
    let passed: Vec<BorrowedFd<'_>> = fds
        .iter()
        .map(|(_, fd)| *fd)
        .chain([writer.as_fd()])
        .collect();
    // An exec that fails (no such binary) is reported here, by the successor.
    let mut first = inheriting(&passed, || cmd.spawn()).map_err(spawn_err)?;
    drop(pid_writer);
    // Ours closed: the pipe ends when the successor's copy does.
    drop(writer);
    first.wait().map_err(spawn_err)?;
    let mut bytes = [0u8; 4];
    pid_reader.read_exact(&mut bytes).map_err(spawn_err)?;
    let pid = libc::pid_t::from_ne_bytes(bytes);
    let successor = match Pending::open(pid) {
        Ok(Some(s)) => s,
        Ok(None) => return Err(HandoverError::Exited),
        Err(e) => return Err(HandoverError::Wait(e)),
    };
    let mut reader = tokio::net::unix::pipe::Receiver::from_owned_fd(reader.into())
        .map_err(HandoverError::Wait)?;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(timeout, reader.read(&mut byte)).await {
        Ok(Ok(1)) => Ok(Successor { pending: successor }),
        // Closed or broken without a word: it ended, or soon will.
        Ok(_) => match successor.ended_within(Duration::from_secs(1)).await {
            true => Err(HandoverError::Exited),
            false => Err(HandoverError::Wait(io::Error::other(
                "it closed its readiness pipe but did not end; killed",
            ))),
        },
        Err(_) => Err(HandoverError::TimedOut(timeout)),
    }
}

/// The successor's command: `binary args`, told of the descriptors `names` and the pipe
/// `ready`, without what the service manager told this process of itself.
fn command(binary: &Path, args: &[OsString], names: &str, ready: RawFd) -> Command {
    let mut cmd = Command::new(binary);
    cmd.args(args)
        .env(FDS_VAR, names)
        .env(READY_VAR, ready.to_string());
    for var in NOT_PASSED_ON {
        cmd.env_remove(var);
    }
    cmd
}

/// A successor not yet ready, by a pidfd (it is not our child: its pid alone could name
/// another process once it is reaped): killed when dropped, so that a failed or cancelled
/// hand-over leaves no process behind.
#[derive(Debug)]
struct Pending {
    pid: u32,
    pidfd: Option<OwnedFd>,
}

impl Pending {
    /// The process `pid`; `None` when it is gone already. Without a pidfd (an old kernel, a
    /// filter) it cannot be followed safely: it is killed at once and that is an error.
    fn open(pid: libc::pid_t) -> io::Result<Option<Pending>> {
        // SAFETY: pidfd_open(2) takes two integers; the result is checked before it is owned.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Ok(None);
            }
            // SAFETY: kill(2) of the process we just started, which has not been reaped
            // (the window in which its pid could be another's is this function's).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Err(io::Error::other(format!(
                "cannot follow the new process (pidfd_open: {e}); killed"
            )));
        }
        // SAFETY: `fd` was just returned by pidfd_open(2) and is owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Some(Pending {
            pid: pid as u32,
            pidfd: Some(pidfd),
        }))
    }

    /// Whether the process ended (its pidfd is readable), without waiting.
    fn ended(&self) -> bool {
        let Some(fd) = &self.pidfd else {
            return false;
        };
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) of one pollfd on our stack, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & libc::POLLIN != 0
    }

    /// It serves: no longer ours to kill. Its pid.
    fn ready(&mut self) -> u32 {
        self.pidfd = None;
        self.pid
    }

    /// Whether it ends within `grace` (a pidfd is readable once its process ended); killed
    /// when it does not.
    async fn ended_within(&self, grace: Duration) -> bool {
        let Some(fd) = &self.pidfd else {
            return true;
        };
        let Ok(dup) = fd.try_clone() else {
            return false;
        };
        // SAFETY: the AsyncFd owns `dup`, a valid open descriptor nothing else closes, so it
        // names the same pidfd until the AsyncFd is dropped.
        let Ok(watch) = (unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(dup, tokio::io::Interest::READABLE)
        }) else {
            return false;
        };
        tokio::time::timeout(grace, watch.readable()).await.is_ok()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(fd) = &self.pidfd {
            // SAFETY: pidfd_send_signal(2) on the pidfd we own, no siginfo.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        }
    }
}

/// Runs `spawn` with `fds` inheritable (close-on-exec cleared), and sets the flag again.
fn inheriting<T>(fds: &[BorrowedFd<'_>], spawn: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let cleared = fds
        .iter()
        .try_for_each(|fd| set_cloexec(fd.as_raw_fd(), false));
    let r = cleared.and_then(|()| spawn());
    for fd in fds {
        let _ = set_cloexec(fd.as_raw_fd(), true);
    }
    r
}

fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller borrows (open for the call); no memory is
    // passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = match on {
        true => flags | libc::FD_CLOEXEC,
        false => flags & !libc::FD_CLOEXEC,
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The descriptors a predecessor passed, by name; taken once (none later, nor when this
/// process was not started by a hand-over). Also keeps the readiness pipe for [`ready`].
/// Numbers that are not open, are standard streams or are named twice are left alone.
pub fn take_passed() -> HashMap<String, OwnedFd> {
    let mut by_name = HashMap::new();
    if TAKEN.swap(true, Ordering::SeqCst) {
        return by_name;
    }
    // Each number is owned once, whatever names it.
    let mut claimed = std::collections::HashSet::new();
    if let Some(fd) = std::env::var(READY_VAR)
        .ok()
        .and_then(|v| claim(&v, &mut claimed))
    {
        *READY_PIPE.lock().unwrap_or_else(|e| e.into_inner()) = Some(fd);
    }
    let Ok(list) = std::env::var(FDS_VAR) else {
        return by_name;
    };
    for pair in list.split(',').filter(|p| !p.is_empty()).take(MAX_FDS) {
        let Some((name, num)) = pair.split_once('=') else {
            tracing::warn!("{FDS_VAR}: {pair:?} is not name=fd; left alone");
            continue;
        };
        if by_name.contains_key(name) {
            tracing::warn!("{FDS_VAR}: {name} passed twice; the second left alone");
            continue;
        }
        match claim(num, &mut claimed) {
            Some(fd) => {
                by_name.insert(name.to_owned(), fd);
            }
            None => tracing::warn!("{FDS_VAR}: {name}={num} is not a passed descriptor"),
        }
    }
    by_name
}

/// The descriptor numbered `num`, owned, when it is open, not a standard stream and not in
/// `claimed` (to which it is added).
fn claim(num: &str, claimed: &mut std::collections::HashSet<RawFd>) -> Option<OwnedFd> {
    let fd: RawFd = num.parse().ok().filter(|&fd| fd > 2)?;
    if claimed.contains(&fd) {
        return None;
    }
    // Not passed unless open; close-on-exec again, so that it goes no further by itself.
    set_cloexec(fd, true).ok()?;
    claimed.insert(fd);
    // SAFETY: the predecessor passed `fd` to this process for it to own (the variable names
    // it), it is open (fcntl above), TAKEN makes this the one call site, run once, that
    // turns passed numbers into owned descriptors, and `claimed` refuses a number twice.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Tells the predecessor this process is ready to serve; false when none waits for that
/// (not a successor, or told already).
pub fn ready() -> bool {
    let pipe = READY_PIPE.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(fd) = pipe else {
        return false;
    };
    if let Err(e) = std::fs::File::from(fd).write_all(b"R") {
        // It gave up on this one (timed out, or ended): serving beside it, unknown to the
        // service manager, would be worse than not at all.
        tracing::error!("cannot tell the process that started this one it is ready ({e}): it gave up on this one; ending");
        std::process::exit(1);
    }
    true
}

/// Whether this process is a successor that has not said it is ready: the service manager
/// takes no message from it until its predecessor names it the main process.
pub fn awaiting_ready() -> bool {
    READY_PIPE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some()
}

/// Whether the service manager takes messages from this process: not from a successor
/// before it is named the main process, nor from a predecessor once it named one.
pub fn is_main() -> bool {
    !HANDED_OVER.load(Ordering::SeqCst) && !awaiting_ready()
}

/// Whether this process handed its sockets to a successor (named it the main process,
/// [`Successor::become_main`]): the socket files it made are the successor's now, not to
/// be removed.
pub fn has_handed_over() -> bool {
    HANDED_OVER.load(Ordering::SeqCst)
}

/// Waits up to `timeout` until the service manager has handled every message this process
/// sent it (sd_notify(3) `BARRIER=1`: it closes its copy of the pipe's write end then).
async fn barrier(timeout: Duration) -> io::Result<()> {
    let (reader, writer) = io::pipe()?;
    sd_notify::notify_with_fds(
        &[sd_notify::NotifyState::Custom("BARRIER=1")],
        &[writer.as_fd()],
    )?;
    drop(writer);
    let mut reader = tokio::net::unix::pipe::Receiver::from_owned_fd(reader.into())?;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(timeout, reader.read(&mut byte)).await {
        Ok(r) => r.map(drop),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no answer to the barrier",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// The tests that start processes, one at a time: a descriptor made inheritable for one
    /// must not leak into another's child.
    static SPAWNING: Mutex<()> = Mutex::new(());

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn sh(script: &str) -> Vec<OsString> {
        vec!["-c".into(), script.into()]
    }

    #[test]
    fn a_successor_gets_the_named_sockets_and_says_ready() {
        let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("handover-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let out = dir.join("out");
        // The child names the socket it was told of and its parent, says ready, and lives
        // on a little (a successor outlives its predecessor).
        let script = format!(
            "fd=${{{FDS_VAR}#l=}}; {{ readlink /proc/self/fd/$fd; echo $PPID; }} > {out}; echo -n R >&${READY_VAR}; sleep 0.5",
            out = out.display()
        );
        let s = rt()
            .block_on(start(
                Path::new("/bin/bash"),
                &sh(&script),
                &[("l", listener.as_fd())],
                Duration::from_secs(10),
            ))
            .unwrap();
        assert!(s.pid() > 0);
        let seen = std::fs::read_to_string(&out).unwrap();
        let mut lines = seen.lines();
        let ours = std::fs::read_link(format!("/proc/self/fd/{}", listener.as_raw_fd())).unwrap();
        assert_eq!(lines.next(), ours.to_str(), "the same socket: {seen}");
        // The second fork: the successor is not our child.
        let ppid: u32 = lines.next().unwrap().parse().unwrap();
        assert_ne!(ppid, std::process::id());
        // Close-on-exec is back on ours.
        // SAFETY: fcntl on an open descriptor we own.
        let flags = unsafe { libc::fcntl(listener.as_raw_fd(), libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_successor_that_ends_after_it_is_ready_does_not_become_main() {
        let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
        let rt = rt();
        let s = rt
            .block_on(start(
                Path::new("/bin/bash"),
                &sh(&format!("echo -n R >&${READY_VAR}; exit 0")),
                &[],
                Duration::from_secs(10),
            ))
            .unwrap();
        let pid = s.pid();
        assert!(until_gone(pid), "{pid} did not end");
        let e = rt
            .block_on(s.become_main(Duration::from_secs(1)))
            .unwrap_err();
        assert!(matches!(e, MainError::Ended), "{e}");
    }

    #[test]
    fn a_successor_that_exits_first_is_an_error() {
        let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
        let e = rt()
            .block_on(start(
                Path::new("/bin/bash"),
                &sh("exit 3"),
                &[],
                Duration::from_secs(10),
            ))
            .unwrap_err();
        assert!(matches!(e, HandoverError::Exited), "{e}");
        assert!(e.is_the_new_binarys());
    }

    #[test]
    fn a_successor_not_ready_in_time_is_killed() {
        let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
        let out = std::env::temp_dir().join(format!("handover-late-{}", std::process::id()));
        let e = rt()
            .block_on(start(
                Path::new("/bin/bash"),
                &sh(&format!("echo $$ > {}; exec sleep 30", out.display())),
                &[],
                Duration::from_millis(300),
            ))
            .unwrap_err();
        assert!(matches!(e, HandoverError::TimedOut(_)), "{e}");
        assert!(e.is_the_new_binarys());
        let pid: u32 = std::fs::read_to_string(&out)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::fs::remove_file(&out).unwrap();
        assert!(until_gone(pid), "the late successor {pid} still runs");
    }

    /// Whether process `pid` ended (gone, or a zombie) within 5 s.
    fn until_gone(pid: u32) -> bool {
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < until {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(stat)
                    if stat
                        .rsplit(')')
                        .next()
                        .is_some_and(|r| r.trim_start().starts_with('Z')) =>
                {
                    return true
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        false
    }

    #[test]
    fn a_missing_binary_is_a_spawn_error() {
        let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
        let e = rt()
            .block_on(start(
                Path::new("/nonexistent/ioc-driver"),
                &[],
                &[],
                Duration::from_secs(1),
            ))
            .unwrap_err();
        assert!(matches!(e, HandoverError::Spawn { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/ioc-driver"), "{e}");
        // A missing binary is the new one's fault; a full process table would not be.
        assert!(e.is_the_new_binarys());
        let busy = HandoverError::Spawn {
            path: PathBuf::from("/usr/bin/ioc-driver"),
            source: io::Error::from_raw_os_error(libc::EAGAIN),
        };
        assert!(!busy.is_the_new_binarys());
    }

    #[test]
    fn the_service_managers_variables_are_not_passed_on() {
        let cmd = command(Path::new("/usr/bin/ioc-driver"), &[], "fabric=7", 9);
        let envs: HashMap<_, _> = cmd.get_envs().collect();
        for var in NOT_PASSED_ON {
            assert_eq!(envs.get(std::ffi::OsStr::new(var)), Some(&None), "{var}");
        }
        assert_eq!(
            envs.get(std::ffi::OsStr::new(FDS_VAR)),
            Some(&Some(std::ffi::OsStr::new("fabric=7")))
        );
        assert_eq!(
            envs.get(std::ffi::OsStr::new(READY_VAR)),
            Some(&Some(std::ffi::OsStr::new("9")))
        );
    }

    #[test]
    fn claims_only_open_descriptors_past_the_standard_streams_once() {
        let mut claimed = std::collections::HashSet::new();
        for num in ["0", "2", "-5", "x", "999999"] {
            assert!(claim(num, &mut claimed).is_none(), "{num}");
        }
        // A descriptor given up (as the predecessor's are) is owned once, named twice.
        let (r, _w) = io::pipe().unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(OwnedFd::from(r));
        let fd = claim(&raw.to_string(), &mut claimed).expect("an open descriptor");
        assert!(claim(&raw.to_string(), &mut claimed).is_none());
        drop(fd);
    }

    #[test]
    fn own_binary_is_a_path_to_a_file() {
        let p = own_binary().unwrap();
        assert!(p.is_file(), "{}", p.display());
    }
}
