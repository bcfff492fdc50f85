//! The `ctx.http` client's counters: calls by result, connections opened and reused, and
//! retries. Plain atomics (every worker counts into the same ones), rendered in the
//! Prometheus text format for the gateway's `/metrics` ([`HttpMetrics::render`]). Every
//! series exists from the start, at zero.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a `ctx.http` call ended (the `result` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A response (any status) with its whole body.
    Ok,
    /// The call's timeout passed first.
    Timeout,
    /// The host did not resolve, or no connection could be made.
    Connect,
    /// The TLS handshake failed (certificate, name, protocol).
    Tls,
    /// Every address of the host reaches the admin listener.
    Refused,
    /// The URL or the call's options are unusable (scheme, host).
    Invalid,
    /// The exchange failed: the connection closed, a malformed or too large response.
    Error,
}

const OUTCOMES: [Outcome; 7] = [
    Outcome::Ok,
    Outcome::Timeout,
    Outcome::Connect,
    Outcome::Tls,
    Outcome::Refused,
    Outcome::Invalid,
    Outcome::Error,
];

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Timeout => "timeout",
            Outcome::Connect => "connect_error",
            Outcome::Tls => "tls_error",
            Outcome::Refused => "refused",
            Outcome::Invalid => "invalid",
            Outcome::Error => "error",
        }
    }
}

/// `http` or `https` (the `scheme` label), as an index.
pub(crate) fn scheme_index(tls: bool) -> usize {
    usize::from(tls)
}

const SCHEMES: [&str; 2] = ["http", "https"];

/// The client's counters, shared by every worker of a process's Lua host.
#[derive(Default)]
pub(crate) struct HttpMetrics {
    calls: [AtomicU64; OUTCOMES.len()],
    opened: [AtomicU64; 2],
    reused: [AtomicU64; 2],
    retries: AtomicU64,
}

impl HttpMetrics {
    pub(crate) fn call(&self, outcome: Outcome) {
        let i = OUTCOMES.iter().position(|o| *o == outcome).unwrap_or(0);
        self.calls[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn opened(&self, tls: bool) {
        self.opened[scheme_index(tls)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reused(&self, tls: bool) {
        self.reused[scheme_index(tls)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn retried(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// The families in the Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        family(
            &mut out,
            "keymaster_lua_http_calls_total",
            "ctx.http calls by result (ok: a response of any status).",
        );
        for (o, n) in OUTCOMES.iter().zip(&self.calls) {
            sample(&mut out, "calls", "result", o.label(), n);
        }
        family(
            &mut out,
            "keymaster_lua_http_connections_opened_total",
            "Connections ctx.http opened, by scheme.",
        );
        for (s, n) in SCHEMES.iter().zip(&self.opened) {
            sample(&mut out, "connections_opened", "scheme", s, n);
        }
        family(
            &mut out,
            "keymaster_lua_http_connections_reused_total",
            "ctx.http requests sent on a pooled (kept-alive) connection, by scheme.",
        );
        for (s, n) in SCHEMES.iter().zip(&self.reused) {
            sample(&mut out, "connections_reused", "scheme", s, n);
        }
        family(
            &mut out,
            "keymaster_lua_http_retries_total",
            "ctx.http requests sent again on a new connection after a pooled one was closed.",
        );
        let _ = writeln!(
            out,
            "keymaster_lua_http_retries_total {}",
            self.retries.load(Ordering::Relaxed)
        );
        out
    }
}

fn family(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
}

fn sample(out: &mut String, what: &str, label: &str, value: &str, n: &AtomicU64) {
    let _ = writeln!(
        out,
        "keymaster_lua_http_{what}_total{{{label}=\"{value}\"}} {}",
        n.load(Ordering::Relaxed)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_rendered_from_the_start() {
        let m = HttpMetrics::default();
        m.call(Outcome::Tls);
        m.opened(true);
        let text = m.render();
        for line in [
            "keymaster_lua_http_calls_total{result=\"ok\"} 0",
            "keymaster_lua_http_calls_total{result=\"tls_error\"} 1",
            "keymaster_lua_http_calls_total{result=\"timeout\"} 0",
            "keymaster_lua_http_connections_opened_total{scheme=\"https\"} 1",
            "keymaster_lua_http_connections_reused_total{scheme=\"http\"} 0",
            "keymaster_lua_http_retries_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }
}
