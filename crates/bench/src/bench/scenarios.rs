//! The bench's scenarios: what each requests, over which protocol (cleartext HTTP/1.1, TLS,
//! HTTP/2 with prior knowledge), with which connection steps; `--scenario`, `--preset`,
//! `--connections` and `--quick` select them.

use super::BenchArgs;

/// Scenario names, in run order.
pub const SCENARIOS: [&str; 7] = [
    "ramp",
    "saturation",
    "gzip",
    "churn",
    "tls-handshake",
    "tls",
    "h2",
];

/// One scenario to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name.
    pub name: &'static str,
    /// Description for the report.
    pub title: String,
    /// Path and query.
    pub path: String,
    /// New connection per request.
    pub churn: bool,
    /// Over TLS (the systems' TLS listener, the parity crypto of [`crate::load::tls`]).
    pub tls: bool,
    /// HTTP/2 with prior knowledge from the client (the systems' h2c listener).
    pub h2: bool,
    /// Connection steps.
    pub connections: Vec<usize>,
}

/// The seed's ramp (2013 report): 700 to 2000 connections.
pub const PRESET_2013: [usize; 8] = [700, 900, 1100, 1300, 1500, 1700, 1900, 2000];

/// The largest `--body`: a step's responses are held in memory only a buffer at a time, but
/// a 64 MB response over hundreds of connections is a network benchmark, not a proxy's.
const MAX_BODY: usize = 64 << 20;

/// `--body`: bytes, or a number with a `KB` or `MB` suffix (powers of 1024; `k`, `m` too).
pub fn parse_body(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1 << 10,
        "m" | "mb" => 1 << 20,
        _ => {
            return Err(format!(
                "{text:?}: a size is bytes or a number with KB or MB"
            ))
        }
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{text:?}: a size is bytes or a number with KB or MB"))?;
    match n.checked_mul(scale) {
        Some(0) => Err("--body must be at least 1 byte".into()),
        Some(b) if b <= MAX_BODY => Ok(b),
        _ => Err(format!("{text:?}: at most 64 MB")),
    }
}

/// A body size as the reports write it: `1 KB`, `10 KB`, `1 MB`, `1500 B`.
pub fn size_label(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The scenarios `args` asks for, with their steps.
pub fn scenarios(args: &BenchArgs) -> Result<Vec<Scenario>, String> {
    for s in &args.scenarios {
        if !SCENARIOS.contains(&s.as_str()) {
            return Err(format!(
                "unknown scenario {s:?} (known: {})",
                SCENARIOS.join(", ")
            ));
        }
    }
    if !args.connections.is_empty() && args.preset.is_some() {
        return Err("--preset and --connections both set the ramp steps: pick one".into());
    }
    let ramp = match (
        args.preset.as_deref(),
        args.connections.is_empty(),
        args.quick,
    ) {
        (Some("2013"), _, _) => PRESET_2013.to_vec(),
        (Some(p), _, _) => return Err(format!("unknown preset {p:?} (known: 2013)")),
        (None, false, _) => args.connections.clone(),
        (None, true, true) => vec![100, 400, 1600],
        (None, true, false) => vec![100, 200, 400, 800, 1600],
    };
    let saturation = if args.saturation_connections.is_empty() {
        vec![64]
    } else {
        args.saturation_connections.clone()
    };
    let (gzip, mut churn) = if args.quick {
        (vec![200], vec![32])
    } else {
        (vec![100, 200, 400], vec![16, 64])
    };
    if !args.churn_connections.is_empty() {
        churn = args.churn_connections.clone();
    }
    let (body, size) = (args.body, size_label(args.body));
    let tls_steps = if args.quick { vec![64] } else { vec![16, 64] };
    let all = vec![
        Scenario {
            name: "ramp",
            title: format!("the seed ramp: {size} body, 50 ms stub delay"),
            path: format!("/?length={body}&delay=50"),
            churn: false,
            tls: false,
            h2: false,
            connections: ramp,
        },
        Scenario {
            name: "saturation",
            title: format!("no delay, {size} body: maximum throughput and CPU per request"),
            path: format!("/?length={body}"),
            churn: false,
            tls: false,
            h2: false,
            connections: saturation,
        },
        Scenario {
            name: "gzip",
            title: "10 KB gzip body, 0–50 ms dither (the 2013 m1.medium run)".into(),
            path: "/?length=10240&gzip=1&dither=50".into(),
            churn: false,
            tls: false,
            h2: false,
            connections: gzip,
        },
        Scenario {
            name: "churn",
            title: format!(
                "connection churn: a new client connection per request, {size}, no delay"
            ),
            path: format!("/?length={body}"),
            churn: true,
            tls: false,
            h2: false,
            connections: churn,
        },
        Scenario {
            name: "tls-handshake",
            title: format!(
                "TLS handshakes: a new connection and full handshake per request, {size}, no delay ({})",
                crate::load::tls::TLS_PARITY
            ),
            path: format!("/?length={body}"),
            churn: true,
            tls: true,
            h2: false,
            connections: tls_steps.clone(),
        },
        Scenario {
            name: "tls",
            title: format!(
                "keep-alive over TLS, {size}, no delay: CPU per TLS request ({})",
                crate::load::tls::TLS_PARITY
            ),
            path: format!("/?length={body}"),
            churn: false,
            tls: true,
            h2: false,
            connections: tls_steps.clone(),
        },
        Scenario {
            name: "h2",
            title: format!("HTTP/2 from the client (prior knowledge, one stream at a time per connection), {size}, no delay: CPU per request over h2"),
            path: format!("/?length={body}"),
            churn: false,
            tls: false,
            h2: true,
            connections: tls_steps,
        },
    ];
    Ok(all
        .into_iter()
        .filter(|s| args.scenarios.is_empty() || args.scenarios.iter().any(|n| n == s.name))
        .collect())
}
