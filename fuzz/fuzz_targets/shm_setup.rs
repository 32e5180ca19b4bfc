//! The shared-memory set-up a host sends the IOC, and the IOC's answer: any bytes give an
//! error or a set-up that round-trips and builds its rings (an answer that round-trips);
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use splitnet_messaging::adapter::shm::setup::Setup;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Setup::parse(data) {
        assert_eq!(&s.emit()[..], data);
        assert!(s.ring().is_ok());
    }
    if let Ok(size) = Setup::parse_ack(data) {
        assert_eq!(&Setup::emit_ack(size)[..], data);
    }
});
