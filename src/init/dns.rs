//! The sandbox's DNS: a stub on 127.0.0.53:53 (UDP and TCP) that the sandbox's
//! `/etc/resolv.conf` names. It never forwards a query: a name the proxy's policy could allow
//! gets a synthetic IPv4 address ([`super::transparent`]), stable for the run, and no IPv6
//! address (NODATA, so clients use IPv4 at once); any other name gets NXDOMAIN, and the proxy
//! writes the refusal to the audit log. Real resolution happens on the host, in the proxy, when
//! a connection asks for the name. DNS tunnelling has nowhere to go.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::time::Duration;

use simple_dns::rdata::{RData, A};
use simple_dns::{Packet, PacketFlag, Question, ResourceRecord, CLASS, QTYPE, RCODE, TYPE};

use super::transparent::{self, Answer};

/// Where the stub listens; what the sandbox's `/etc/resolv.conf` says.
pub const STUB_ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);
pub use crate::vocab::{RESOLV_CONF, RESOLV_DIR};
/// How long an answer may be cached: the addresses are stable for the whole run.
const TTL: u32 = 300;

/// The stub's sockets, bound while the init may still bind port 53: on [`STUB_ADDR`], and on
/// 127.0.0.1, which resolvers ask when the sandbox has no `/etc/resolv.conf` at all.
pub struct Stub {
    sockets: Vec<(UdpSocket, TcpListener)>,
}

pub fn bind() -> std::io::Result<Stub> {
    let mut sockets = vec![(
        UdpSocket::bind((STUB_ADDR, 53))?,
        TcpListener::bind((STUB_ADDR, 53))?,
    )];
    // Best effort: `localhost-port 53` (a DNS server on the host's loopback) keeps 127.0.0.1.
    let local = Ipv4Addr::LOCALHOST;
    if let (Ok(u), Ok(t)) = (UdpSocket::bind((local, 53)), TcpListener::bind((local, 53))) {
        sockets.push((u, t));
    }
    Ok(Stub { sockets })
}

/// Serve every socket on its own thread for as long as the init lives.
pub fn start(stub: Stub, ask: fn(&str) -> Option<bool>) {
    for (udp, tcp) in stub.sockets {
        serve(udp, tcp, ask);
    }
}

fn serve(udp: UdpSocket, tcp: TcpListener, ask: fn(&str) -> Option<bool>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            let Ok((n, from)) = udp.recv_from(&mut buf) else {
                continue;
            };
            if let Some(reply) = answer(&buf[..n], ask, 512) {
                let _ = udp.send_to(&reply, from);
            }
        }
    });
    std::thread::spawn(move || {
        for conn in tcp.incoming().flatten() {
            // Out of threads: this connection is dropped, the listener keeps serving.
            let _ = std::thread::Builder::new().spawn(move || serve_tcp(conn, ask));
        }
    });
}

/// DNS over TCP: length-prefixed messages, at most 64 on one connection, 10 s idle.
fn serve_tcp(mut conn: std::net::TcpStream, ask: fn(&str) -> Option<bool>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    for _ in 0..64 {
        let mut len = [0u8; 2];
        if conn.read_exact(&mut len).is_err() {
            return;
        }
        let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
        if conn.read_exact(&mut msg).is_err() {
            return;
        }
        let Some(reply) = answer(&msg, ask, u16::MAX as usize) else {
            return;
        };
        let mut out = (reply.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&reply);
        if conn.write_all(&out).is_err() {
            return;
        }
    }
}

/// The reply to one query (None: not a query worth answering). `limit`: the most a reply may
/// hold (512 over UDP; the answers here are always far smaller).
pub fn answer(query: &[u8], ask: fn(&str) -> Option<bool>, limit: usize) -> Option<Vec<u8>> {
    let q = Packet::parse(query).ok()?;
    if q.has_flags(PacketFlag::RESPONSE) {
        return None;
    }
    let mut reply = Packet::new_reply(q.id());
    if q.has_flags(PacketFlag::RECURSION_DESIRED) {
        reply.set_flags(PacketFlag::RECURSION_DESIRED);
    }
    reply.set_flags(PacketFlag::RECURSION_AVAILABLE);
    let [question] = q.questions.as_slice() else {
        *reply.rcode_mut() = RCODE::FormatError;
        return reply.build_bytes_vec().ok();
    };
    reply.questions.push(Question::new(
        question.qname.clone(),
        question.qtype,
        question.qclass,
        false,
    ));
    let shown = question.qname.to_string();
    let name = shown.trim_end_matches('.').to_ascii_lowercase();
    match crate::config::domain::normalise_name(&name) {
        Err(_) => *reply.rcode_mut() = RCODE::NameError,
        Ok(name) => match transparent::lookup(&name, ask) {
            Answer::Address(ip) => {
                if question.qtype == QTYPE::TYPE(TYPE::A) || question.qtype == QTYPE::ANY {
                    reply.answers.push(ResourceRecord::new(
                        question.qname.clone(),
                        CLASS::IN,
                        TTL,
                        RData::A(A {
                            address: u32::from(ip),
                        }),
                    ));
                }
                // Any other type: NODATA (the name exists, with no such record).
            }
            Answer::Denied => *reply.rcode_mut() = RCODE::NameError,
            Answer::Unavailable => *reply.rcode_mut() = RCODE::ServerFailure,
        },
    }
    let bytes = reply.build_bytes_vec().ok()?;
    (bytes.len() <= limit).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: TYPE) -> Vec<u8> {
        let mut p = Packet::new_query(7);
        p.set_flags(PacketFlag::RECURSION_DESIRED);
        p.questions.push(Question::new(
            simple_dns::Name::new_unchecked(name),
            QTYPE::TYPE(qtype),
            simple_dns::QCLASS::CLASS(CLASS::IN),
            false,
        ));
        p.build_bytes_vec().unwrap()
    }

    fn allow_dns_test(name: &str) -> Option<bool> {
        Some(name.ends_with(".dns-allowed.test"))
    }

    #[test]
    fn allowed_names_get_a_synthetic_a_record_others_nxdomain() {
        let r = answer(
            &query("Api.Dns-Allowed.Test.", TYPE::A),
            allow_dns_test,
            512,
        )
        .unwrap();
        let p = Packet::parse(&r).unwrap();
        assert_eq!(p.id(), 7);
        assert_eq!(p.rcode(), RCODE::NoError);
        let RData::A(a) = &p.answers[0].rdata else {
            panic!("{:?}", p.answers)
        };
        assert!(transparent::is_synthetic(Ipv4Addr::from(a.address).into()));

        let r = answer(
            &query("api.dns-allowed.test", TYPE::AAAA),
            allow_dns_test,
            512,
        )
        .unwrap();
        let p = Packet::parse(&r).unwrap();
        assert_eq!((p.rcode(), p.answers.len()), (RCODE::NoError, 0), "NODATA");

        let r = answer(&query("evil.example", TYPE::A), allow_dns_test, 512).unwrap();
        assert_eq!(Packet::parse(&r).unwrap().rcode(), RCODE::NameError);
        let r = answer(&query("evil.example", TYPE::TXT), allow_dns_test, 512).unwrap();
        assert_eq!(Packet::parse(&r).unwrap().rcode(), RCODE::NameError);
    }

    #[test]
    fn garbage_gets_no_answer_and_no_panic() {
        assert!(answer(b"", allow_dns_test, 512).is_none());
        assert!(answer(&[0xff; 40], allow_dns_test, 512).is_none());
        let mut q = query("x.dns-allowed.test", TYPE::A);
        for cut in 0..q.len() {
            let _ = answer(&q[..cut], allow_dns_test, 512);
        }
        q[2] |= 0x80; // a response, not a query
        assert!(answer(&q, allow_dns_test, 512).is_none());
    }
}
