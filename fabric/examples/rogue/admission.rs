//! `rogue auth`: attacks on admission, against an IOC that admits by key
//! (docs/protocol.md 5.1). Each attack must end in a refusal that grants nothing: no slot,
//! no MAC, no session.

use crate::{chan, closed, msg, recv, send, verdict, Ch};
use splitnet_fabric::auth::{self, Initiator, Key};
use splitnet_fabric::SealedConn;
use splitnet_messaging::adapter::{Channel, Op, Payload};
use splitnet_messaging::endpoint::handshake;
use splitnet_messaging::memory::Registry;
use splitnet_messaging::wire::{self, CfgCode, CfgRequest, ErrorCode, Message, Queue, Role};
use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// What an attacker holds: an admitted host's private key (a host that went rogue), and
/// the IOC's public key (public anyway).
pub struct Keys {
    /// The admitted key.
    pub host: Key,
    /// The IOC's public key.
    pub ioc: Key,
}

fn hello(channel: u8, session: u64, node_id: u64) -> Vec<u8> {
    handshake::hello(Role::Host, channel, Queue::SINGLE, session, node_id, 70_000)
}

/// Sends `first` on a new connection and returns the answer's bytes (None: closed unanswered).
fn ask(addr: &str, first: Vec<u8>) -> Result<(Ch, Option<Vec<u8>>), String> {
    let mut ch = chan(TcpStream::connect(addr).map_err(|e| e.to_string())?);
    send(&mut ch, first);
    let r = recv(&mut ch, &mut Registry::new(0));
    Ok((ch, r))
}

/// The status of a plain HelloReply, if `bytes` is one.
fn plain_status(bytes: &[u8]) -> Option<ErrorCode> {
    match Message::parse(bytes) {
        Ok((_, Message::HelloReply(r))) => Some(r.status),
        _ => None,
    }
}

/// An authenticated handshake on a new connection: the reply's status and, when accepted,
/// the channel and its sealer.
fn auth_channel(
    addr: &str,
    keys: &Keys,
    hello: Vec<u8>,
) -> Result<(ErrorCode, u64, Ch, Option<auth::Sealer>), String> {
    let mut i = Initiator::new(&keys.host, &keys.ioc).map_err(|e| e.to_string())?;
    let m = i
        .hello(&hello, auth::timestamp())
        .map_err(|e| e.to_string())?;
    let (ch, r) = ask(addr, m)?;
    let r = r.ok_or("no answer")?;
    let body = auth::reply_body(&r).ok_or("the answer is not an AuthReply")?;
    let (reply, sealer) = i.reply(body).map_err(|e| e.to_string())?;
    let Ok((_, Message::HelloReply(r))) = Message::parse(&reply) else {
        return Err("no HelloReply in the AuthReply".into());
    };
    Ok((r.status, r.session, ch, Some(sealer)))
}

/// Runs every admission attack against the IOC at `addr`; returns the ones not refused.
/// Prints the MAC the admitted key got while it claimed `claimed` as its node id.
pub fn attack(addr: &str, keys: &Keys, claimed: u64) -> Vec<&'static str> {
    let mut missed = Vec::new();
    let mut check = |name: &'static str, refused: Result<bool, String>| match refused {
        Ok(refused) => verdict(&mut missed, name, refused, "refused"),
        Err(e) => {
            println!("{name}: {e}");
            missed.push(name);
        }
    };
    // A Hello without a key.
    check(
        "plain Hello",
        ask(addr, hello(0, 0, 7))
            .map(|(_, r)| r.and_then(|b| plain_status(&b)) == Some(ErrorCode::Unauthenticated)),
    );
    // A key the IOC does not list: the IOC proves itself and refuses.
    let stranger = Keys {
        host: auth::generate().unwrap_or(keys.host),
        ioc: keys.ioc,
    };
    check(
        "unknown key",
        auth_channel(addr, &stranger, hello(0, 0, 7))
            .map(|(status, session, _, _)| status == ErrorCode::Unauthenticated && session == 0),
    );
    // The right host key, but for another IOC's public key: the IOC cannot read it.
    let elsewhere = Keys {
        host: keys.host,
        ioc: auth::public_key(&auth::generate().unwrap_or(keys.ioc)),
    };
    check(
        "wrong IOC key",
        Initiator::new(&elsewhere.host, &elsewhere.ioc)
            .and_then(|mut i| i.hello(&hello(0, 0, 7), auth::timestamp()))
            .map_err(|e| e.to_string())
            .and_then(|m| ask(addr, m))
            .map(|(_, r)| r.and_then(|b| plain_status(&b)) == Some(ErrorCode::Unauthenticated)),
    );
    check("replayed handshake", replay(addr, keys));
    check(
        "data channel without proof",
        unproven_data_channel(addr, keys),
    );
    check("forged control message", forged_control(addr, keys));
    match mac_of(addr, keys, claimed) {
        Ok(mac) => println!(
            "claimed node id {claimed:#x}: got mac={}",
            wire::fmt_mac(&mac)
        ),
        Err(e) => {
            println!("claimed node id: {e}");
            missed.push("claimed node id");
        }
    }
    missed
}

/// Control channels of the admitted key that never open their data channel, as a replayer
/// of a recorded first message cannot (it reads no HelloReply): one every 20 ms for
/// `seconds`, the last 64 kept open. The IOC must give none of them a session's place
/// (e2e 42 checks that another host gets in meanwhile); missed only when none was answered
/// at all (the attack did not run).
pub fn hold(addr: &str, keys: &Keys, seconds: u64) -> Vec<&'static str> {
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut held = VecDeque::new();
    let (mut answered, mut refused) = (0u64, 0u64);
    while Instant::now() < until {
        match auth_channel(addr, keys, hello(0, 0, 7)) {
            Ok((ErrorCode::Ok, _, ch, _)) => {
                answered += 1;
                held.push_back(ch);
                if held.len() > 64 {
                    held.pop_front();
                }
            }
            _ => refused += 1,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("held {answered} control channels without a data channel ({refused} refused)");
    if answered == 0 {
        vec!["no control channel was answered (the attack did not run)"]
    } else {
        Vec::new()
    }
}

/// A recorded first message, sent again on another connection: the IOC must refuse it.
/// The attacker here made the original itself with a known ephemeral key, so it can read
/// the IOC's answer to the replay too (a real eavesdropper could not, which is the point of
/// the pattern; what it must not get is a session, and that is what this reads).
fn replay(addr: &str, keys: &Keys) -> Result<bool, String> {
    let e = |e: auth::AuthError| e.to_string();
    let ephemeral = auth::generate().map_err(e)?;
    let ts = auth::timestamp();
    let first = |i: &mut Initiator| i.hello(&hello(0, 0, 7), ts).map_err(e);
    let mut original = Initiator::with_ephemeral(&keys.host, &keys.ioc, &ephemeral).map_err(e)?;
    let mut again = Initiator::with_ephemeral(&keys.host, &keys.ioc, &ephemeral).map_err(e)?;
    let m = first(&mut original)?;
    if first(&mut again)? != m {
        return Err("the two messages differ: not a replay".into());
    }
    let status = |i: Initiator, answer: Option<Vec<u8>>| -> Result<ErrorCode, String> {
        let answer = answer.ok_or("no answer")?;
        let body = auth::reply_body(&answer).ok_or("the answer is not an AuthReply")?;
        let (reply, _) = i.reply(body).map_err(e)?;
        plain_status(&reply).ok_or_else(|| "no HelloReply in the AuthReply".to_string())
    };
    let (_kept, r) = ask(addr, m.clone())?;
    if status(original, r)? != ErrorCode::Ok {
        return Err("the original was not accepted".into());
    }
    let (_, r) = ask(addr, m)?;
    Ok(status(again, r)? == ErrorCode::Unauthenticated)
}

/// A control channel accepted with the admitted key, then a data channel naming its token
/// without a key, and one with a key the IOC does not list.
fn unproven_data_channel(addr: &str, keys: &Keys) -> Result<bool, String> {
    let (status, token, _ctrl, _) = auth_channel(addr, keys, hello(0, 0, 7))?;
    if status != ErrorCode::Ok {
        return Err(format!("the control channel was refused: {status:?}"));
    }
    let (_, plain) = ask(addr, hello(1, token, 7))?;
    let plain_refused = plain.and_then(|b| plain_status(&b)) == Some(ErrorCode::Unauthenticated);
    let stranger = Keys {
        host: auth::generate().map_err(|e| e.to_string())?,
        ioc: keys.ioc,
    };
    let (status, _, _, _) = auth_channel(addr, &stranger, hello(1, token, 7))?;
    Ok(plain_refused && status == ErrorCode::Unauthenticated)
}

/// A whole session, then a control message sent without its seal: the IOC ends the session.
fn forged_control(addr: &str, keys: &Keys) -> Result<bool, String> {
    let (mut ctrl, _data) = session(addr, keys, 7)?;
    let mut forged = msg(&Message::CfgUtilRequest(CfgRequest {
        code: CfgCode::GetStats,
        data: &[],
    }));
    forged.extend_from_slice(&[0; auth::TAG_LEN]);
    let raw = ctrl.conn_mut();
    raw.post(Op::Send, &[], Payload::Bytes(forged));
    let _ = raw.flush();
    Ok(closed(raw, &mut Registry::new(0), Duration::from_secs(2)))
}

/// A whole authenticated session claiming `node_id`: its sealed control channel and its
/// data channel.
fn session(addr: &str, keys: &Keys, node_id: u64) -> Result<(SealedConn<Ch>, Ch), String> {
    let (status, token, ctrl, sealer) = auth_channel(addr, keys, hello(0, 0, node_id))?;
    if status != ErrorCode::Ok {
        return Err(format!("the control channel was refused: {status:?}"));
    }
    let mut ctrl = ctrl;
    ctrl.set_max_send(auth::sealed_len(splitnet_messaging::wire::MAX_MESSAGE_LEN));
    let ctrl = SealedConn::new(ctrl, sealer.ok_or("no sealer")?);
    let (status, _, data, _) = auth_channel(addr, keys, hello(1, token, node_id))?;
    if status != ErrorCode::Ok {
        return Err(format!("the data channel was refused: {status:?}"));
    }
    Ok((ctrl, data))
}

/// The MAC the IOC gives the admitted key while it claims `claimed` as its node id (it must
/// follow the key, not the claim).
fn mac_of(addr: &str, keys: &Keys, claimed: u64) -> Result<[u8; 6], String> {
    let (mut ctrl, _data) = session(addr, keys, claimed)?;
    let mut reg = Registry::new(0);
    ctrl.post(
        Op::Send,
        &[],
        Payload::Bytes(msg(&Message::CfgUtilRequest(CfgRequest {
            code: CfgCode::GetMac,
            data: &[],
        }))),
    );
    let _ = ctrl.flush();
    while let Some(m) = recv(&mut ctrl, &mut reg) {
        if let Ok((_, Message::CfgUtilReply(r))) = Message::parse(&m) {
            if r.code == CfgCode::GetMac {
                return <[u8; 6]>::try_from(r.data).map_err(|_| "a short MAC".to_string());
            }
        }
    }
    Err("no GetMac reply (the session ended, or nothing within the wait)".into())
}
