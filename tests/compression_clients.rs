//! Response compression decoded by real clients: curl (`--compressed`, HTTP/1.1 and HTTP/2
//! with prior knowledge) and Python's standard library (`http.client` with `gzip`, and the
//! `brotli` and `zstandard` modules where installed). Each body is several MB, streamed by
//! the origin in chunks, and compared whole after decoding. A client that is not installed
//! is reported and skipped.
mod compression_support;
mod support;

use compression_support::*;
use std::process::Command;

const N: usize = 8 * 1024 * 1024;

fn installed(program: &str, version_arg: &str) -> bool {
    let ok = Command::new(program)
        .arg(version_arg)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: {program} is not installed");
    }
    ok
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

/// curl with `--compressed` and, when given, its own `Accept-Encoding`; returns the
/// response head and the decoded body.
fn curl(url: &str, accept: Option<&str>, h2: bool) -> (String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let (head, out) = (dir.path().join("head"), dir.path().join("body"));
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--compressed", "--max-time", "30", "-D"])
        .arg(&head)
        .arg("-o")
        .arg(&out);
    if let Some(a) = accept {
        cmd.args(["-H", &format!("Accept-Encoding: {a}")]);
    }
    if h2 {
        cmd.arg("--http2-prior-knowledge");
    }
    let status = cmd.arg(url).status().expect("curl runs");
    assert!(status.success(), "curl {url}: {status}");
    let head = std::fs::read_to_string(head).unwrap();
    (head, std::fs::read(out).unwrap())
}

fn content_encoding(head: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case("content-encoding")
            .then(|| v.trim().to_string())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_decodes_every_algorithm_over_http1_and_http2() {
    if !installed("curl", "--version") {
        return;
    }
    let o = origin().await;
    let g = gateway(&o);
    let want = sha256(body(N));
    let url = g.url(&format!("/z/chunked/{N}"));
    let jobs: Vec<(Option<&str>, bool, &str)> = vec![
        (Some("gzip"), false, "gzip"),
        (Some("br"), false, "br"),
        (Some("zstd"), false, "zstd"),
        (Some("gzip"), true, "gzip"),
        (Some("br"), true, "br"),
        (Some("zstd"), true, "zstd"),
        // curl's own Accept-Encoding ("deflate, gzip, br, zstd"): the route's first choice.
        (None, false, "zstd"),
    ];
    for (accept, h2, expect) in jobs {
        let url = url.clone();
        let (head, got) = tokio::task::spawn_blocking(move || curl(&url, accept, h2))
            .await
            .unwrap();
        let proto = if h2 { "HTTP/2" } else { "HTTP/1.1" };
        assert!(
            head.starts_with(if h2 { "HTTP/2 200" } else { "HTTP/1.1 200" }),
            "{head}"
        );
        assert_eq!(
            content_encoding(&head).as_deref(),
            Some(expect),
            "{proto} {accept:?}"
        );
        assert_eq!(got.len(), N, "{proto} {accept:?}");
        assert_eq!(sha256(&got), want, "{proto} {accept:?}");
    }
    // A route without compression: curl gets the origin's bytes as they are.
    let url = g.url(&format!("/text/{N}"));
    let (head, got) = tokio::task::spawn_blocking(move || curl(&url, None, false))
        .await
        .unwrap();
    assert_eq!(content_encoding(&head), None);
    assert_eq!(sha256(&got), want);
}

/// Fetches with `http.client`, decodes by `Content-Encoding`, prints
/// `<content-encoding or -> <length> <sha256>`, or `skip <module>` when the decoder module
/// is not installed.
const PYTHON_CLIENT: &str = r#"
import hashlib, http.client, sys
host, port, path, accept = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
conn = http.client.HTTPConnection(host, port, timeout=30)
conn.request("GET", path, headers={"Accept-Encoding": accept})
resp = conn.getresponse()
data = resp.read()
enc = resp.getheader("Content-Encoding") or "-"
if enc == "gzip":
    import gzip
    data = gzip.decompress(data)
elif enc == "br":
    try:
        import brotli
    except ImportError:
        print("skip brotli"); sys.exit(0)
    data = brotli.decompress(data)
elif enc == "zstd":
    try:
        import zstandard
    except ImportError:
        print("skip zstandard"); sys.exit(0)
    data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
print(resp.status, enc, len(data), hashlib.sha256(data).hexdigest())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_decodes_every_algorithm() {
    if !installed("python3", "--version") {
        return;
    }
    let o = origin().await;
    let g = gateway(&o);
    let want = sha256(body(N));
    let cases = [
        ("gzip", "gzip"),
        ("br", "br"),
        ("zstd", "zstd"),
        ("br;q=0.5, gzip;q=0.8", "gzip"),
        ("gzip;q=0, identity", "-"),
    ];
    for (kind, n) in [("chunked", N), ("text", N), ("text", 5000)] {
        let want = if n == N {
            want.clone()
        } else {
            sha256(body(n))
        };
        for (accept, expect) in cases {
            let args = [
                "-c".to_string(),
                PYTHON_CLIENT.to_string(),
                "127.0.0.1".to_string(),
                g.addr.port().to_string(),
                format!("/z/{kind}/{n}"),
                accept.to_string(),
            ];
            let out =
                tokio::task::spawn_blocking(move || Command::new("python3").args(args).output())
                    .await
                    .unwrap()
                    .expect("python3 runs");
            let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert!(
                out.status.success(),
                "{text} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            if let Some(module) = text.strip_prefix("skip ") {
                eprintln!("skipped: Python module {module} is not installed ({accept})");
                continue;
            }
            assert_eq!(text, format!("200 {expect} {n} {want}"), "{kind} {accept}");
        }
    }
}
