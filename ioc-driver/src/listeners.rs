//! The IOC's listening sockets: the fabric's TCP socket and the local one, taken from the
//! service manager's descriptor store when it kept them across a restart
//! ([`splitnet_service::fdstore`]) and given to it otherwise, and who may connect to the
//! local one.

use splitnet_fabric::Stream;
use splitnet_service::fdstore::{self, Inherited};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tracing::{info, warn};

/// How long the IOC waits for its fabric address to be free: an instance killed a moment
/// ago may still hold it while the kernel tears its sockets down.
const LISTEN_RETRY: Duration = Duration::from_secs(5);

/// Binds `fabric.listen`; while the address is in use, tries again every 100 ms for up to
/// [`LISTEN_RETRY`], saying so once.
async fn bind_listen(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let until = Instant::now() + LISTEN_RETRY;
    let mut said = false;
    loop {
        match TcpListener::bind(addr).await {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < until => {
                if !said {
                    warn!(%addr, "fabric.listen is still in use (an instance that just exited?); trying again for up to {LISTEN_RETRY:?}");
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            r => return r,
        }
    }
}

/// The name the service manager keeps the fabric's TCP listening socket under.
pub(crate) const KEPT_FABRIC: &str = "fabric";
/// The name it keeps the local fabric socket under.
pub(crate) const KEPT_LOCAL: &str = "fabric-local";

/// The fabric's listening socket: the one the service manager kept across a restart
/// ([`fdstore`]) while it is still for `addr`, else a new one, which it keeps from now on.
pub(crate) async fn fabric_listener(
    kept: &mut Inherited,
    addr: SocketAddr,
) -> io::Result<TcpListener> {
    if let Some(fd) = kept.remove(KEPT_FABRIC) {
        let l = std::net::TcpListener::from(fd);
        match l.local_addr() {
            Ok(a) if a == addr => {
                l.set_nonblocking(true)?;
                info!(%addr, "fabric socket kept across the restart: the connections made meanwhile wait on it");
                return TcpListener::from_std(l);
            }
            other => {
                info!(%addr, kept = ?other, "the kept fabric socket is not fabric.listen's any more: a new one");
                // The manager's copy still listens, and may hold the new address.
                let _ = fdstore::forget(KEPT_FABRIC);
            }
        }
    }
    let l = bind_listen(addr).await?;
    if let Err(e) = fdstore::store(KEPT_FABRIC, l.as_fd()) {
        warn!("the service manager cannot keep the fabric socket across restarts: {e}");
    }
    Ok(l)
}

/// The local fabric socket at `path`: the one the service manager kept across a restart
/// while it is still that path's, else a new one ([`listen_local`]), which it keeps.
pub(crate) fn local_listener(
    kept: &mut Inherited,
    path: &std::path::Path,
    group: Option<&str>,
) -> io::Result<(tokio::net::UnixListener, PathBuf, LocalAccess)> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(fd) = kept.remove(KEPT_LOCAL) {
        let l = std::os::unix::net::UnixListener::from(fd);
        let same = l.local_addr().is_ok_and(|a| a.as_pathname() == Some(path));
        // Its file must still be there (RuntimeDirectoryPreserve=restart) for hosts to reach it.
        let there = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
        if same && there {
            l.set_nonblocking(true)?;
            let access = local_access(path, group)?;
            info!(path = %path.display(), "local fabric socket kept across the restart");
            return Ok((
                tokio::net::UnixListener::from_std(l)?,
                path.to_path_buf(),
                access,
            ));
        }
        info!(path = %path.display(), "the kept local fabric socket is not this path's any more: a new one");
        let _ = fdstore::forget(KEPT_LOCAL);
    }
    let local = listen_local(path, group)?;
    if let Err(e) = fdstore::store(KEPT_LOCAL, local.0.as_fd()) {
        warn!("the service manager cannot keep the local fabric socket across restarts: {e}");
    }
    Ok(local)
}

/// Who may connect to the local fabric socket: root, the IOC's own user, and the members of
/// `fabric.listen_local_group`. The socket file's mode (0660, that group) makes the kernel
/// refuse the others at `connect(2)`; the peer's credentials are checked again at accept,
/// so a mode loosened by hand admits no one more.
#[derive(Debug, Clone, Copy)]
pub struct LocalAccess {
    /// The IOC's own user.
    pub owner: u32,
    /// The group whose members may connect.
    pub group: Option<u32>,
}

impl LocalAccess {
    /// Whether a peer of user `uid`, primary group `gid` and supplementary `groups` may be a
    /// host here.
    pub fn allows(&self, uid: u32, gid: u32, groups: &[u32]) -> bool {
        uid == 0 || uid == self.owner || self.group.is_some_and(|g| gid == g || groups.contains(&g))
    }
}

/// The id of group `name`: a number as it is, else its line in /etc/group.
pub(crate) fn group_id(name: &str) -> io::Result<u32> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    group_in(name, &std::fs::read_to_string("/etc/group")?)
}

/// The id of group `name` in `table`, in the format of /etc/group.
pub(crate) fn group_in(name: &str, table: &str) -> io::Result<u32> {
    table
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let (n, _, id) = (f.next()?, f.next()?, f.next()?);
            (n == name).then(|| id.parse().ok()).flatten()
        })
        .next()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no group {name:?} in /etc/group"),
            )
        })
}

/// Binds the local fabric socket at `path` (a socket left by an earlier run is replaced),
/// for hosts on this machine: mode 0660, given to `group` when set (see [`LocalAccess`]).
fn listen_local(
    path: &std::path::Path,
    group: Option<&str>,
) -> io::Result<(tokio::net::UnixListener, PathBuf, LocalAccess)> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            ))
        }
        Err(_) => {}
    }
    let l = tokio::net::UnixListener::bind(path)?;
    let access = local_access(path, group)?;
    info!(path = %path.display(), group = ?access.group, "local fabric socket (mode 0660)");
    Ok((l, path.to_path_buf(), access))
}

/// Gives the local fabric socket's file at `path` its mode (0660) and `group`, and says
/// who may connect ([`LocalAccess`]).
fn local_access(path: &std::path::Path, group: Option<&str>) -> io::Result<LocalAccess> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    let group = group.map(group_id).transpose()?;
    if let Some(g) = group {
        std::os::unix::fs::chown(path, None, Some(g))?;
    }
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(path)?);
    Ok(LocalAccess { owner, group })
}

/// A connection on the local fabric socket.
pub(crate) enum Local {
    /// A peer [`LocalAccess`] allows: its socket, its name in the logs (the socket's path and
    /// the peer's process), its user id.
    Admitted(Stream, String, u32),
    /// A peer it refuses (closed as it is dropped): its name and user id.
    Refused(String, u32),
}

/// The next connection on the local fabric socket (never, without one).
pub(crate) async fn accept_local(
    local: Option<&(tokio::net::UnixListener, PathBuf, LocalAccess)>,
) -> io::Result<Local> {
    let Some((l, path, access)) = local else {
        return std::future::pending().await;
    };
    let (s, _) = l.accept().await?;
    let cred = s.peer_cred()?;
    let peer = match cred.pid() {
        Some(pid) => format!("unix:{} (pid {pid})", path.display()),
        None => format!("unix:{}", path.display()),
    };
    let s = s.into_std()?;
    let groups = splitnet_netif::peer_groups(std::os::fd::AsFd::as_fd(&s))?;
    Ok(match access.allows(cred.uid(), cred.gid(), &groups) {
        true => Local::Admitted(Stream::Unix(s), peer, cred.uid()),
        false => Local::Refused(peer, cred.uid()),
    })
}
