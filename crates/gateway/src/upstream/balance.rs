//! Server selection: weighted random (the 2013 port's choice), smooth weighted round robin,
//! and least outstanding requests by power of two random choices. Lock-free: the only
//! shared state is each server's atomic outstanding count; round robin steps a cursor per
//! worker (as nginx's workers do), so that picks write no memory another worker writes.

use std::sync::Arc;

use super::OriginServer;
use crate::metrics::sharded::Cursor;
use keymaster_config::Balance;

pub(crate) enum Balancer {
    Single,
    Random {
        /// Cumulative weights; empty when all weights are equal.
        cumulative: Vec<u64>,
    },
    RoundRobin {
        /// A smooth weighted round-robin sequence of server indexes.
        sequence: Vec<usize>,
        cursor: Cursor,
    },
    LeastOutstanding,
}

impl Balancer {
    /// `cursor`: where round robin is (the cluster's, kept across config versions).
    pub(crate) fn new(kind: Balance, servers: &[Arc<OriginServer>], cursor: &Cursor) -> Balancer {
        if servers.len() == 1 {
            return Balancer::Single;
        }
        let weights: Vec<u64> = servers.iter().map(|s| u64::from(s.weight)).collect();
        let uniform = weights.iter().all(|&w| w == weights[0]);
        match kind {
            // A hash cluster's request without a key: weighted random.
            Balance::Random | Balance::Hash => Balancer::Random {
                cumulative: if uniform {
                    Vec::new()
                } else {
                    weights
                        .iter()
                        .scan(0u64, |acc, w| {
                            *acc += w;
                            Some(*acc)
                        })
                        .collect()
                },
            },
            Balance::RoundRobin => Balancer::RoundRobin {
                sequence: smooth_wrr_sequence(&weights),
                cursor: cursor.clone(),
            },
            Balance::LeastOutstanding => Balancer::LeastOutstanding,
        }
    }

    pub(crate) fn pick<'a>(&self, servers: &'a [Arc<OriginServer>]) -> &'a Arc<OriginServer> {
        match self {
            Balancer::Single => &servers[0],
            Balancer::Random { cumulative } => {
                if cumulative.is_empty() {
                    &servers[fastrand::usize(..servers.len())]
                } else {
                    let total = cumulative[cumulative.len() - 1];
                    let r = fastrand::u64(..total);
                    let i = cumulative.partition_point(|&c| c <= r);
                    &servers[i.min(servers.len() - 1)]
                }
            }
            Balancer::RoundRobin { sequence, cursor } => {
                let n = cursor.next();
                &servers[sequence[n % sequence.len()]]
            }
            Balancer::LeastOutstanding => {
                let n = servers.len();
                let a = fastrand::usize(..n);
                let mut b = fastrand::usize(..n - 1);
                if b >= a {
                    b += 1;
                }
                let (sa, sb) = (&servers[a], &servers[b]);
                // Compare outstanding/weight without division.
                let la = sa.outstanding() as u64 * u64::from(sb.weight);
                let lb = sb.outstanding() as u64 * u64::from(sa.weight);
                if la <= lb {
                    sa
                } else {
                    sb
                }
            }
        }
    }
}

/// nginx's smooth weighted round robin, unrolled into one full cycle (length = sum of
/// weights after dividing by their gcd), so picking is one atomic increment.
fn smooth_wrr_sequence(weights: &[u64]) -> Vec<usize> {
    let g = weights.iter().copied().fold(0, gcd).max(1);
    let w: Vec<i64> = weights.iter().map(|&x| (x / g) as i64).collect();
    let total: i64 = w.iter().sum();
    let mut current = vec![0i64; w.len()];
    let mut seq = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, wi) in current.iter_mut().zip(&w) {
            *c += wi;
        }
        let (best, _) = current
            .iter()
            .enumerate()
            .max_by_key(|&(i, c)| (*c, std::cmp::Reverse(i)))
            .unwrap_or((0, &0));
        current[best] -= total;
        seq.push(best);
    }
    seq
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::intern_origin;
    use http::HeaderValue;
    use std::net::SocketAddr;
    use std::sync::atomic::Ordering;

    fn servers(weights: &[u32]) -> Vec<Arc<OriginServer>> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let addr: SocketAddr = format!("127.0.0.{}:{}", i + 1, 40000 + i).parse().unwrap();
                Arc::new(OriginServer {
                    state: intern_origin(addr),
                    label: addr.to_string().into(),
                    authority: HeaderValue::from_static("x"),
                    weight: w,
                    tls: None,
                    protocol: keymaster_config::UpstreamProtocol::Http1,
                    metrics: crate::metrics::ServerMetrics::for_tests(),
                })
            })
            .collect()
    }

    fn counts(b: &Balancer, s: &[Arc<OriginServer>], n: usize) -> Vec<usize> {
        let mut c = vec![0; s.len()];
        for _ in 0..n {
            let p = b.pick(s);
            c[s.iter().position(|x| Arc::ptr_eq(x, p)).unwrap()] += 1;
        }
        c
    }

    #[test]
    fn smooth_wrr_interleaves() {
        assert_eq!(smooth_wrr_sequence(&[5, 1, 1]), vec![0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(smooth_wrr_sequence(&[2, 2]), vec![0, 1]);
    }

    #[test]
    fn round_robin_is_exact_per_cycle() {
        let s = servers(&[3, 1]);
        let b = Balancer::new(Balance::RoundRobin, &s, &Cursor::default());
        assert_eq!(counts(&b, &s, 400), vec![300, 100]);
    }

    /// A config version that rebuilds the cluster keeps its round-robin place.
    #[test]
    fn round_robin_goes_on_where_the_last_version_stopped() {
        let s = servers(&[1, 1, 1]);
        let cursor = Cursor::default();
        let at = |b: &Balancer| {
            let picked = b.pick(&s);
            s.iter().position(|x| Arc::ptr_eq(x, picked)).unwrap()
        };
        let first = Balancer::new(Balance::RoundRobin, &s, &cursor);
        let start = at(&first);
        assert_eq!(at(&first), (start + 1) % 3);
        let rebuilt = Balancer::new(Balance::RoundRobin, &s, &cursor);
        assert_eq!(at(&rebuilt), (start + 2) % 3);
    }

    #[test]
    fn weighted_random_follows_weights() {
        let s = servers(&[9, 1]);
        let b = Balancer::new(Balance::Random, &s, &Cursor::default());
        let c = counts(&b, &s, 20_000);
        // Expected 18000/2000; 6 sigma is about 250.
        assert!((17_500..=18_500).contains(&c[0]), "{c:?}");
    }

    #[test]
    fn least_outstanding_avoids_the_busy_server() {
        let s = servers(&[1, 1]);
        s[0].state.outstanding.store(10, Ordering::Relaxed);
        let b = Balancer::new(Balance::LeastOutstanding, &s, &Cursor::default());
        assert_eq!(counts(&b, &s, 100), vec![0, 100]);
        s[0].state.outstanding.store(0, Ordering::Relaxed);
    }
}
