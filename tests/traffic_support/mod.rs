//! Named origins, for the tests that tell servers apart by their answers (weighted
//! clusters, consistent hashing, discovery from registries): each answers every request 200
//! with its name as the body, counts what it served, and can be killed (listener and
//! connections closed: its port refuses) and restarted on the same port.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// A named in-process HTTP/1.1 origin.
pub struct Named {
    pub addr: SocketAddr,
    pub name: String,
    hits: Arc<AtomicUsize>,
    task: Option<JoinHandle<()>>,
}

impl Named {
    pub async fn start(name: &str) -> Named {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut o = Named {
            addr: listener.local_addr().unwrap(),
            name: name.to_string(),
            hits: Arc::default(),
            task: None,
        };
        o.serve(listener);
        o
    }

    /// `n` origins named `<prefix>0`, `<prefix>1`, ...
    pub async fn many(prefix: &str, n: usize) -> Vec<Named> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(Named::start(&format!("{prefix}{i}")).await);
        }
        out
    }

    fn serve(&mut self, listener: TcpListener) {
        let (name, hits) = (Bytes::from(self.name.clone()), self.hits.clone());
        self.task = Some(tokio::spawn(async move {
            // Dropping the set (when this task is aborted) closes every connection.
            let mut conns = JoinSet::new();
            while let Ok((s, _)) = listener.accept().await {
                let (name, hits) = (name.clone(), hits.clone());
                conns.spawn(async move {
                    let svc = service_fn(move |_req: http::Request<hyper::body::Incoming>| {
                        hits.fetch_add(1, Ordering::SeqCst);
                        let body = Full::new(name.clone());
                        async move { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        }));
    }

    /// Close the listener and every open connection: the port refuses connections.
    pub async fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    /// Listen again on the same port.
    pub async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("rebind same port");
        self.serve(listener);
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// `servers = [...]` of a cluster over `origins`.
pub fn servers(origins: &[&Named]) -> String {
    let list: Vec<String> = origins
        .iter()
        .map(|o| format!("{{ address = \"{}\" }}", o.addr))
        .collect();
    format!("servers = [{}]", list.join(", "))
}

/// Whether `got` of `n` draws lies within `sigmas` standard deviations of the binomial
/// expectation `n * p`.
pub fn within_sigmas(got: usize, n: usize, p: f64, sigmas: f64) -> bool {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (got as f64 - mean).abs() <= sigmas * sd
}
