//! The PROXY protocol (HAProxy's, v1 text and v2 binary) on listeners behind L4 load
//! balancers: the header that carries the real client address, read before TLS or HTTP.
//!
//! ```text
//! accept ─► peer in proxy_protocol_from? no ─► close (rejected: untrusted)
//!        ─► read exactly one header (within header_read_timeout; v1 ≤ 107 B, v2 ≤ 4 KiB)
//!           malformed / wrong version / too long ─► close (rejected: malformed; no HTTP
//!           response: the peer is not speaking HTTP yet) · timeout ─► close (rejected: timeout)
//!        ─► consume exactly the header; the carried source address replaces the peer for
//!           X-Forwarded-For, Forwarded, trusted_proxies, filters (IP filter, rate-limit keys)
//!           and the access log. v1 UNKNOWN, v2 LOCAL and non-IP families keep the socket peer.
//! ```
//!
//! Outbound, a cluster with `proxy_protocol = "v1"/"v2"` sends [`header_for`] first on each new
//! origin connection (`upstream::connect`); such a connection names one client, so instead of
//! the shared pool it is kept on that client's connection ([`take_private`]). Health checks
//! of such a cluster send [`local_header`] first, which names no client.
//!
//! Parsing is the `ppp` crate's; this module only decides how much to read and what to do.
//! Exactly the header's bytes are read (see [`read_header`]), so TLS and HTTP start on the
//! first byte after it with no buffer to hand over. TLVs are ignored.

use ppp::v2;
use ppp::{v1, HeaderResult, PartialResult};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::metrics::ListenerMetrics;
use keymaster_config::ProxyProtocol;

/// Largest accepted header (v2 with TLVs); v1 is at most 107 bytes by its spec.
pub(crate) const MAX_HEADER: usize = 4096;
const V1_MAX: usize = 107;
const V2_FIXED: usize = 16;
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// A listener's PROXY protocol settings.
pub(crate) struct Settings {
    pub(crate) mode: ProxyProtocol,
    pub(crate) from: Vec<ipnet::IpNet>,
}

impl Settings {
    pub(crate) fn new(mode: ProxyProtocol, from: &[String]) -> Result<Self, String> {
        let from = from
            .iter()
            .map(|t| {
                let t = t.trim();
                t.parse::<ipnet::IpNet>()
                    .or_else(|_| t.parse::<IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|e| format!("proxy_protocol_from {t}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Settings { mode, from })
    }

    pub(crate) fn enabled(&self) -> bool {
        self.mode != ProxyProtocol::Off
    }
}

/// Why a connection was refused at the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Untrusted,
    Malformed,
    Timeout,
}

/// The addresses a PROXY header carried: the client's, and the one it connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Carried {
    pub(crate) client: SocketAddr,
    pub(crate) destination: SocketAddr,
}

impl Carried {
    /// From a header's source and destination, either family.
    fn new<A: Into<IpAddr>>(source: (A, u16), destination: (A, u16)) -> Carried {
        Carried {
            client: SocketAddr::new(source.0.into(), source.1),
            destination: SocketAddr::new(destination.0.into(), destination.1),
        }
    }
}

/// What a complete header parse found.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// A whole header of this many bytes; the addresses if it carried them.
    Header(usize, Option<Carried>),
    /// Not enough bytes yet; at least this many are needed in all.
    Incomplete(usize),
    Malformed,
}

fn parse(buf: &[u8], mode: ProxyProtocol) -> Parsed {
    let v2_result = || -> Parsed {
        let r = v2::Header::try_from(buf);
        match r {
            Ok(h) => {
                let addr = match (h.command, h.addresses) {
                    (v2::Command::Proxy, v2::Addresses::IPv4(a)) => Some(Carried::new(
                        (a.source_address, a.source_port),
                        (a.destination_address, a.destination_port),
                    )),
                    (v2::Command::Proxy, v2::Addresses::IPv6(a)) => Some(Carried::new(
                        (a.source_address, a.source_port),
                        (a.destination_address, a.destination_port),
                    )),
                    _ => None, // LOCAL (health checks), UNIX, unspecified: the peer itself
                };
                Parsed::Header(h.len(), addr)
            }
            Err(ref e) if r.is_incomplete() => {
                let need = match e {
                    v2::ParseError::Partial(_, len) => V2_FIXED + len,
                    _ => V2_FIXED,
                };
                if need > MAX_HEADER {
                    Parsed::Malformed
                } else {
                    Parsed::Incomplete(need)
                }
            }
            Err(_) => Parsed::Malformed,
        }
    };
    let v1_result = || -> Parsed {
        let r = v1::Header::try_from(buf);
        match r {
            Ok(h) => {
                let addr = match h.addresses {
                    v1::Addresses::Tcp4(a) => Some(Carried::new(
                        (a.source_address, a.source_port),
                        (a.destination_address, a.destination_port),
                    )),
                    v1::Addresses::Tcp6(a) => Some(Carried::new(
                        (a.source_address, a.source_port),
                        (a.destination_address, a.destination_port),
                    )),
                    v1::Addresses::Unknown => None,
                };
                Parsed::Header(h.header.len(), addr)
            }
            Err(_) if r.is_incomplete() => Parsed::Incomplete(buf.len() + 1),
            Err(_) => Parsed::Malformed,
        }
    };
    match mode {
        ProxyProtocol::Off => Parsed::Header(0, None),
        ProxyProtocol::V1 => v1_result(),
        ProxyProtocol::V2 => v2_result(),
        ProxyProtocol::Any => match HeaderResult::parse(buf) {
            HeaderResult::V2(_) => v2_result(),
            HeaderResult::V1(_) => v1_result(),
        },
    }
}

/// Read the PROXY header from `stream` (whose socket peer is `peer`) and return the
/// addresses it carried (`None` for a header that names none, such as a load balancer's
/// health check: the socket's own addresses stand); `Err` means close the connection
/// (counted in the listener's metrics).
pub(crate) async fn accept(
    settings: &Settings,
    stream: &mut TcpStream,
    peer: SocketAddr,
    timeout: Duration,
    metrics: &ListenerMetrics,
) -> Result<Option<Carried>, Refused> {
    let r = if !settings.from.iter().any(|n| n.contains(&peer.ip())) {
        Err(Refused::Untrusted)
    } else {
        match tokio::time::timeout(timeout, read_header(stream, settings.mode)).await {
            Ok(Ok(carried)) => Ok(carried),
            Ok(Err(())) => Err(Refused::Malformed),
            Err(_) => Err(Refused::Timeout),
        }
    };
    match r {
        Err(Refused::Untrusted) => metrics.proxy_untrusted.inc(),
        Err(Refused::Malformed) => metrics.proxy_malformed.inc(),
        Err(Refused::Timeout) => metrics.proxy_timeout.inc(),
        Ok(_) => {}
    }
    r
}

/// Read exactly one header, never a byte past it: the first 6 bytes tell v1 (`PROXY `) from
/// v2 (its binary signature); v2 then has a fixed 16-byte part with the length of the rest;
/// v1 runs to its line feed (at most 107 bytes), found by peeking and consuming only bytes
/// before it. Blocking reads and peeks of an empty socket wait for data without spinning,
/// and a peer that closes mid-header ends the read at once.
async fn read_header(stream: &mut TcpStream, mode: ProxyProtocol) -> Result<Option<Carried>, ()> {
    let mut buf = vec![0u8; 6];
    stream.read_exact(&mut buf).await.map_err(drop)?;
    let is_v1 = buf == b"PROXY ";
    let is_v2 = buf[..] == V2_SIGNATURE[..6];
    match mode {
        ProxyProtocol::V1 | ProxyProtocol::Any if is_v1 => read_v1_line(stream, &mut buf).await?,
        ProxyProtocol::V2 | ProxyProtocol::Any if is_v2 => {
            buf.resize(V2_FIXED, 0);
            stream.read_exact(&mut buf[6..]).await.map_err(drop)?;
            let len = u16::from_be_bytes([buf[14], buf[15]]) as usize;
            if buf[..12] != V2_SIGNATURE[..] || V2_FIXED + len > MAX_HEADER {
                return Err(());
            }
            buf.resize(V2_FIXED + len, 0);
            stream
                .read_exact(&mut buf[V2_FIXED..])
                .await
                .map_err(drop)?;
        }
        _ => return Err(()),
    }
    match parse(&buf, mode) {
        Parsed::Header(len, addr) if len == buf.len() => Ok(addr),
        _ => Err(()),
    }
}

async fn read_v1_line(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), ()> {
    let mut chunk = [0u8; V1_MAX];
    loop {
        let room = V1_MAX.saturating_sub(buf.len());
        if room == 0 {
            return Err(()); // no line feed within 107 bytes
        }
        let n = stream.peek(&mut chunk[..room]).await.map_err(drop)?;
        if n == 0 {
            return Err(()); // closed mid-header
        }
        let (take, done) = match chunk[..n].iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (n, false),
        };
        stream.read_exact(&mut chunk[..take]).await.map_err(drop)?;
        buf.extend_from_slice(&chunk[..take]);
        if done {
            return Ok(());
        }
    }
}

/// The header a cluster with `proxy_protocol = "v1"/"v2"` sends first on a new connection:
/// the client (`source`, the carried address on a PROXY listener) and the address it
/// connected to (`destination`). Mixed families are sent as IPv6 (IPv4-mapped).
///
/// The addresses are borrowed and read only for a cluster that sends the header: they lie
/// in the client connection's context beyond what every request reads.
pub(crate) fn header_for(
    version: ProxyProtocol,
    source: &SocketAddr,
    destination: &SocketAddr,
) -> Option<Vec<u8>> {
    // Mixed families as IPv6; read here, in the arms that send a header.
    let addresses = || match (*source, *destination) {
        (s @ SocketAddr::V4(_), d @ SocketAddr::V4(_))
        | (s @ SocketAddr::V6(_), d @ SocketAddr::V6(_)) => (s, d),
        (s, d) => (as_v6(s), as_v6(d)),
    };
    match version {
        ProxyProtocol::V1 => Some(v1::Addresses::from(addresses()).to_string().into_bytes()),
        ProxyProtocol::V2 => v2::Builder::with_addresses(
            v2::Version::Two | v2::Command::Proxy,
            v2::Protocol::Stream,
            addresses(),
        )
        .build()
        .ok(),
        ProxyProtocol::Off | ProxyProtocol::Any => None,
    }
}

/// The header a health check sends first to a cluster with `proxy_protocol = "v1"/"v2"`: the
/// probe relays no client, so it names none. v1 `PROXY UNKNOWN`, v2 the `LOCAL` command with
/// no addresses: the spec's form for a proxy's own connections (health checks), which tells
/// the origin to use the connection's real endpoints (HAProxy sends the same).
pub(crate) fn local_header(version: ProxyProtocol) -> Option<Vec<u8>> {
    match version {
        ProxyProtocol::V1 => Some(v1::Addresses::Unknown.to_string().into_bytes()),
        ProxyProtocol::V2 => v2::Builder::with_addresses(
            v2::Version::Two | v2::Command::Local,
            v2::Protocol::Unspecified,
            v2::Addresses::Unspecified,
        )
        .build()
        .ok(),
        ProxyProtocol::Off | ProxyProtocol::Any => None,
    }
}

fn as_v6(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V4(v4) => SocketAddr::from((v4.ip().to_ipv6_mapped(), v4.port())),
        v6 => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIG: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

    fn v2(cmd: u8, fam: u8, addrs: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = SIG.to_vec();
        h.push(0x20 | cmd);
        h.push(fam);
        h.extend_from_slice(&((addrs.len() + tlvs.len()) as u16).to_be_bytes());
        h.extend_from_slice(addrs);
        h.extend_from_slice(tlvs);
        h
    }

    fn carried(client: &str, destination: &str) -> Option<Carried> {
        Some(Carried {
            client: client.parse().unwrap(),
            destination: destination.parse().unwrap(),
        })
    }

    #[test]
    fn v1_tcp4_tcp6_unknown() {
        let h = b"PROXY TCP4 192.0.2.1 198.51.100.2 5555 443\r\nGET";
        assert_eq!(
            parse(h, ProxyProtocol::V1),
            Parsed::Header(h.len() - 3, carried("192.0.2.1:5555", "198.51.100.2:443"))
        );
        let h = b"PROXY TCP6 2001:db8::1 2001:db8::2 5555 443\r\n";
        assert_eq!(
            parse(h, ProxyProtocol::Any),
            Parsed::Header(h.len(), carried("[2001:db8::1]:5555", "[2001:db8::2]:443"))
        );
        let h = b"PROXY UNKNOWN\r\n";
        assert_eq!(parse(h, ProxyProtocol::V1), Parsed::Header(15, None));
        assert!(matches!(
            parse(b"PROXY TCP4 192.0.2.1", ProxyProtocol::V1),
            Parsed::Incomplete(_)
        ));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n", ProxyProtocol::V1),
            Parsed::Malformed
        );
        assert_eq!(
            parse(
                b"PROXY TCP4 999.0.2.1 198.51.100.2 1 2\r\n",
                ProxyProtocol::V1
            ),
            Parsed::Malformed
        );
        // v2 bytes on a v1-only listener.
        let h = v2(
            1,
            0x11,
            &[192, 0, 2, 1, 10, 0, 0, 1, 0x15, 0xb3, 1, 187],
            &[],
        );
        assert_eq!(parse(&h, ProxyProtocol::V1), Parsed::Malformed);
    }

    /// A header that stops half-way times out at the listener's header_read_timeout (paused
    /// time: the 10 s pass at once), and one from outside `proxy_protocol_from` is refused
    /// unread; the whole header is consumed and nothing after it.
    #[tokio::test(start_paused = true)]
    async fn slow_untrusted_and_exact_reads() {
        use tokio::io::AsyncWriteExt;
        let metrics = crate::metrics::Metrics::new().listener("t");
        let settings = Settings::new(ProxyProtocol::Any, &["127.0.0.1".into()]).unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let t = Duration::from_secs(10);

        let mut c = TcpStream::connect(addr).await.unwrap();
        let (mut s, peer) = l.accept().await.unwrap();
        c.write_all(b"PROXY TCP4 192.0.2.1 ").await.unwrap();
        let started = tokio::time::Instant::now();
        let r = accept(&settings, &mut s, peer, t, &metrics).await;
        assert_eq!(r, Err(Refused::Timeout));
        assert!(started.elapsed() >= t);
        assert_eq!(metrics.proxy_timeout.get(), 1);

        let other = Settings::new(ProxyProtocol::Any, &["10.0.0.0/8".into()]).unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        let (mut s, peer) = l.accept().await.unwrap();
        c.write_all(b"PROXY TCP4 192.0.2.1 10.0.0.1 1 2\r\n")
            .await
            .unwrap();
        let r = accept(&other, &mut s, peer, t, &metrics).await;
        assert_eq!(r, Err(Refused::Untrusted));
        assert_eq!(metrics.proxy_untrusted.get(), 1);

        let mut c = TcpStream::connect(addr).await.unwrap();
        let (mut s, peer) = l.accept().await.unwrap();
        c.write_all(b"PROXY TCP4 192.0.2.1 10.0.0.1 1 2\r\nGET")
            .await
            .unwrap();
        let r = accept(&settings, &mut s, peer, t, &metrics).await;
        assert_eq!(r, Ok(carried("192.0.2.1:1", "10.0.0.1:2")));
        let mut rest = [0u8; 3];
        s.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"GET");
    }

    #[test]
    fn headers_sent_to_origins_parse_back() {
        let c: SocketAddr = "192.0.2.1:5555".parse().unwrap();
        let l: SocketAddr = "10.0.0.1:443".parse().unwrap();
        let h = header_for(ProxyProtocol::V1, &c, &l).unwrap();
        assert_eq!(h, b"PROXY TCP4 192.0.2.1 10.0.0.1 5555 443\r\n");
        let h = header_for(ProxyProtocol::V2, &c, &l).unwrap();
        assert_eq!(
            parse(&h, ProxyProtocol::V2),
            Parsed::Header(h.len(), carried("192.0.2.1:5555", "10.0.0.1:443"))
        );
        let l6: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        let h = header_for(ProxyProtocol::V1, &c, &l6).unwrap();
        assert_eq!(
            parse(&h, ProxyProtocol::V1),
            Parsed::Header(
                h.len(),
                carried("[::ffff:192.0.2.1]:5555", "[2001:db8::1]:443")
            )
        );
        assert!(header_for(ProxyProtocol::Off, &c, &l).is_none());
    }

    #[test]
    fn health_check_headers_name_no_client() {
        let h = local_header(ProxyProtocol::V1).unwrap();
        assert_eq!(h, b"PROXY UNKNOWN\r\n");
        assert_eq!(parse(&h, ProxyProtocol::V1), Parsed::Header(h.len(), None));
        let h = local_header(ProxyProtocol::V2).unwrap();
        assert_eq!(h, v2(0, 0x00, &[], &[]));
        assert_eq!(parse(&h, ProxyProtocol::V2), Parsed::Header(16, None));
        assert!(local_header(ProxyProtocol::Off).is_none());
    }

    #[test]
    fn v2_proxy_local_tlvs_and_limits() {
        let addrs = [192, 0, 2, 1, 10, 0, 0, 1, 0x15, 0xb3, 1, 187];
        let tlv = [0x04, 0, 3, b'a', b'b', b'c'];
        let h = v2(1, 0x11, &addrs, &tlv);
        assert_eq!(
            parse(&h, ProxyProtocol::V2),
            Parsed::Header(h.len(), carried("192.0.2.1:5555", "10.0.0.1:443"))
        );
        assert_eq!(
            parse(&h, ProxyProtocol::Any),
            Parsed::Header(h.len(), carried("192.0.2.1:5555", "10.0.0.1:443"))
        );
        let local = v2(0, 0x00, &[], &[]);
        assert_eq!(parse(&local, ProxyProtocol::V2), Parsed::Header(16, None));
        assert_eq!(
            parse(&h[..20], ProxyProtocol::V2),
            Parsed::Incomplete(h.len())
        );
        assert_eq!(parse(&h[..5], ProxyProtocol::V2), Parsed::Incomplete(16));
        let mut huge = v2(1, 0x11, &addrs, &[]);
        huge[14..16].copy_from_slice(&(5000u16).to_be_bytes());
        assert_eq!(parse(&huge, ProxyProtocol::V2), Parsed::Malformed);
        let mut bad_version = h.clone();
        bad_version[12] = 0x31;
        assert_eq!(parse(&bad_version, ProxyProtocol::V2), Parsed::Malformed);
        assert_eq!(
            parse(
                b"PROXY TCP4 192.0.2.1 198.51.100.2 1 2\r\n",
                ProxyProtocol::V2
            ),
            Parsed::Malformed
        );
    }
}
