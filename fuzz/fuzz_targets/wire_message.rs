//! Every message decoder on arbitrary bytes: never panics; what parses re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use splitnet_messaging::wire::{Header, Message};

fuzz_target!(|data: &[u8]| {
    if let Ok((h, m)) = Message::parse(data) {
        let mut out = Vec::new();
        m.emit(h.txn, &mut out);
        // Hello is accepted with any header version; everything else re-encodes exactly.
        if h.function != splitnet_messaging::wire::Function::Hello {
            assert_eq!(out, data);
        }
        assert_eq!(Message::parse(&out).map(|(_, m2)| m2), Ok(m));
    }
    let _ = Header::parse(data);
});
