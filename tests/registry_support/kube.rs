//! A real Kubernetes API server (`tools/kube`: kube-apiserver v1.34 over etcd v3.6, both
//! built from their Go modules) on free 127.0.0.1 ports: HTTPS with a certificate for
//! `localhost` from the test's CA, a static bearer token of a `system:masters` user, RBAC.
//! No controllers run: tests write EndpointSlices as the EndpointSlice controller would.
//! Requests from the harness go through `curl`. The test using it declares `mod tls_support;`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The bearer token the harness and the tests use.
pub const TOKEN: &str = "keymaster-test-token";

pub struct Kube {
    etcd: Child,
    apiserver: Option<Child>,
    pub url: String,
    /// The CA of the API server's certificate.
    pub ca: PathBuf,
    pki: crate::tls_support::Pki,
}

impl Drop for Kube {
    fn drop(&mut self) {
        self.kill_apiserver();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

impl Kube {
    pub async fn start() -> Kube {
        let etcd_bin = super::tool(
            "KEYMASTER_ETCD",
            "tools/kube/etcd",
            "keymaster-etcd",
            &[
                super::go(),
                "build",
                "-o",
                "keymaster-etcd",
                "go.etcd.io/etcd/server/v3",
            ],
        );
        let api_bin = super::tool(
            "KEYMASTER_KUBE_APISERVER",
            "tools/kube/apiserver",
            "keymaster-kube-apiserver",
            &[
                super::go(),
                "build",
                "-o",
                "keymaster-kube-apiserver",
                "k8s.io/kubernetes/cmd/kube-apiserver",
            ],
        );
        let pki = crate::tls_support::Pki::new();
        let dir = pki.dir.path().to_path_buf();
        let (client, peer) = (free(), free());
        let etcd = Command::new(etcd_bin)
            .arg("--data-dir")
            .arg(dir.join("etcd"))
            .args(["--name", "default", "--log-level", "error"])
            .arg(format!("--listen-client-urls=http://{client}"))
            .arg(format!("--advertise-client-urls=http://{client}"))
            .arg(format!("--listen-peer-urls=http://{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
            .arg(format!("--initial-cluster=default=http://{peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        super::ready(Duration::from_secs(30), "etcd", async || {
            matches!(
                super::call(client, "GET", "/health", "").await,
                Some((200, _))
            )
        })
        .await;

        let serving = pki.issue("apiserver", &["localhost"], "localhost", false);
        let sa = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.join("sa.key"), sa.serialize_pem()).unwrap();
        std::fs::write(dir.join("sa.pub"), sa.public_key_pem()).unwrap();
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{TOKEN},admin,admin-uid,\"system:masters\"\n"),
        )
        .unwrap();
        let port = free().port();
        let apiserver = Command::new(api_bin)
            .arg(format!("--etcd-servers=http://{client}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={port}"))
            .arg(format!("--tls-cert-file={}", serving.cert_path.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                serving.key_path.display()
            ))
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-key-file={}",
                dir.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                dir.join("sa.key").display()
            ))
            .arg(format!(
                "--token-auth-file={}",
                dir.join("tokens.csv").display()
            ))
            .args([
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                "--endpoint-reconciler-type=none",
                "-v=0",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("apiserver.log")).unwrap())
            .spawn()
            .expect("kube-apiserver starts");
        let mut kube = Kube {
            etcd,
            apiserver: Some(apiserver),
            url: format!("https://localhost:{port}"),
            ca: pki.ca_path(),
            pki,
        };
        let end = tokio::time::Instant::now() + Duration::from_secs(60);
        while kube.curl("GET", "/readyz", None).0 != 200 {
            let exited = kube
                .apiserver
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || tokio::time::Instant::now() > end {
                let log = std::fs::read_to_string(kube.dir().join("apiserver.log"));
                let log = log.unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "kube-apiserver not ready ({exited:?}); its log ends:\n{}",
                    tail.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        kube
    }

    pub fn kill_apiserver(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// One request with the admin token: status and body.
    fn curl(&self, method: &str, path: &str, body: Option<(&str, &str)>) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"])
            .arg("--cacert")
            .arg(&self.ca)
            .args(["-X", method, "-H"])
            .arg(format!("Authorization: Bearer {TOKEN}"));
        if let Some((content_type, body)) = body {
            cmd.args([
                "-H",
                &format!("Content-Type: {content_type}"),
                "--data",
                body,
            ]);
        }
        let out = cmd
            .arg(format!("{}{path}", self.url))
            .output()
            .expect("curl runs (apt install curl)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn must(&self, method: &str, path: &str, body: Option<(&str, &str)>) {
        let (status, text) = self.curl(method, path, body);
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {text}"
        );
    }

    /// Create EndpointSlice `name` of Service `service`: one FQDN endpoint `host` at `port`.
    /// (The API server refuses loopback addresses; tests resolve `host` to 127.0.0.1.)
    pub fn create_slice(&self, service: &str, name: &str, host: &str, port: u16) {
        let body = format!(
            r#"{{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {{"name": "{name}", "labels": {{"kubernetes.io/service-name": "{service}"}}}},
                "addressType": "FQDN",
                "endpoints": [{{"addresses": ["{host}"], "conditions": {{"ready": true}}}}],
                "ports": [{{"name": "http", "port": {port}, "protocol": "TCP"}}]}}"#
        );
        self.must("POST", SLICES, Some(("application/json", &body)));
    }

    /// Mark slice `name`'s endpoint ready or not.
    pub fn set_ready(&self, name: &str, host: &str, ready: bool) {
        let body = format!(
            r#"{{"endpoints": [{{"addresses": ["{host}"], "conditions": {{"ready": {ready}}}}}]}}"#
        );
        let path = format!("{SLICES}/{name}");
        self.must(
            "PATCH",
            &path,
            Some(("application/merge-patch+json", &body)),
        );
    }

    pub fn delete_slice(&self, name: &str) {
        self.must("DELETE", &format!("{SLICES}/{name}"), None);
    }

    /// The harness's work directory: certificates, keys, etcd's data, the server's log.
    fn dir(&self) -> &std::path::Path {
        self.pki.dir.path()
    }
}

const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";

fn free() -> SocketAddr {
    crate::support::free_addr()
}
