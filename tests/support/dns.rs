//! A UDP DNS responder for discovery tests: it answers A queries of any name with the
//! addresses a test sets (and may change mid-test), NODATA for other types.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use tokio::net::UdpSocket;

/// A UDP DNS responder answering A queries of any name with `ips` (TTL 0), NODATA for other
/// types. Returns its address.
pub async fn dns_server(ips: Arc<Mutex<Vec<Ipv4Addr>>>) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
            let reply = answer(&buf[..n], &ips.lock().unwrap());
            if let Some(reply) = reply {
                let _ = sock.send_to(&reply, peer).await;
            }
        }
    });
    addr
}

/// The response to one query (None if it is not one we can parse).
fn answer(q: &[u8], ips: &[Ipv4Addr]) -> Option<Vec<u8>> {
    if q.len() < 12 || u16::from_be_bytes([q[4], q[5]]) != 1 {
        return None;
    }
    let mut i = 12;
    while *q.get(i)? != 0 {
        i += 1 + *q.get(i)? as usize;
    }
    let end = i + 5; // zero label, qtype, qclass
    let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
    q.get(end - 1)?;
    let answers: &[Ipv4Addr] = if qtype == 1 { ips } else { &[] };
    let mut r = Vec::new();
    r.extend_from_slice(&q[0..2]);
    r.extend_from_slice(&[0x84 | (q[2] & 0x01), 0x00]); // QR, AA, RD echoed; NOERROR
    r.extend_from_slice(&[0, 1]);
    r.extend_from_slice(&(answers.len() as u16).to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(&q[12..end]);
    for ip in answers {
        r.extend_from_slice(&[0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        r.extend_from_slice(&ip.octets());
    }
    Some(r)
}
