//! `splitnetctl upgrade`: the IOC starts its binary again (the package's new one) with its
//! listening sockets ([`splitnet_service::handover`]), and once the new process is ready it
//! becomes the service's main process; this one then tells its hosts it is restarting
//! (Goodbye Restarting: they reconnect at once, to the new process, with sd0's carrier
//! kept) and ends. A new binary that does not start leaves this one serving. The NIC's
//! sockets are not handed over: the new process opens its own (each process's packet
//! sockets see every frame), and serves a host from the moment it reconnects.

use splitnet_control::report::Upgraded;
use splitnet_control::Reply;
use splitnet_service::handover::{self, HandoverError, MainError};
use splitnet_service::{Answer, Operators};
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

/// How long a new process has to be ready. Its start is the configuration, the NIC's
/// sockets and the listeners taken up: well under a second when nothing is wrong.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the service manager has to take the new main process in.
const MAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// An `upgrade` request of the control socket, answered with the hand-over or why not.
pub type UpgradeAsked = oneshot::Sender<Reply>;

/// The answer to `upgrade`: asks the main loop (`upgrades`), which hands over or says why
/// not.
pub fn answer(upgrades: Option<&mpsc::UnboundedSender<UpgradeAsked>>) -> Answer {
    let (tx, rx) = oneshot::channel();
    let asked = upgrades.is_some_and(|u| u.send(tx).is_ok());
    Box::pin(async move {
        let reply = match (asked, rx.await) {
            (true, Ok(reply)) => reply,
            _ => Reply::Error("upgrade: the IOC is stopping".into()),
        };
        serde_json::to_string(&reply).unwrap_or_default()
    })
}

/// How a hand-over ended.
#[derive(Debug)]
pub enum Outcome {
    /// The new process is the service's main process: this one ends (its hosts told
    /// Restarting).
    Done(Upgraded),
    /// Nothing changed, and why: this one serves on.
    Refused(Refusal),
    /// The new process serves, but the service manager did not confirm it took it for the
    /// main one: this one ends with a failure, so that a manager that still takes it for
    /// the main process restarts the service rather than thinking it stopped.
    Unconfirmed(String),
}

/// Why nothing was handed over.
#[derive(Debug)]
pub enum Refusal {
    /// The new binary did not run, ended or was late: the service is not to be restarted
    /// onto it (`splitnetctl upgrade` exits 3).
    NewBinary(String),
    /// Anything else: a restart is the way (exit 1).
    Other(String),
}

impl Refusal {
    /// The control socket's answer.
    pub fn reply(self) -> Reply {
        match self {
            Refusal::NewBinary(why) => Reply::NotUpgraded(why),
            Refusal::Other(why) => Reply::Error(format!("upgrade: {why}")),
        }
    }
}

/// Starts the new process with the listening sockets: the fabric's, the local one's and
/// the operators' (`ops`), and names it the service's main process once it is ready.
pub async fn hand_over(
    fabric: BorrowedFd<'_>,
    local: Option<BorrowedFd<'_>>,
    ops: &Operators,
) -> Outcome {
    let serving = "this process serves on";
    let binary = match handover::own_binary() {
        Ok(b) => b,
        Err(e) => {
            return Outcome::Refused(Refusal::Other(format!(
                "cannot find this binary ({e}); {serving}"
            )))
        }
    };
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let mut fds = vec![(crate::listeners::KEPT_FABRIC, fabric)];
    fds.extend(local.map(|l| (crate::listeners::KEPT_LOCAL, l)));
    fds.extend(ops.sockets());
    info!(binary = %binary.display(), sockets = fds.len(), "upgrade: starting the new process");
    let started = Instant::now();
    let new = match handover::start(&binary, &args, &fds, READY_TIMEOUT).await {
        Ok(s) => s,
        Err(e) => {
            let why = match e {
                HandoverError::Exited => format!("{e} (its log says why); {serving}"),
                ref e => format!("{e}; {serving}"),
            };
            warn!("upgrade failed: {why}");
            return Outcome::Refused(match e.is_the_new_binarys() {
                true => Refusal::NewBinary(why),
                false => Refusal::Other(why),
            });
        }
    };
    let ready_ms = started.elapsed().as_millis() as u64;
    let new_pid = new.pid();
    match new.become_main(MAIN_TIMEOUT).await {
        Ok(_) => {}
        Err(MainError::Unconfirmed(e)) => {
            let why = format!("the new process {new_pid} serves, but {e}");
            warn!("upgrade: {why}");
            return Outcome::Unconfirmed(why);
        }
        Err(e) => {
            warn!("upgrade failed: {e}; {serving}");
            return Outcome::Refused(Refusal::Other(format!("{e}; {serving}")));
        }
    }
    info!(
        new_pid,
        ready_ms, "upgrade: the new process serves; telling the hosts this one is restarting"
    );
    Outcome::Done(Upgraded {
        old_pid: std::process::id(),
        new_pid,
        ready_ms,
    })
}
