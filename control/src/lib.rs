//! The control socket of the splitnet daemons: what `splitnetctl` asks and what a daemon
//! answers.
//!
//! The protocol is one request per connection on a Unix stream socket (mode 0600, so root
//! only): the client writes a command word and a newline (`status`, `pools`, `hosts` or
//! `stats`), the daemon writes one JSON document, [`Reply`], and closes. JSON keeps the
//! answers readable with `socat` and stable for scripts (`splitnetctl --json`).
//!
//! * [`report`]: the documents (serde types, shared by the daemons and the CLI).
//! * [`client`]: a blocking client.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod report;

pub use report::{Reply, Request};

/// Where host-driver listens unless configured otherwise, for the default interface `sd0`
/// (another interface's driver has [`host_socket`]).
pub const HOST_SOCKET: &str = "/run/host-driver/control.sock";
/// The runtime directory of host-driver, where its control sockets are.
pub const HOST_DIR: &str = "/run/host-driver";
/// The default interface of host-driver, whose socket is [`HOST_SOCKET`].
pub const DEFAULT_INTERFACE: &str = "sd0";

/// Where the host-driver of TAP interface `ifname` listens unless configured otherwise:
/// [`HOST_SOCKET`] for `sd0`, `/run/host-driver/control-IFNAME.sock` for any other name,
/// so that two drivers of one machine (two interfaces) never share a socket.
pub fn host_socket(ifname: &str) -> std::path::PathBuf {
    if ifname == DEFAULT_INTERFACE {
        HOST_SOCKET.into()
    } else {
        std::path::Path::new(HOST_DIR).join(format!("control-{ifname}.sock"))
    }
}
/// Where ioc-driver listens unless configured otherwise.
pub const IOC_SOCKET: &str = "/run/ioc-driver/control.sock";
/// The JSON answer to a request line: `answer`'s reply for a known request, an error
/// otherwise (what each daemon's control socket sends back).
pub fn answer_line(line: &str, answer: impl FnOnce(Request) -> Reply) -> String {
    let reply = match line.parse::<Request>() {
        Ok(r) => answer(r),
        Err(e) => Reply::Error(e.to_string()),
    };
    serde_json::to_string(&reply).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Longest request line a daemon reads (a command word; anything longer is refused).
pub const MAX_REQUEST: usize = 64;
/// Largest reply a client accepts (a report of 64 hosts with their pools fits many times).
pub const MAX_REPLY: u64 = 4 << 20;

#[cfg(test)]
mod tests {
    use super::report::*;
    use proptest::prelude::*;

    #[test]
    fn each_interface_has_its_own_default_socket() {
        assert_eq!(super::host_socket("sd0").to_str(), Some(super::HOST_SOCKET));
        assert_eq!(
            super::host_socket("sd1").to_str(),
            Some("/run/host-driver/control-sd1.sock")
        );
        assert_ne!(super::host_socket("sd1"), super::host_socket("sd2"));
    }

    #[test]
    fn request_words_round_trip() {
        for r in Request::ALL {
            assert_eq!(r.as_str().parse::<Request>(), Ok(r));
            assert_eq!(format!(" {r}\r\n").parse::<Request>(), Ok(r));
        }
        assert_eq!(
            "STATUS".parse::<Request>(),
            Err(UnknownRequest("STATUS".into()))
        );
        assert!("".parse::<Request>().is_err());
    }

    #[test]
    fn replies_round_trip_through_json() {
        let status = Reply::Status(Status {
            role: Role::Host,
            version: "0.1.0".into(),
            pid: 42,
            uptime_s: 7,
            fabric: Fabric {
                state: "up".into(),
                address: "10.200.0.2:7400".into(),
                protocol_version: Some(1),
                session: Some(3),
                connected_s: Some(5),
                connects: 1,
                hosts: None,
                max_hosts: None,
                iocs: Vec::new(),
                moves: Vec::new(),
            },
            interface: Interface {
                name: "sd0".into(),
                mac: "02:00:00:00:00:01".into(),
                mtu: 1500,
                carrier: true,
                promisc: false,
                multicast: 3,
                offloads: vec!["vnet_hdr".into(), "tso4".into()],
            },
        });
        let text = serde_json::to_string(&status).unwrap();
        assert!(text.starts_with("{\"status\":{"), "{text}");
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), status);
        let err = Reply::Error("no".into());
        assert_eq!(serde_json::to_string(&err).unwrap(), "{\"error\":\"no\"}");
    }

    proptest! {
        /// Only the four command words parse; nothing else panics or is accepted.
        #[test]
        fn arbitrary_lines_parse_or_are_refused(line in ".{0,80}") {
            match line.parse::<Request>() {
                Ok(r) => prop_assert_eq!(line.trim(), r.as_str()),
                Err(UnknownRequest(w)) => prop_assert!(w.chars().count() <= 32),
            }
        }

        /// A client never panics on an arbitrary reply document.
        #[test]
        fn arbitrary_reply_bytes_are_an_error_or_a_reply(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = serde_json::from_slice::<Reply>(&bytes);
        }
    }
}
