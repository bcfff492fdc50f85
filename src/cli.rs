//! The command line: parses it and wires the subcommands to the gateway, config and bench
//! crates. No logic of its own lives here.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use keymaster_config::{
    ClusterConfig, Config, ListenerConfig, OriginServerConfig, RouteConfig, RouteMatch,
    TlsCertificate, TlsConfig,
};
use keymaster_gateway::{ConfigSource, Gateway, Signals};

/// keymaster: a programmable, non-blocking HTTP edge gateway.
///
/// With no subcommand it runs the embedded default config: gateway on 127.0.0.1:8080,
/// admin on 127.0.0.1:9901, everything routed to a built-in stub origin on 127.0.0.1:8081.
#[derive(Parser)]
#[command(name = "keymaster", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway on a TOML config (or the embedded default config).
    Run(RunArgs),
    /// Check a config file and print every problem with file, line and key.
    Validate(ValidateArgs),
    /// A one-route gateway with production defaults and no config file.
    Proxy(ProxyArgs),
    /// The benchmark origin: `?length=N&delay=MS&dither=MS&gzip=1&chunked=1&status=CODE`.
    Stub(keymaster_bench::stub::StubArgs),
    /// Load generator: closed loop (like wrk), open loop at a rate (like wrk2), or churn.
    Load(keymaster_bench::load::LoadArgs),
    /// The bake-off: stub, keymaster and peers (nginx, HAProxy) under the seed's scenarios.
    Bench(keymaster_bench::bench::BenchArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Config file; without it the embedded default config runs with its built-in stub.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct ValidateArgs {
    /// Config file to check.
    #[arg(long, short)]
    config: PathBuf,
}

#[derive(Args)]
struct ProxyArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Origin server, HOST:PORT.
    #[arg(long)]
    to: String,
    /// Worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Admin listener address (off unless given).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Also listen with TLS here (ALPN h2 and http/1.1); needs --tls-cert and --tls-key.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    tls_listen: Option<SocketAddr>,
    /// PEM certificate chain for --tls-listen.
    #[arg(long)]
    tls_cert: Option<String>,
    /// PEM private key for --tls-listen.
    #[arg(long)]
    tls_key: Option<String>,
    /// One listening socket every worker accepts from, instead of one `SO_REUSEPORT`
    /// socket per worker (the listeners' `reuse_port = false`).
    #[arg(long)]
    no_reuse_port: bool,
}

/// The whole command line, with `keymaster`'s filters plus `extra`.
pub(crate) fn main(extra: &crate::Keymaster) -> ExitCode {
    // Colours only on a terminal, and never with NO_COLOR set (https://no-color.org):
    // journald, docker logs and files get plain text. RUST_LOG picks what is logged.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        None => run(RunArgs { config: None }, extra),
        Some(Command::Run(a)) => run(a, extra),
        Some(Command::Validate(a)) => validate(a, extra),
        Some(Command::Proxy(a)) => proxy(a, extra),
        Some(Command::Stub(a)) => keymaster_bench::stub::stub_main(a).map_err(|e| e.to_string()),
        Some(Command::Load(a)) => keymaster_bench::load::load_main(a),
        Some(Command::Bench(a)) => keymaster_bench::bench::bench_main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keymaster: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs, extra: &crate::Keymaster) -> Result<(), String> {
    let (config, source, stub) = match args.config {
        Some(path) => {
            let config = keymaster_config::load_file(&path).map_err(|e| e.to_string())?;
            (config, ConfigSource::File(path), None)
        }
        None => {
            let config = keymaster_config::default_config();
            let stub_addr: SocketAddr = ([127, 0, 0, 1], 8081).into();
            let stub = keymaster_bench::stub::spawn_stub(stub_addr, 1)
                .map_err(|e| format!("built-in stub origin on {stub_addr}: {e}"))?;
            (config, ConfigSource::Embedded, Some(stub))
        }
    };
    let signals = Signals::install().map_err(|e| format!("signal handlers: {e}"))?;
    let (gateway, _lua) = extra.start(config, source.clone())?;
    let stub_addr = stub.as_ref().map(|s| s.local_addr());
    gateway
        .run_until_signal(signals, |g| print_banner(g, &source, stub_addr))
        .map_err(|e| e.to_string())?;
    if let Some(stub) = stub {
        stub.shutdown();
    }
    Ok(())
}

fn print_banner(gateway: &Gateway, source: &ConfigSource, stub: Option<SocketAddr>) {
    let what = match source {
        ConfigSource::Embedded => "embedded default config".to_string(),
        ConfigSource::File(p) => p.display().to_string(),
        ConfigSource::Memory => "command-line config".to_string(),
    };
    println!("keymaster {} running ({what})", env!("CARGO_PKG_VERSION"));
    for (name, addr) in gateway.listeners() {
        let scheme = gateway.listener_scheme(name);
        println!("  listener {name:<10} {scheme}://{addr}");
    }
    if let Some(a) = gateway.admin_addr() {
        println!(
            "  admin               http://{a}  (/metrics /healthz /ready /config, POST /reload)"
        );
    }
    if let Some(s) = stub {
        println!("  built-in stub       http://{s}");
    }
    if let Some((_, addr)) = gateway.listeners().first() {
        println!("try:");
        println!("  curl -i 'http://{addr}/hello?length=64'");
        if let Some(a) = gateway.admin_addr() {
            println!("  curl -s http://{a}/metrics | grep keymaster_requests_total");
        }
    }
    println!("stop with Ctrl-C (drains in-flight requests); SIGHUP reloads the config");
    if let Some(a) = gateway.admin_addr() {
        println!("  (as does: curl -X POST -H 'X-Keymaster-Admin: 1' http://{a}/reload)");
    }
}

/// Check a config file as `run` would: its rules, then its files and filters (TLS, the
/// access log, server lists, Lua files), every problem in one report.
fn validate(args: ValidateArgs, extra: &crate::Keymaster) -> Result<(), String> {
    let shown = args.config.display();
    let problems: Vec<String> = match keymaster_config::load_file(&args.config) {
        Ok(config) => {
            let (natives, sources) = extra.filters(&keymaster_lua::LuaFilters::new());
            Gateway::check(&config, natives, sources)
                .into_iter()
                .map(|p| format!("{shown}: {p}"))
                .collect()
        }
        Err(errors) => errors.errors().iter().map(ToString::to_string).collect(),
    };
    if problems.is_empty() {
        println!("{shown}: ok");
        return Ok(());
    }
    for p in &problems {
        eprintln!("{p}");
    }
    Err(format!("{shown}: {} problem(s) found", problems.len()))
}

fn proxy(args: ProxyArgs, extra: &crate::Keymaster) -> Result<(), String> {
    let mut config = Config::default();
    config.server.workers = args.workers;
    config.admin.listen = args.admin;
    config.listeners = vec![ListenerConfig {
        address: args.listen,
        reuse_port: !args.no_reuse_port,
        ..ListenerConfig::default()
    }];
    if let (Some(address), Some(cert), Some(key)) = (args.tls_listen, args.tls_cert, args.tls_key) {
        config.listeners.push(ListenerConfig {
            name: "tls".into(),
            address,
            reuse_port: !args.no_reuse_port,
            tls: Some(TlsConfig {
                certificates: vec![TlsCertificate { cert, key }],
                ..TlsConfig::default()
            }),
            ..ListenerConfig::default()
        });
    }
    config.clusters = vec![ClusterConfig {
        name: "origin".into(),
        servers: vec![OriginServerConfig {
            address: args.to,
            weight: 1,
        }],
        ..ClusterConfig::default()
    }];
    config.routes = vec![RouteConfig {
        name: "all".into(),
        cluster: "origin".into(),
        matches: RouteMatch::default(),
        ..RouteConfig::default()
    }];
    keymaster_config::validate(&config).map_err(|e| e.to_string())?;
    let signals = Signals::install().map_err(|e| format!("signal handlers: {e}"))?;
    let (gateway, _lua) = extra.start(config, ConfigSource::Memory)?;
    gateway
        .run_until_signal(signals, |g| print_banner(g, &ConfigSource::Memory, None))
        .map_err(|e| e.to_string())
}
