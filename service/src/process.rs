//! Ending what a daemon started: a child run in a process group of its own
//! (`CommandExt::process_group(0)`) is killed with everything it started. kill(2) is the
//! `unsafe` this module alone allows; std kills a child only, not its group.
#![allow(unsafe_code)]

use std::io;

/// Sends SIGKILL to the process group `leader` leads (its pid is the group's id).
pub fn kill_group(leader: u32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(leader)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a process group leader"))?;
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    if unsafe { libc::kill(-pid, libc::SIGKILL) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_group_is_killed_with_its_children() {
        use std::os::unix::process::ExitStatusExt;
        let late = std::env::temp_dir().join(format!("splitnet-group-{}", std::process::id()));
        let _ = std::fs::remove_file(&late);
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("(sleep 1; touch {}) & sleep 30", late.display()))
            .process_group(0)
            .spawn()
            .unwrap();
        kill_group(child.id()).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert!(!late.exists(), "the child it started went with it");
        assert!(kill_group(0).is_err(), "never the caller's own group");
    }
}
