//! The command line of `keymaster bench` ([`BenchArgs`]) and its two choices of kind: what
//! the peers do to headers and which load driver runs the steps.

use std::path::PathBuf;
use std::time::Duration;

use super::scenarios;
use crate::load::parse_duration;

/// What the peers (nginx, HAProxy) do to headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PeerHeaders {
    /// keymaster's default header duties.
    #[default]
    Duties,
    /// Plain proxying.
    Minimal,
}

/// Which program drives the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Driver {
    /// The in-process generator ([`crate::load`]).
    #[default]
    Builtin,
    /// wrk as a child process ([`wrk`]); closed loop only.
    Wrk,
}

impl Driver {
    /// Name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Builtin => "builtin",
            Driver::Wrk => "wrk",
        }
    }

    /// The other driver.
    pub fn other(self) -> Driver {
        match self {
            Driver::Builtin => Driver::Wrk,
            Driver::Wrk => Driver::Builtin,
        }
    }
}

/// Arguments of `keymaster bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Scenarios to run (repeatable or comma-separated): ramp, saturation, gzip, churn.
    #[arg(long = "scenario", value_name = "NAME", value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Ramp steps: `2013` = the seed's 700, 900, ... 1900, 2000 connections (1 KB, 50 ms).
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Ramp connection steps (comma-separated), overriding the default 100,200,400,800,1600.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub connections: Vec<usize>,
    /// Connections of the saturation step(s).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub saturation_connections: Vec<usize>,
    /// Connections of the churn step(s), overriding the default 16,64.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub churn_connections: Vec<usize>,
    /// Response body of every scenario but gzip (10 KB): bytes, or with a `KB` or `MB` suffix
    /// (powers of 1024), up to 64 MB.
    #[arg(long, value_name = "SIZE", default_value = "1KB", value_parser = scenarios::parse_body)]
    pub body: usize,
    /// Run only these systems (comma-separated): keymaster, nginx, haproxy, direct, peer names.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Peers to look for: `auto` (nginx and HAProxy if installed) or `none`.
    #[arg(long, value_name = "auto|none", default_value = "auto")]
    pub peers: String,
    /// What nginx and HAProxy do to headers: `duties` = keymaster's default header duties
    /// (Host kept, X-Forwarded-For/-Proto/-Host, Via both ways, a request id to the origin
    /// and back), so that every system does the same work and sends the stub and the
    /// generator the same bytes; `minimal` = plain proxying (the runs before 2026-11-25).
    #[arg(long, value_enum, value_name = "duties|minimal", default_value_t = PeerHeaders::Duties)]
    pub peer_headers: PeerHeaders,
    /// Another system: `NAME='command with {listen} {port} {origin} {workers}'` (repeatable).
    #[arg(long = "peer", value_name = "NAME=CMD")]
    pub extra_peers: Vec<String>,
    /// keymaster binary to test (default: this one).
    #[arg(long, value_name = "PATH")]
    pub keymaster: Option<PathBuf>,
    /// Workers of every system under test (threads for keymaster and HAProxy, processes for nginx).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub workers: usize,
    /// Pin the system under test to the first `workers` CPUs, the stub and generator to the rest.
    #[arg(long)]
    pub pin: bool,
    /// Measured time per step (default 10s; 2s with --quick).
    #[arg(short = 'd', long, value_name = "TIME", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Unmeasured time at the start of each step, at least 1 ms per connection (default 2s;
    /// 500ms with --quick).
    #[arg(long, value_name = "TIME", value_parser = parse_duration)]
    pub settle: Option<Duration>,
    /// Warm-up per system start (default 10s; 1s with --quick).
    #[arg(long, value_name = "TIME", value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// Repeat every step N times (each repeat a full pass over the systems); report min/median/max.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub repeats: usize,
    /// Short steps and fewer of them: everything in under 3 minutes.
    #[arg(long)]
    pub quick: bool,
    /// Open loop at this rate (requests/s) instead of closed loop.
    #[arg(short = 'R', long, value_name = "REQ_PER_SEC")]
    pub rate: Option<u64>,
    /// Load generator threads (0 = the CPUs it may use).
    #[arg(short = 't', long, value_name = "T", default_value_t = 0)]
    pub threads: usize,
    /// Per-request timeout.
    #[arg(long, value_name = "TIME", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Results directory (default bench-results/<UTC timestamp>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Note for the report header (e.g. "shared 2-core VM").
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
    /// Print results.json to stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Load driver for every step: the built-in generator or wrk (must be on PATH).
    #[arg(long, value_enum, value_name = "builtin|wrk", default_value_t = Driver::Builtin)]
    pub driver: Driver,
    /// Also run every step with the other driver, right after, and compare requests/s and p50
    /// (flagged when they differ by more than 10%); writes drivers.md. Needs wrk.
    #[arg(long)]
    pub compare_drivers: bool,
}
