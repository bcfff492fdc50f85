//! Query-string parameters of the stub origin and the pure decisions made from them (delay,
//! status, gzip negotiation), kept free of I/O so they can be unit tested exactly.

use std::time::Duration;

use super::content::MAX_LENGTH;

/// Body length served when the request does not say `length=`.
pub const DEFAULT_LENGTH: usize = 64;

/// Largest `delay=` or `dither=` accepted, in milliseconds (one hour).
pub const MAX_DELAY_MS: u64 = 3_600_000;

/// What a request asked for through its query string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubParams {
    /// `length=N`: identity body length in bytes.
    pub length: usize,
    /// `delay=MS`: fixed delay before the response head.
    pub delay_ms: u64,
    /// `dither=MS`: extra uniform random delay in `[0, MS]`.
    pub dither_ms: u64,
    /// `gzip=1` forces gzip, `gzip=0` forbids it, absent means "follow Accept-Encoding".
    pub gzip: Option<bool>,
    /// `chunked=1`: chunked transfer coding instead of Content-Length.
    pub chunked: bool,
    /// `status=CODE`.
    pub status: u16,
    /// `echo=1`: stream the request body back.
    pub echo: bool,
}

impl Default for StubParams {
    fn default() -> Self {
        StubParams {
            length: DEFAULT_LENGTH,
            delay_ms: 0,
            dither_ms: 0,
            gzip: None,
            chunked: false,
            status: 200,
            echo: false,
        }
    }
}

fn flag(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "" | "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(format!("{key}={value}: expected 1 or 0")),
    }
}

fn number(key: &str, value: &str, max: u64) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        Ok(_) => Err(format!("{key}={value}: larger than {max}")),
        Err(_) => Err(format!("{key}={value}: expected a non-negative integer")),
    }
}

impl StubParams {
    /// Parses a query string (without `?`). Unknown keys are ignored; bad values are errors
    /// (the stub answers them with 400).
    pub fn parse(query: Option<&str>) -> Result<StubParams, String> {
        let mut p = StubParams::default();
        let Some(query) = query else { return Ok(p) };
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "length" => p.length = number(key, value, MAX_LENGTH as u64)? as usize,
                "delay" => p.delay_ms = number(key, value, MAX_DELAY_MS)?,
                "dither" => p.dither_ms = number(key, value, MAX_DELAY_MS)?,
                "gzip" => p.gzip = Some(flag(key, value)?),
                "chunked" => p.chunked = flag(key, value)?,
                "echo" => p.echo = flag(key, value)?,
                "status" => {
                    let code = number(key, value, 999)?;
                    if code < 200 {
                        return Err(format!("status={value}: must be 200..=999"));
                    }
                    p.status = code as u16;
                }
                _ => {}
            }
        }
        Ok(p)
    }

    /// The delay before answering: `delay + uniform[0, dither]` milliseconds, drawn from `rng`.
    pub fn pick_delay(&self, rng: &mut fastrand::Rng) -> Duration {
        let extra = if self.dither_ms == 0 {
            0
        } else {
            rng.u64(0..=self.dither_ms)
        };
        Duration::from_millis(self.delay_ms + extra)
    }

    /// Whether the response is gzip-compressed, given the request's `Accept-Encoding` values.
    pub fn wants_gzip<'a>(&self, accept_encoding: impl IntoIterator<Item = &'a [u8]>) -> bool {
        match self.gzip {
            Some(forced) => forced,
            None => accept_encoding.into_iter().any(accepts_gzip),
        }
    }
}

/// Whether one `Accept-Encoding` header value accepts gzip (`gzip` or `x-gzip`, q not 0).
pub fn accepts_gzip(value: &[u8]) -> bool {
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    value.split(',').any(|item| {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim();
        if !coding.eq_ignore_ascii_case("gzip") && !coding.eq_ignore_ascii_case("x-gzip") {
            return false;
        }
        parts.all(|param| {
            let (k, v) = param.split_once('=').unwrap_or((param, ""));
            !(k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f32>() == Ok(0.0))
        })
    })
}

/// Whether a response with this status (or to a HEAD request) carries no body.
pub fn bodyless(status: u16, head: bool) -> bool {
    head || status == 204 || status == 304
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_parameter() {
        let p = StubParams::parse(Some(
            "length=1000&dither=50&delay=5&gzip=1&chunked=1&status=503&echo=0&other=x",
        ))
        .expect("valid");
        assert_eq!(
            p,
            StubParams {
                length: 1000,
                delay_ms: 5,
                dither_ms: 50,
                gzip: Some(true),
                chunked: true,
                status: 503,
                echo: false,
            }
        );
        assert_eq!(StubParams::parse(None), Ok(StubParams::default()));
        assert_eq!(StubParams::parse(Some("")), Ok(StubParams::default()));
        assert_eq!(
            StubParams::parse(Some("gzip")).map(|p| p.gzip),
            Ok(Some(true))
        );
    }

    #[test]
    fn rejects_bad_values() {
        for q in [
            "length=-1",
            "length=abc",
            "length=99999999999",
            "delay=1.5",
            "status=99",
            "status=1000",
            "status=101",
            "gzip=maybe",
        ] {
            assert!(StubParams::parse(Some(q)).is_err(), "{q}");
        }
    }

    #[test]
    fn delay_is_fixed_plus_bounded_dither() {
        let mut rng = fastrand::Rng::with_seed(7);
        let fixed = StubParams {
            delay_ms: 20,
            ..StubParams::default()
        };
        assert_eq!(fixed.pick_delay(&mut rng), Duration::from_millis(20));
        let dithered = StubParams {
            delay_ms: 10,
            dither_ms: 50,
            ..StubParams::default()
        };
        let picks: Vec<u64> = (0..10_000)
            .map(|_| dithered.pick_delay(&mut rng).as_millis() as u64)
            .collect();
        assert!(picks.iter().all(|&ms| (10..=60).contains(&ms)));
        // Uniform: both ends are reached and the mean is near the middle.
        assert_eq!(picks.iter().min(), Some(&10));
        assert_eq!(picks.iter().max(), Some(&60));
        let mean = picks.iter().sum::<u64>() as f64 / picks.len() as f64;
        assert!((34.0..36.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn gzip_negotiation() {
        let p = StubParams::default();
        assert!(p.wants_gzip([&b"gzip, deflate, br"[..]]));
        assert!(p.wants_gzip([&b"br"[..], &b"GZip;q=0.5"[..]]));
        assert!(p.wants_gzip([&b"x-gzip"[..]]));
        assert!(!p.wants_gzip([&b"gzip;q=0"[..]]));
        assert!(!p.wants_gzip([&b"deflate, br"[..]]));
        assert!(!p.wants_gzip(std::iter::empty()));
        let off = StubParams {
            gzip: Some(false),
            ..p.clone()
        };
        assert!(!off.wants_gzip([&b"gzip"[..]]));
        let on = StubParams {
            gzip: Some(true),
            ..p
        };
        assert!(on.wants_gzip(std::iter::empty()));
    }

    #[test]
    fn bodyless_statuses() {
        assert!(bodyless(204, false));
        assert!(bodyless(304, false));
        assert!(bodyless(200, true));
        assert!(!bodyless(200, false));
        assert!(!bodyless(500, false));
    }
}
