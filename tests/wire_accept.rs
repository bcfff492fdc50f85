//! How a listener's connections reach the workers: by default each worker has its own
//! `SO_REUSEPORT` socket and the kernel hashes each new connection to one of them; with
//! `reuse_port = false` the listener is one socket that every worker accepts from.
mod support;

use std::net::SocketAddr;
use support::*;

/// Bind a `SO_REUSEPORT` socket to `addr`: it joins the address's group only when the
/// sockets already bound there have the option too.
fn join_reuseport_group(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// The sockets listening on `port` (their inodes; in /proc/net/tcp, state `0A` is LISTEN).
fn listening_sockets(port: u16) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            (local_port == port && *f.get(3)? == "0A").then(|| f.get(9).map(|i| i.to_string()))?
        })
        .collect()
}

/// How many of this process's descriptors are the socket with this inode.
fn descriptors_of(inode: &str) -> usize {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_str() == Some(want.as_str()))
        .count()
}

/// `CONNS` clients at once, `EACH` requests each, on a 4-worker gateway: every one is
/// answered, and the listener counts each connection once.
async fn serve_many(g: &TestGateway) {
    const CONNS: usize = 32;
    const EACH: usize = 20;
    many_clients(g.addr, CONNS, EACH, "/").await;
    let m = g.gateway().metrics_text();
    let accepted = "keymaster_downstream_accepted_total{listener=\"main\"}";
    assert_eq!(metric(&m, accepted), CONNS as f64, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_each_worker_has_a_reuseport_socket() {
    let s = stub();
    let toml = config_text(s.local_addr(), "", "").replace("workers = 1", "workers = 4");
    let g = start_gateway(&toml);
    // The port's sockets have SO_REUSEPORT: another one may join them (and leaves at once,
    // before it could take a connection).
    drop(join_reuseport_group(g.addr).expect("the listener's sockets use SO_REUSEPORT"));
    // A socket of its own for each worker.
    let sockets = listening_sockets(g.addr.port());
    assert_eq!(sockets.len(), 4, "{sockets:?}");
    assert!(sockets.iter().all(|s| descriptors_of(s) == 1));
    serve_many(&g).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reuse_port_every_worker_accepts_from_one_socket() {
    let s = stub();
    let toml =
        config_text(s.local_addr(), "reuse_port = false", "").replace("workers = 1", "workers = 4");
    let g = start_gateway(&toml);
    let err = join_reuseport_group(g.addr).expect_err("one socket without SO_REUSEPORT");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    // One socket, and a descriptor of it in each of the four workers.
    let sockets = listening_sockets(g.addr.port());
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    assert_eq!(descriptors_of(&sockets[0]), 4);
    serve_many(&g).await;
}
