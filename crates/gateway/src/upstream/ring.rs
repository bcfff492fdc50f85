//! Consistent hashing for `balance = "hash"` (docs/decisions/0015-ring-hash.md): a ring of
//! points, each server owning a number of them in proportion to its weight. A key belongs
//! to the server of the first point at or after its hash, so adding or removing one of N
//! servers moves about 1/N of the keys (only those of that server's points). An unavailable
//! (unhealthy or ejected) or already tried server is passed over for the next server on the
//! ring: its keys move, and come back when it returns, while every other key stays.
//!
//! The ring is built with the config version (off the request path); a pick is one binary
//! search and a short walk, with no allocation and no lock.

use http::{HeaderName, HeaderValue};
use std::net::IpAddr;
use std::sync::Arc;

use super::{Cluster, OriginServer};
use crate::metrics::HashMetrics;
use keymaster_config::{AllUnhealthy, HashConfig, HashOn};
use keymaster_http::error::{Error, Kind};

/// Ring points of a server of the cluster's smallest weight; a server of twice that weight
/// has twice as many. The spread of servers' shares shrinks as 1/sqrt(points) (160 points:
/// about 8%, the order of Envoy's and Ketama's rings). A server's points depend on its own
/// weight and the smallest, never on how many servers there are, so a server added or
/// removed leaves every other server's points where they were.
const POINTS_PER_SERVER: u64 = 160;
/// Most points of a ring (weights far apart get fewer points per weight unit).
const MAX_POINTS: u64 = 1 << 17;

/// A cluster's ring: points sorted by hash, each naming a server by its index.
pub(crate) struct Ring {
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// The ring of `servers`, each placed by its address (`ip:port`), so a server keeps its
    /// points whatever else changes in the cluster.
    pub(crate) fn new(servers: &[Arc<OriginServer>]) -> Ring {
        let weight = |s: &OriginServer| u64::from(s.weight.max(1));
        let total: u64 = servers.iter().map(|s| weight(s)).sum();
        let least = servers.iter().map(|s| weight(s)).min().unwrap_or(1);
        // Points per unit of weight, as a fraction (per_unit / least) kept under the cap.
        let per_unit = POINTS_PER_SERVER
            .min(MAX_POINTS * least / total.max(1))
            .max(1);
        let mut points = Vec::new();
        for (i, s) in servers.iter().enumerate() {
            let count = (weight(s) * per_unit / least).max(1);
            let base = key_of(s.label.as_bytes());
            for j in 1..=count {
                points.push((fmix64(base ^ j.wrapping_mul(GOLDEN)), i as u32));
            }
        }
        points.sort_unstable();
        Ring { points }
    }

    /// Where a walk for `key` starts: the first point at or after it (wrapping to the first
    /// point).
    pub(crate) fn start(&self, key: u64) -> usize {
        let i = self.points.partition_point(|p| p.0 < key);
        if i == self.points.len() {
            0
        } else {
            i
        }
    }

    /// The server of the point `start`: the owner of the keys that start there.
    pub(crate) fn owner(&self, start: usize) -> usize {
        self.points[start].1 as usize
    }

    /// The server that owns `key`.
    #[cfg(test)]
    fn primary(&self, key: u64) -> usize {
        self.owner(self.start(key))
    }

    /// The first server from the point `start` on, in ring order, that `ok` accepts; each
    /// server is asked once. `servers`: how many the cluster has (the walk stops once each
    /// was asked, for clusters of up to 256 servers).
    pub(crate) fn find(
        &self,
        start: usize,
        servers: usize,
        mut ok: impl FnMut(usize) -> bool,
    ) -> Option<usize> {
        let (after, before) = (&self.points[start..], &self.points[..start]);
        let mut seen = [0u64; 4];
        let mut asked = 0;
        for &(_, s) in after.iter().chain(before) {
            let s = s as usize;
            if let Some(word) = seen.get_mut(s / 64) {
                let bit = 1u64 << (s % 64);
                if *word & bit != 0 {
                    continue;
                }
                *word |= bit;
                asked += 1;
            }
            if ok(s) {
                return Some(s);
            }
            if asked == servers {
                return None;
            }
        }
        None
    }
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The hash of a key's bytes: FNV-1a, then MurmurHash3's finalizer to spread it over the
/// ring. Stable across processes and versions (a generated cookie keeps its server after a
/// restart).
pub(crate) fn key_of(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    fmix64(h)
}

/// The key of a client address (an IPv4-mapped IPv6 address is its IPv4 address).
pub(crate) fn ip_key(ip: IpAddr) -> u64 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => key_of(&v4.octets()),
        IpAddr::V6(v6) => key_of(&v6.octets()),
    }
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// A generated cookie's value: `token` as 16 lowercase hex digits.
pub(crate) fn hex16(token: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        let nibble = (token >> (60 - 4 * i)) & 0xf;
        *b = b"0123456789abcdef"[nibble as usize];
    }
    out
}

/// What a hash cluster hashes, compiled from its `hash` table.
pub(crate) struct HashPolicy {
    pub(crate) on: HashOn,
    /// `key = "header"`: the field.
    pub(crate) header: Option<HeaderName>,
    /// `key = "cookie"`: the cookie's name.
    pub(crate) cookie: Option<Box<str>>,
    /// `generate`: the generated cookie's attributes, from `"; Path="` on.
    attributes: Option<Box<str>>,
}

impl HashPolicy {
    fn new(cfg: &HashConfig) -> Result<HashPolicy, String> {
        let name = cfg.name.as_deref().unwrap_or("");
        let header = match cfg.key {
            HashOn::Header => {
                Some(HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?)
            }
            _ => None,
        };
        let cookie = (cfg.key == HashOn::Cookie).then(|| name.into());
        let attributes = cfg.generate.then(|| {
            let mut a = format!("; Path={}", cfg.cookie_path);
            if let Some(age) = cfg.cookie_max_age {
                a.push_str(&format!("; Max-Age={}", age.get().as_secs()));
            }
            a.push_str("; HttpOnly");
            if cfg.cookie_secure {
                a.push_str("; Secure");
            }
            a.into()
        });
        Ok(HashPolicy {
            on: cfg.key,
            header,
            cookie,
            attributes,
        })
    }

    /// A request without the key cookie gets one made here.
    pub(crate) fn generates(&self) -> bool {
        self.attributes.is_some()
    }

    /// The `Set-Cookie` value of a cookie generated from `token`.
    pub(crate) fn set_cookie(&self, token: u64) -> Option<HeaderValue> {
        let (name, attributes) = (self.cookie.as_deref()?, self.attributes.as_deref()?);
        let value = hex16(token);
        let value = std::str::from_utf8(&value).ok()?;
        HeaderValue::from_str(&format!("{name}={value}{attributes}")).ok()
    }
}

/// A hash cluster's ring, what it hashes, and its counts.
pub(crate) struct Hashing {
    pub(crate) ring: Ring,
    pub(crate) policy: HashPolicy,
    pub(crate) metrics: HashMetrics,
}

impl Hashing {
    pub(crate) fn new(
        cfg: &HashConfig,
        servers: &[Arc<OriginServer>],
        metrics: HashMetrics,
    ) -> Result<Hashing, String> {
        Ok(Hashing {
            ring: Ring::new(servers),
            policy: HashPolicy::new(cfg)?,
            metrics,
        })
    }
}

impl Cluster {
    /// Choose a server for a request with hash `key`: the first server on the ring from the
    /// key on that is available and not yet tried, else the first available one; when none
    /// is available, the first untried one (fail open) or none (fail closed, 503).
    pub(crate) fn choose_hashed(
        &self,
        h: &Hashing,
        key: u64,
        tried: &[usize],
    ) -> Result<&Arc<OriginServer>, Error> {
        let (ring, n) = (&h.ring, self.servers.len());
        let start = ring.start(key);
        let primary = ring.owner(start);
        let fresh = |i: usize| !tried.contains(&self.servers[i].state.id);
        let up = |i: usize| self.servers[i].state.health.available();
        if fresh(primary) && up(primary) {
            h.metrics.primary.inc();
            return Ok(&self.servers[primary]);
        }
        let found = (ring.find(start, n, |i| fresh(i) && up(i)))
            .or_else(|| ring.find(start, n, up))
            .or_else(|| match self.config.all_unhealthy {
                AllUnhealthy::FailOpen => ring.find(start, n, fresh).or(Some(primary)),
                AllUnhealthy::FailClosed => None,
            });
        let Some(i) = found else {
            return Err(Error::new(
                Kind::NoHealthyOrigin,
                "no healthy server in the cluster",
            ));
        };
        if i == primary {
            h.metrics.primary.inc();
        } else {
            h.metrics.moved.inc();
        }
        Ok(&self.servers[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::intern_origin;
    use std::net::SocketAddr;

    fn servers(ports: impl Iterator<Item = u16>) -> Vec<Arc<OriginServer>> {
        ports
            .map(|port| {
                let addr: SocketAddr = format!("10.1.2.3:{port}").parse().unwrap();
                Arc::new(OriginServer {
                    state: intern_origin(addr),
                    label: addr.to_string().into(),
                    authority: HeaderValue::from_static("x"),
                    weight: 1,
                    tls: None,
                    protocol: keymaster_config::UpstreamProtocol::Http1,
                    metrics: crate::metrics::ServerMetrics::for_tests(),
                })
            })
            .collect()
    }

    /// Each key's owner, by address.
    fn owners(ring: &Ring, s: &[Arc<OriginServer>], keys: u64) -> Vec<Arc<str>> {
        (0..keys)
            .map(|k| s[ring.primary(key_of(&k.to_le_bytes()))].label.clone())
            .collect()
    }

    #[test]
    fn adding_one_of_n_servers_moves_about_one_nth_of_the_keys_and_only_to_it() {
        const KEYS: u64 = 100_000;
        let four = servers(9000..9004);
        let five = servers(9000..9005);
        let before = owners(&Ring::new(&four), &four, KEYS);
        let after = owners(&Ring::new(&five), &five, KEYS);
        let moved: Vec<_> = (0..KEYS as usize)
            .filter(|&i| before[i] != after[i])
            .collect();
        assert!(moved.iter().all(|&i| *after[i] == *five[4].label));
        // Expected 1/5 of the keys; the new server's share varies by about 8% of itself.
        let share = moved.len() as f64 / KEYS as f64;
        assert!((0.15..0.25).contains(&share), "{share}");
    }

    #[test]
    fn shares_follow_weights() {
        let mut s = servers(9100..9103);
        Arc::get_mut(&mut s[0]).unwrap().weight = 2;
        let ring = Ring::new(&s);
        let all = owners(&ring, &s, 100_000);
        let first = all.iter().filter(|l| ***l == *s[0].label).count() as f64 / 1e5;
        assert!((0.42..0.58).contains(&first), "{first}");
    }

    #[test]
    fn weights_far_apart_stay_under_the_cap() {
        let mut s = servers(9300..9302);
        Arc::get_mut(&mut s[1]).unwrap().weight = 10_000;
        let ring = Ring::new(&s);
        assert!(
            ring.points.len() as u64 <= MAX_POINTS + 2,
            "{}",
            ring.points.len()
        );
        assert!(
            ring.points.iter().any(|p| p.1 == 0),
            "the light server keeps points"
        );
    }

    #[test]
    fn a_walk_asks_each_server_once_in_ring_order() {
        let s = servers(9200..9205);
        let ring = Ring::new(&s);
        let start = ring.start(key_of(b"user-7"));
        let mut asked = Vec::new();
        let none = ring.find(start, 5, |i| {
            asked.push(i);
            false
        });
        assert_eq!(none, None);
        asked.sort_unstable();
        assert_eq!(asked, vec![0, 1, 2, 3, 4]);
        let primary = ring.owner(start);
        assert_eq!(ring.find(start, 5, |_| true), Some(primary));
        let next = ring.find(start, 5, |i| i != primary).unwrap();
        assert_ne!(next, primary);
        // Deterministic: the same key walks the same way.
        assert_eq!(ring.find(start, 5, |i| i != primary), Some(next));
    }

    #[test]
    fn keys_and_cookie_values_are_stable() {
        assert_eq!(&hex16(0x0123_4567_89ab_cdef), b"0123456789abcdef");
        assert_eq!(key_of(b"abc"), key_of(b"abc"));
        assert_ne!(key_of(b"abc"), key_of(b"abd"));
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(ip_key(v4), ip_key(mapped));
    }
}
