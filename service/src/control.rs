//! The control socket `splitnetctl` talks to: a Unix stream socket, mode 0600, one request
//! line in and one document out per connection (the documents are `splitnet-control`'s;
//! this module only moves lines and text).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

/// Longest request line read; a longer one is refused.
const MAX_REQUEST: usize = 64;
/// Time a client has to send its request and read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// A bound control socket; the file is removed when it is dropped, unless the socket was
/// handed to a successor ([`crate::handover`]).
#[derive(Debug)]
pub struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
    owner: u32,
}

impl ControlSocket {
    /// Binds `path` (mode 0600). A stale socket left by a killed daemon is replaced; any
    /// other file there is an error, as is a socket another daemon still answers on. A
    /// missing parent directory (`/run/host-driver` of a daemon run by hand, not under
    /// systemd's `RuntimeDirectory=`) is made, mode 0755.
    pub async fn bind(path: &Path) -> io::Result<ControlSocket> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            make_dir(dir)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path).await {
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        "another daemon answers on this socket; give this one another \
                         ([control] socket in its configuration, or --control-socket)",
                    ))
                }
                // Nobody listens: the socket of a daemon that was killed.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path)?
                }
                // Some other kind of socket (a datagram socket, say): not ours to remove.
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("exists and is not a stale control socket ({e})"),
                    ))
                }
            },
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists and is not a socket",
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let owner = std::fs::metadata(path)?.uid();
        Ok(ControlSocket {
            listener,
            path: path.to_owned(),
            owner,
        })
    }

    /// The control socket a predecessor passed ([`crate::handover`]), listening on `path`:
    /// `None` when it listens elsewhere or its file is gone (a new one is bound then).
    pub fn adopt(listener: std::os::unix::net::UnixListener, path: &Path) -> Option<ControlSocket> {
        let same = listener
            .local_addr()
            .is_ok_and(|a| a.as_pathname() == Some(path));
        let m = std::fs::symlink_metadata(path).ok()?;
        if !same || !m.file_type().is_socket() {
            return None;
        }
        listener.set_nonblocking(true).ok()?;
        Some(ControlSocket {
            listener: UnixListener::from_std(listener).ok()?,
            path: path.to_owned(),
            owner: m.uid(),
        })
    }

    /// The listening socket, for a successor.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.listener.as_fd()
    }

    /// Answers requests with `answer(line)` until the task is dropped, or until `stop` is
    /// sent (the request in hand answered first; a `stop` dropped unsent stops nothing).
    /// Only root and the daemon's own user are answered (the file mode says so too; this
    /// holds even if the mode is changed).
    pub async fn serve(
        self,
        answer: impl Fn(&str) -> crate::Answer,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        let mut stop = std::pin::pin!(async move {
            if stop.await.is_err() {
                std::future::pending::<()>().await;
            }
        });
        loop {
            let accepted = tokio::select! {
                biased;
                () = &mut stop => return,
                a = self.listener.accept() => a,
            };
            let mut sock = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!("control socket: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let uid = sock.peer_cred().map(|c| c.uid()).ok();
            let allowed = matches!(uid, Some(u) if u == 0 || u == self.owner);
            if !allowed {
                debug!(?uid, "control socket: refused a client that is not root");
            }
            // The client has CLIENT_TIMEOUT to send its line and read the answer; the
            // answer's own wait is the daemon's to bound (an upgrade waits for a new process).
            let line = tokio::time::timeout(CLIENT_TIMEOUT, read_line(&mut sock))
                .await
                .unwrap_or(Err("no request in time"));
            let reply = match line {
                Ok(_) if !allowed => {
                    "{\"error\":\"permission denied: the control socket is root only\"}".into()
                }
                Ok(line) => answer(&line).await,
                Err(e) => format!("{{\"error\":\"{e}\"}}"),
            };
            let _ = tokio::time::timeout(CLIENT_TIMEOUT, async {
                let _ = sock.write_all(reply.as_bytes()).await;
                let _ = sock.write_all(b"\n").await;
                // End our side, then discard what the client still sends (a refused long
                // line) until it closes: closing with unread input would reset the
                // connection and the client would never read the answer.
                let _ = sock.shutdown().await;
                let mut sink = [0u8; 512];
                let mut left = 4096usize;
                while left > 0 {
                    match sock.read(&mut sink).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => left = left.saturating_sub(k),
                    }
                }
            })
            .await;
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        if crate::handover::has_handed_over() {
            return;
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Makes `dir` (and its missing parents), mode 0755 whatever the umask, unless it exists.
fn make_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// Reads one request line of at most [`MAX_REQUEST`] bytes.
async fn read_line(sock: &mut UnixStream) -> Result<String, &'static str> {
    let mut buf = [0u8; MAX_REQUEST];
    let mut n = 0;
    while !buf[..n].contains(&b'\n') {
        if n == buf.len() {
            return Err("request line too long");
        }
        match sock.read(&mut buf[n..]).await {
            Ok(0) if n > 0 => break,
            Ok(0) | Err(_) => return Err("no request"),
            Ok(k) => n += k,
        }
    }
    let line = buf[..n].split(|&b| b == b'\n').next().unwrap_or_default();
    std::str::from_utf8(line)
        .map(str::to_owned)
        .map_err(|_| "request is not UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exchange(path: &Path, request: &[u8]) -> String {
        let mut c = UnixStream::connect(path).await.unwrap();
        c.write_all(request).await.unwrap();
        // End of stream ends a request without a newline.
        let _ = c.shutdown().await;
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn answers_one_line_per_connection_and_refuses_long_lines() {
        // The server's answers need not be Send: it runs on a LocalSet, as in the daemons.
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let dir = std::env::temp_dir().join(format!("splitnet-ctl-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join("c.sock");
                let sock = ControlSocket::bind(&path).await.unwrap();
                let mode = std::fs::metadata(&path).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o600);
                // A stop dropped unsent stops nothing: the server answers on below.
                let (_, never) = tokio::sync::oneshot::channel();
                let server = tokio::task::spawn_local(sock.serve(
                    |line| -> crate::Answer {
                        Box::pin(std::future::ready(format!("{{\"echo\":\"{line}\"}}")))
                    },
                    never,
                ));
                assert_eq!(
                    exchange(&path, b"status\n").await,
                    "{\"echo\":\"status\"}\n"
                );
                assert_eq!(exchange(&path, b"pools").await, "{\"echo\":\"pools\"}\n");
                let long = vec![b'x'; MAX_REQUEST + 10];
                assert_eq!(
                    exchange(&path, &long).await,
                    "{\"error\":\"request line too long\"}\n"
                );
                // A second daemon on the same path is refused; the first keeps answering.
                let e = ControlSocket::bind(&path).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
                assert_eq!(exchange(&path, b"stats\n").await, "{\"echo\":\"stats\"}\n");
                server.abort();
                let _ = server.await;
                // The aborted server dropped the socket: the path is gone.
                assert!(!path.exists());
                // A stale socket file (a killed daemon) is replaced.
                let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
                drop(stale);
                assert!(path.exists());
                let again = ControlSocket::bind(&path).await.unwrap();
                drop(again);
                // Another kind of socket is never removed.
                let dgram = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
                let e = ControlSocket::bind(&path).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
                assert!(path.exists());
                drop(dgram);
                std::fs::remove_file(&path).unwrap();
                // A regular file is never removed.
                std::fs::write(&path, b"keep").unwrap();
                let e = ControlSocket::bind(&path).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
                assert_eq!(std::fs::read(&path).unwrap(), b"keep");
                std::fs::remove_dir_all(&dir).unwrap();
            })
            .await;
    }

    #[tokio::test]
    async fn makes_its_missing_runtime_directory() {
        let base = std::env::temp_dir().join(format!("splitnet-rundir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("host-driver");
        let path = dir.join("control.sock");
        let sock = ControlSocket::bind(&path).await.unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&path), 0o600);
        drop(sock);
        // An existing directory is left as it is.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        drop(ControlSocket::bind(&path).await.unwrap());
        assert_eq!(mode(&dir), 0o700);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_stop_answers_the_request_in_hand_first() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let dir =
                std::env::temp_dir().join(format!("splitnet-ctl-stop-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("c.sock");
            let sock = ControlSocket::bind(&path).await.unwrap();
            // The answer waits until `release` is sent: the stop comes while it waits.
            let (release, held) = tokio::sync::oneshot::channel::<()>();
            let held = std::cell::RefCell::new(Some(held));
            let (stop, stopped) = tokio::sync::oneshot::channel();
            let server = tokio::task::spawn_local(sock.serve(
                move |line| -> crate::Answer {
                    let line = line.to_owned();
                    let held = held.borrow_mut().take();
                    Box::pin(async move {
                        if let Some(h) = held {
                            let _ = h.await;
                        }
                        format!("{{\"echo\":\"{line}\"}}")
                    })
                },
                stopped,
            ));
            let client = tokio::task::spawn_local({
                let path = path.clone();
                async move { exchange(&path, b"upgrade\n").await }
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            stop.send(()).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            release.send(()).unwrap();
            assert_eq!(client.await.unwrap(), "{\"echo\":\"upgrade\"}\n");
            tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .expect("the stopped server ends")
                .unwrap();
            assert!(!path.exists(), "dropped with its file");
            std::fs::remove_dir_all(&dir).unwrap();
        });
    }
}
