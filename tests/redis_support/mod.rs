//! Test harness for cluster-wide rate limits: a real `redis-server` (Debian's package; CI
//! installs it, and on a machine without it the harness installs it once, as `.ci/run` does)
//! on a unix socket in a temporary directory, and real `keymaster` processes started from
//! config files. Both are killed by PID when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of this test, listening only on a unix socket.
pub struct RedisServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Start one and wait (bounded) until it answers PING.
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = RedisServer { child: None, dir };
        r.spawn();
        r
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// The `[redis] url` of this server.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    fn spawn(&mut self) {
        ensure_redis_server();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(self.socket())
            .args([
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--loglevel", "warning", "--dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (Debian package redis-server; .ci/run installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ping(&self.socket()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not answer PING within 10s");
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().expect("redis-server running").id() as i32
    }

    /// SIGSTOP: the socket stays open but nothing is answered (a "slow" Redis).
    pub fn pause(&self) {
        assert!(signal(self.pid(), libc::SIGSTOP), "SIGSTOP redis-server");
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        assert!(signal(self.pid(), libc::SIGCONT), "SIGCONT redis-server");
    }

    /// Kill it (SIGKILL) and reap it: connections reset, the socket refuses.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Start a fresh (empty) server on the same socket.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused server is resumed first so that it is not left stopped if kill fails.
            let _ = signal(c.id() as i32, libc::SIGCONT);
        }
        self.stop();
    }
}

/// Send `sig` to our own child `pid` (std has no signal sender).
/// Make `redis-server` available: a fresh machine (the README's `cargo test --workspace`) may
/// not have Debian's package yet; install it once per test binary with apt (root), like
/// `.ci/run`. Without root or apt the spawn below fails with its own message.
fn ensure_redis_server() {
    static READY: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    READY.get_or_init(|| {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("redis-server").is_file()));
        if found {
            return;
        }
        eprintln!("redis-server not found: installing Debian's redis-server package");
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !apt(&["install", "-y", "-qq", "redis-server"]) {
            apt(&["update", "-qq"]);
            apt(&["install", "-y", "-qq", "redis-server"]);
        }
        // The package's own service is not needed: each test runs its own server.
        let _ = Command::new("service")
            .args(["redis-server", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    });
}

fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) takes two integers and touches no memory of this process; `pid` is a
    // child we spawned and have not reaped (reaping happens only in `stop`, which also
    // forgets the child), so the PID cannot name an unrelated process.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// One raw RESP PING on the socket.
fn ping(socket: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A `keymaster run --config FILE` process; its listener and admin addresses are read from
/// the banner it prints on standard output.
pub struct GatewayProcess {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    _dir: tempfile::TempDir,
}

impl GatewayProcess {
    /// Write `toml` to a file and run the real binary on it (listeners on 127.0.0.1:0).
    pub fn start(toml: &str) -> GatewayProcess {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keymaster.toml");
        std::fs::write(&path, toml).expect("write config");
        let mut child = Command::new(env!("CARGO_BIN_EXE_keymaster"))
            .arg("run")
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::piped())
            .spawn()
            .expect("keymaster binary runs");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Forward banner lines until the process exits (keeps the pipe drained).
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut addr, mut admin) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while addr.is_none() || admin.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                panic!("keymaster did not print its addresses within 20s");
            };
            let url = |l: &str| -> Option<SocketAddr> {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("http://"))
                    .and_then(|a| a.parse().ok())
            };
            let t = line.trim_start();
            if t.starts_with("listener main") {
                addr = url(t);
            } else if t.starts_with("admin") {
                admin = url(t);
            }
        }
        GatewayProcess {
            child,
            addr: addr.expect("listener address"),
            admin: admin.expect("admin address"),
            _dir: dir,
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
