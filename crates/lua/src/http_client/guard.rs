//! Where `ctx.http` may not connect: the admin listener, which can reload the gateway
//! (unless `[lua] http_allow_admin`). Every address is checked after it is resolved and
//! before it is connected to, and again before an idle connection to it is reused.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

/// Where `ctx.http` may not connect: the admin listener (it can reload the gateway), unless
/// `[lua] http_allow_admin`.
pub(crate) struct AdminGuard {
    /// `[lua] http_allow_admin`.
    pub allow: bool,
    /// `[admin] listen` of the config version (`None`: no admin listener).
    pub configured: Option<SocketAddr>,
    /// The running admin listener's address, once bound: it wins over `configured` (a
    /// reload does not move the listener, and port 0 is only known once bound).
    pub bound: Arc<OnceLock<SocketAddr>>,
}

impl AdminGuard {
    /// Whether a connection to `to` may reach the admin listener: its port (any port while
    /// a configured port 0 is not bound yet) at its IP, or, when it listens on a loopback
    /// or unspecified address, at a loopback, unspecified or local interface address.
    pub(crate) fn refuses(&self, to: SocketAddr) -> bool {
        if self.allow {
            return false;
        }
        let Some(admin) = self.bound.get().copied().or(self.configured) else {
            return false;
        };
        if admin.port() != 0 && to.port() != admin.port() {
            return false;
        }
        let (ip, admin_ip) = (to.ip().to_canonical(), admin.ip().to_canonical());
        if ip == admin_ip {
            return true;
        }
        (admin_ip.is_loopback() || admin_ip.is_unspecified())
            && (ip.is_loopback() || ip.is_unspecified() || is_local(ip))
    }
}

/// Whether `ip` is an address of this host: a socket can be bound to it.
fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allow: bool, configured: &str, bound: Option<&str>) -> AdminGuard {
        let cell = OnceLock::new();
        if let Some(b) = bound {
            let _ = cell.set(b.parse().unwrap());
        }
        AdminGuard {
            allow,
            configured: Some(configured.parse().unwrap()),
            bound: Arc::new(cell),
        }
    }

    fn refuses(g: &AdminGuard, to: &str) -> bool {
        g.refuses(to.parse().unwrap())
    }

    #[test]
    fn the_admin_listener_is_refused_at_every_address_that_reaches_it() {
        let g = guard(false, "127.0.0.1:9901", None);
        assert!(refuses(&g, "127.0.0.1:9901"));
        assert!(refuses(&g, "127.0.0.2:9901"), "all of 127/8 is loopback");
        assert!(refuses(&g, "0.0.0.0:9901"));
        assert!(refuses(&g, "[::1]:9901"));
        assert!(refuses(&g, "[::ffff:127.0.0.1]:9901"));
        assert!(!refuses(&g, "127.0.0.1:9902"), "another port");
        assert!(!refuses(&g, "192.0.2.1:9901"), "not this host");
        assert!(!refuses(
            &guard(true, "127.0.0.1:9901", None),
            "127.0.0.1:9901"
        ));
        // An unspecified admin address listens on every local address.
        let g = guard(false, "0.0.0.0:9901", None);
        assert!(refuses(&g, "127.0.0.1:9901"));
        assert!(!refuses(&g, "192.0.2.1:9901"));
        // A specific non-loopback address: only that address.
        let g = guard(false, "192.0.2.7:9901", None);
        assert!(refuses(&g, "192.0.2.7:9901"));
        assert!(!refuses(&g, "127.0.0.1:9901"));
    }

    #[test]
    fn port_zero_refuses_every_port_until_the_listener_is_bound() {
        let g = guard(false, "127.0.0.1:0", None);
        assert!(refuses(&g, "127.0.0.1:80"));
        let g = guard(false, "127.0.0.1:0", Some("127.0.0.1:40001"));
        assert!(refuses(&g, "127.0.0.1:40001"));
        assert!(!refuses(&g, "127.0.0.1:80"));
        // The bound address wins over a reloaded config's.
        let g = guard(false, "127.0.0.1:9999", Some("127.0.0.1:40001"));
        assert!(refuses(&g, "127.0.0.1:40001"));
        assert!(!refuses(&g, "127.0.0.1:9999"));
    }
}
