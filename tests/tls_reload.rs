//! TLS certificates reloaded without restart: rotation by reload (new handshakes get the new
//! certificate, existing connections keep going), bad files rejected with the old kept, and
//! paths relative to the config file.
mod support;
mod tls_support;

use support::*;
use tls_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificate_is_served_after_reload_and_old_connections_keep_working() {
    let pki = Pki::new();
    let old = pki.issue("site", &["a.example"], "old", false);
    let s = stub();
    let text = config_text(s.local_addr(), &tls_keys(&[&old], ""), "");
    let g = start_gateway(&text);
    let cfg = client_config(&pki, &ClientOpts::default());

    let conn = connect(g.addr, "a.example", cfg.clone()).await.unwrap();
    assert!(peer_leaf(&conn) == old.der);
    let mut kept = H1::handshake(conn).await.unwrap();
    assert_eq!(kept.get("/?length=1", &[]).await.unwrap().status, 200);

    // Rotate the files in place, then reload the same config.
    let new = pki.issue("site", &["a.example"], "new", false);
    assert!(new.der != old.der);
    let before = g.gateway().version();
    g.gateway().reload_from_source().expect("reload accepted");
    assert_eq!(g.gateway().version(), before + 1);

    let fresh = connect(g.addr, "a.example", cfg.clone()).await.unwrap();
    assert!(
        peer_leaf(&fresh) == new.der,
        "a new handshake gets the new certificate"
    );
    let r = H1::handshake(fresh)
        .await
        .unwrap()
        .get("/?length=7", &[])
        .await
        .unwrap();
    assert_eq!((r.status, r.body.len()), (200, 7));
    // The connection made before the reload is untouched.
    let r = kept.get("/?length=11", &[]).await.unwrap();
    assert_eq!((r.status, r.body.len()), (200, 11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_certificate_files_reject_the_reload_and_the_old_certificate_keeps_serving() {
    let pki = Pki::new();
    let good = pki.issue("site", &["a.example"], "good", false);
    let s = stub();
    let g = start_gateway(&config_text(s.local_addr(), &tls_keys(&[&good], ""), ""));
    let cfg = client_config(&pki, &ClientOpts::default());
    let version = g.gateway().version();

    let missing = Issued {
        cert_path: pki.path("nope.pem"),
        key_path: good.key_path.clone(),
        der: good.der.clone(),
        key_der: good.key_der.clone_key(),
    };
    let garbage_path = pki.path("garbage.pem");
    std::fs::write(&garbage_path, "not a certificate\n").unwrap();
    let garbage = Issued {
        cert_path: garbage_path,
        ..missing.clone_paths()
    };
    let other = pki.issue("other", &["a.example"], "other", false);
    let mismatched = Issued {
        key_path: other.key_path.clone(),
        ..good.clone_paths()
    };
    for (bad, says) in [
        (
            &missing,
            "listeners[0].tls.certificates[0].cert: cannot read",
        ),
        (&garbage, "listeners[0].tls.certificates[0].cert"),
        (&mismatched, "does not match"),
    ] {
        let text = config_text(s.local_addr(), &tls_keys(&[bad], ""), "");
        let config = keymaster_config::load_str(&text, "<test>").unwrap();
        let err = g
            .gateway()
            .reload(config)
            .expect_err("bad TLS files are rejected");
        assert!(err.contains(says), "{err:?} lacks {says:?}");
        assert_eq!(g.gateway().version(), version);
        let conn = connect(g.addr, "a.example", cfg.clone()).await.unwrap();
        assert!(
            peer_leaf(&conn) == good.der,
            "the old certificate keeps serving"
        );
        let r = H1::handshake(conn)
            .await
            .unwrap()
            .get("/?length=2", &[])
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        metric(
            &g.gateway().metrics_text(),
            "keymaster_config_reloads_total{result=\"rejected\"}"
        ),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_paths_follow_the_config_file_and_admin_reload_rereads_them() {
    let pki = Pki::new();
    let old = pki.issue("site", &["a.example"], "old", false);
    let s = stub();
    let text = config_text(
        s.local_addr(),
        "tls = { certificates = [{ cert = \"site.pem\", key = \"site.key\" }] }",
        "",
    );
    let path = pki.path("gateway.toml");
    std::fs::write(&path, &text).unwrap();
    let config = keymaster_config::load_file(&path).expect("valid config");
    let gw = Gateway::start(config, ConfigSource::File(path.clone())).expect("starts");
    let g = TestGateway {
        addr: gw.listener_addr("main").unwrap(),
        admin: gw.admin_addr().unwrap(),
        gw: Some(gw),
    };
    let cfg = client_config(&pki, &ClientOpts::default());
    let conn = connect(g.addr, "a.example", cfg.clone()).await.unwrap();
    assert!(peer_leaf(&conn) == old.der);

    // Rotate, then POST /reload on the admin listener (what SIGHUP does too).
    let new = pki.issue("site", &["a.example"], "new", false);
    let r = admin_post(&g, "/reload").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let conn = connect(g.addr, "a.example", cfg.clone()).await.unwrap();
    assert!(peer_leaf(&conn) == new.der);

    // A key file that vanished: 422 naming the key, and the current certificate stays.
    std::fs::remove_file(pki.path("site.key")).unwrap();
    let r = admin_post(&g, "/reload").await;
    assert_eq!(r.status, 422, "{:?}", r.body);
    let body = String::from_utf8_lossy(&r.body);
    assert!(
        body.contains("listeners[0].tls.certificates[0].key: cannot read"),
        "{body}"
    );
    let conn = connect(g.addr, "a.example", cfg.clone()).await.unwrap();
    assert!(peer_leaf(&conn) == new.der);
    let r = H1::handshake(conn)
        .await
        .unwrap()
        .get("/?length=3", &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    tokio::task::spawn_blocking(move || drop(g)).await.unwrap();
}

trait ClonePaths {
    fn clone_paths(&self) -> Issued;
}

impl ClonePaths for Issued {
    fn clone_paths(&self) -> Issued {
        Issued {
            cert_path: self.cert_path.clone(),
            key_path: self.key_path.clone(),
            der: self.der.clone(),
            key_der: self.key_der.clone_key(),
        }
    }
}
