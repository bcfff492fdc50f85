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
    let (gzip, churn) = if args.quick {
        (vec![200], vec![32])
    } else {
        (vec![100, 200, 400], vec![16, 64])
    };
    let tls_steps = if args.quick { vec![64] } else { vec![16, 64] };
    let all = vec![
        Scenario {
            name: "ramp",
            title: "the seed ramp: 1 KB body, 50 ms stub delay".into(),
            path: "/?length=1024&delay=50".into(),
            churn: false,
            tls: false,
            h2: false,
            connections: ramp,
        },
        Scenario {
            name: "saturation",
            title: "no delay, 1 KB body: maximum throughput and CPU per request".into(),
            path: "/?length=1024".into(),
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
            title: "connection churn: a new client connection per request, 1 KB, no delay".into(),
            path: "/?length=1024".into(),
            churn: true,
            tls: false,
            h2: false,
            connections: churn,
        },
        Scenario {
            name: "tls-handshake",
            title: format!(
                "TLS handshakes: a new connection and full handshake per request, 1 KB, no delay ({})",
                crate::load::tls::TLS_PARITY
            ),
            path: "/?length=1024".into(),
            churn: true,
            tls: true,
            h2: false,
            connections: tls_steps.clone(),
        },
        Scenario {
            name: "tls",
            title: format!(
                "keep-alive over TLS, 1 KB, no delay: CPU per TLS request ({})",
                crate::load::tls::TLS_PARITY
            ),
            path: "/?length=1024".into(),
            churn: false,
            tls: true,
            h2: false,
            connections: tls_steps.clone(),
        },
        Scenario {
            name: "h2",
            title: "HTTP/2 from the client (prior knowledge, one stream at a time per connection), 1 KB, no delay: CPU per request over h2".into(),
            path: "/?length=1024".into(),
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
