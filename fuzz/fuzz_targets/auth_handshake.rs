//! The authenticated handshake's bytes from the fabric (docs/protocol.md 5.1): any first
//! message the IOC reads, any answer a host reads, any sealed control message either side
//! opens gives an error or a result, never a panic; and a real first message, altered
//! anywhere, is never taken.
#![no_main]

use libfuzzer_sys::fuzz_target;
use splitnet_fabric::auth::{self, public_key, Initiator, Responder};
use splitnet_messaging::endpoint::handshake;
use splitnet_messaging::wire::{ErrorCode, Queue, Role};

const IOC: [u8; 32] = [0x11; 32];
const HOST: [u8; 32] = [0x22; 32];
const EPHEMERAL: [u8; 32] = [0x33; 32];

fn hello() -> Vec<u8> {
    handshake::hello(Role::Host, 0, Queue::SINGLE, 0, 7, 70_000)
}

fuzz_target!(|data: &[u8]| {
    // The IOC reads arbitrary bytes as a first message.
    let _ = Responder::accept(&IOC, data);
    // A real first message with the input XORed into it: taken only if unchanged but for
    // its header's version (bytes 2..4), which no side reads in an AuthHello.
    let mut i = Initiator::with_ephemeral(&HOST, &public_key(&IOC), &EPHEMERAL).unwrap();
    let mut m = i.hello(&hello(), 1).unwrap();
    let mut changed = false;
    for (k, (x, b)) in m.iter_mut().zip(data).enumerate() {
        *x ^= b;
        changed |= *b != 0 && !(2..4).contains(&k);
    }
    match Responder::accept(&IOC, &m) {
        Ok((mut r, got)) => {
            assert!(!changed, "an altered first message was taken");
            assert_eq!(got, hello());
            // The host reads arbitrary bytes as the IOC's answer, and then the real one.
            let _ = Initiator::with_ephemeral(&HOST, &public_key(&IOC), &EPHEMERAL)
                .and_then(|mut i2| i2.hello(&hello(), 1).map(|_| i2))
                .map(|i2| i2.reply(data));
            let reply = r.reply(&handshake::reply(1, ErrorCode::Ok, 5, 70_000)).unwrap();
            let (_, mut host) = i.reply(auth::reply_body(&reply).unwrap()).unwrap();
            let mut ioc = r.into_sealer().unwrap();
            // The input sealed by the host opens at the IOC; the input itself never does.
            let sealed = host.seal(data).unwrap();
            let mut out = Vec::new();
            ioc.open(&sealed, &mut out).unwrap();
            assert_eq!(out, data);
            assert!(ioc.open(data, &mut out).is_err(), "arbitrary bytes opened");
        }
        Err(_) => assert!(changed, "the real first message was refused"),
    }
});
