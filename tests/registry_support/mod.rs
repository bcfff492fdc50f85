//! Real service registries for discovery tests, each a child process on free 127.0.0.1 ports:
//!
//! - Consul (`tools/consul`: HashiCorp Consul 1.14, MPL-2.0, built from its Go modules) as a
//!   dev agent (in-memory, one node that is its own server);
//! - Eureka (`tools/eureka`: a Spring Cloud Netflix Eureka server, built with Maven);
//! - a Kubernetes API server over etcd ([`kube`], `tools/kube`).
//!
//! Binaries are found through `$KEYMASTER_CONSUL` / `$KEYMASTER_EUREKA_JAR`, or in their
//! tools directory, built there when missing (`.ci/run` builds both first). A registry that
//! can be neither found nor built FAILS the test. Killed on drop.
#![allow(dead_code)]

pub mod kube;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

fn tool(env: &str, dir: &str, file: &str, build: &[&str]) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _serial = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let path = dir.join(file);
    if !path.exists() {
        eprintln!("building {path:?} ({build:?}; minutes the first time)");
        let status = Command::new(build[0])
            .args(&build[1..])
            .current_dir(&dir)
            .status()
            .unwrap_or_else(|e| panic!("{build:?} cannot run: {e}"));
        assert!(status.success(), "{build:?} in {dir:?} failed");
    }
    assert!(path.exists(), "no {file} in {dir:?}");
    path
}

fn go() -> &'static str {
    ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| Command::new(g).arg("version").output().is_ok())
        .expect("Go is needed to build tools/consul (or set KEYMASTER_CONSUL)")
}

/// One HTTP/1.1 request on a fresh connection: status and body, or `None` if it failed.
pub async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    call_with(addr, method, path, body, None).await
}

/// [`call`] with a Consul ACL token.
pub async fn call_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> Option<(u16, String)> {
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("x-consul-token", token.unwrap_or(""))
        .body(Full::new(Bytes::from(body.to_string())))
        .ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(20), send.send_request(req))
        .await
        .ok()?
        .ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `call` that must answer 200 (or 204).
async fn ok(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    ok_with(addr, method, path, body, None).await
}

async fn ok_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> String {
    let (status, text) = call_with(addr, method, path, body, token)
        .await
        .unwrap_or_else(|| panic!("{method} {path}: no answer"));
    assert!(
        status == 200 || status == 204,
        "{method} {path}: HTTP {status}: {text}"
    );
    text
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Poll `probe` until it is true or `limit` passes.
async fn ready(limit: Duration, what: &str, mut probe: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < end {
        if probe().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} not ready within {limit:?}");
}

/// `N` distinct ports other than `besides`, each free for TCP and for UDP when chosen (all
/// held until the last is found).
fn free_ports<const N: usize>(besides: u16) -> [u16; N] {
    let mut held = Vec::new();
    while held.len() < N {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = tcp.local_addr().expect("local address").port();
        if port == besides {
            continue;
        }
        if let Ok(udp) = std::net::UdpSocket::bind(("127.0.0.1", port)) {
            held.push((port, tcp, udp));
        }
    }
    std::array::from_fn(|i| held[i].0)
}

/// A Consul dev agent.
pub struct Consul {
    child: Option<Child>,
    pub http: SocketAddr,
    /// With ACLs on (default deny), the management token this harness uses.
    token: Option<String>,
}

impl Drop for Consul {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            kill(c);
        }
    }
}

impl Consul {
    pub async fn start() -> Consul {
        Consul::start_acl(None).await
    }

    /// With `Some(token)`: ACLs enabled, everything denied without a token, `token` the
    /// management token (which the harness then sends).
    pub async fn start_acl(token: Option<&str>) -> Consul {
        let mut c = Consul {
            child: None,
            http: super::support::free_addr(),
            token: token.map(str::to_string),
        };
        c.spawn_until_leader(true).await;
        c
    }

    /// Kill the agent (its catalog is lost: a dev agent keeps it in memory).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
    }

    /// Start the agent again on the same HTTP port, empty, and wait for its leader.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn_until_leader(false).await;
    }

    /// Spawn the agent and wait for its leader. A port chosen free can be taken by another
    /// process before the agent binds it (the agent then exits at once): such a start is
    /// tried again on fresh ports — the HTTP port included when `new_http` — up to three
    /// times. A failure panics with the agent's log.
    async fn spawn_until_leader(&mut self, new_http: bool) {
        let mut failures = Vec::new();
        for attempt in 0..3 {
            if attempt > 0 && new_http {
                self.http = super::support::free_addr();
            }
            let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("consul-{}.log", self.http.port()));
            self.child = Some(self.spawn(&log));
            let outcome = self.wait_leader().await;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            match outcome {
                Ok(()) => return,
                Err(exited @ Some(_)) => {
                    // Shown with the test's output if it fails later on.
                    eprintln!("consul exited at start ({exited:?}); trying again");
                    failures.push(format!("exited ({exited:?}); its log:\n{text}"));
                    self.child = None;
                }
                Err(None) => panic!("consul no leader within 60s; its log:\n{text}"),
            }
        }
        panic!("consul did not start: {failures:#?}");
    }

    fn spawn(&self, log: &Path) -> Child {
        let bin = tool(
            "KEYMASTER_CONSUL",
            "tools/consul",
            "keymaster-consul",
            &[
                go(),
                "build",
                "-o",
                "keymaster-consul",
                "github.com/hashicorp/consul",
            ],
        );
        // Serf uses each of its ports for TCP and UDP.
        let [serf_lan, serf_wan, server, grpc] = free_ports(self.http.port());
        let out = std::fs::File::create(log).expect("consul log file");
        Command::new(bin)
            .args([
                "agent",
                "-dev",
                "-bind=127.0.0.1",
                "-client=127.0.0.1",
                "-log-level=warn",
            ])
            .arg(format!("-http-port={}", self.http.port()))
            .arg(format!("-serf-lan-port={serf_lan}"))
            .arg(format!("-serf-wan-port={serf_wan}"))
            .arg(format!("-server-port={server}"))
            .arg(format!("-grpc-port={grpc}"))
            .args(["-dns-port=-1", "-grpc-tls-port=-1"])
            .args(self.token.as_ref().map(|t| {
                format!(
                    r#"-hcl=acl {{ enabled = true
                         default_policy = "deny"
                         tokens {{ initial_management = "{t}" }} }}"#
                )
            }))
            // Its start-up errors go to stdout.
            .stdout(out.try_clone().expect("consul log file"))
            .stderr(out)
            .spawn()
            .expect("consul starts")
    }

    /// `Ok` once the agent names its leader; `Err(Some(status))` if it exited first,
    /// `Err(None)` if neither happened within 60 s.
    async fn wait_leader(&mut self) -> Result<(), Option<std::process::ExitStatus>> {
        let end = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < end {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok()?) {
                return Err(Some(status));
            }
            if matches!(call(self.http, "GET", "/v1/status/leader", "").await,
                        Some((200, leader)) if leader.len() > 4)
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(None)
    }

    /// Register instance `id` of `service` at `addr` with a TTL check `check:<id>` that
    /// passes from the start.
    pub async fn register(&self, service: &str, id: &str, addr: SocketAddr, weight: u32) {
        let body = format!(
            r#"{{"ID": "{id}", "Name": "{service}", "Address": "{}", "Port": {},
                "Weights": {{"Passing": {weight}, "Warning": 1}},
                "Check": {{"CheckID": "check:{id}", "TTL": "10m", "Status": "passing"}}}}"#,
            addr.ip(),
            addr.port()
        );
        self.put("/v1/agent/service/register", &body).await;
    }

    pub async fn pass(&self, id: &str) {
        self.put(&format!("/v1/agent/check/pass/check:{id}"), "")
            .await;
    }

    pub async fn fail(&self, id: &str) {
        self.put(&format!("/v1/agent/check/fail/check:{id}"), "")
            .await;
    }

    pub async fn deregister(&self, id: &str) {
        self.put(&format!("/v1/agent/service/deregister/{id}"), "")
            .await;
    }

    async fn put(&self, path: &str, body: &str) {
        ok_with(self.http, "PUT", path, body, self.token.as_deref()).await;
    }
}

/// A Eureka server.
pub struct Eureka {
    child: Option<Child>,
    pub http: SocketAddr,
}

impl Drop for Eureka {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            kill(c);
        }
    }
}

impl Eureka {
    pub async fn start() -> Eureka {
        let jar = tool(
            "KEYMASTER_EUREKA_JAR",
            "tools/eureka",
            "keymaster-eureka.jar",
            &["bash", "build.sh"],
        );
        let http = super::support::free_addr();
        let child = Command::new("java")
            .args(["-Xmx256m", "-XX:TieredStopAtLevel=1", "-Xss512k", "-jar"])
            .arg(Path::new(&jar))
            .arg(format!("--server.port={}", http.port()))
            .stdout(Stdio::null())
            .spawn()
            .expect("java runs the eureka jar");
        ready(Duration::from_secs(120), "eureka", async || {
            matches!(call(http, "GET", "/eureka/apps", "").await, Some((200, _)))
        })
        .await;
        Eureka {
            child: Some(child),
            http,
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
    }

    /// Register instance `id` of `app` at `addr`, status `UP`.
    pub async fn register(&self, app: &str, id: &str, addr: SocketAddr) {
        let app = app.to_ascii_uppercase();
        let body = format!(
            r#"{{"instance": {{"instanceId": "{id}", "hostName": "localhost", "app": "{app}",
                "ipAddr": "{}", "status": "UP", "port": {{"$": {}, "@enabled": "true"}},
                "securePort": {{"$": 443, "@enabled": "false"}},
                "leaseInfo": {{"renewalIntervalInSecs": 30, "durationInSecs": 600}},
                "dataCenterInfo": {{"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"}}}}}}"#,
            addr.ip(),
            addr.port()
        );
        ok(self.http, "POST", &format!("/eureka/apps/{app}"), &body).await;
    }

    /// Set instance `id`'s status (`OUT_OF_SERVICE`, `UP`, ...).
    pub async fn status(&self, app: &str, id: &str, value: &str) {
        let app = app.to_ascii_uppercase();
        let path = format!("/eureka/apps/{app}/{id}/status?value={value}");
        ok(self.http, "PUT", &path, "").await;
    }

    pub async fn deregister(&self, app: &str, id: &str) {
        let app = app.to_ascii_uppercase();
        ok(self.http, "DELETE", &format!("/eureka/apps/{app}/{id}"), "").await;
    }
}
