//! The example's filters in a real gateway: registered as native types, named in the
//! config with their parameters (one read from the environment), in front of a real origin,
//! with a raw HTTP/1.1 client.

use keymaster::{ConfigSource, Keymaster};
use keymaster_example_native_filter::{ApiAuth, Stamp};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

/// An origin answering each request `200 origin` (keep-alive), on its own thread.
fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().expect("clone"));
                let mut s = s;
                loop {
                    let mut line = String::new();
                    // The head, up to its empty line (these requests have no body).
                    loop {
                        line.clear();
                        match r.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    let body = "origin";
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if s.write_all(resp.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn config(origin: SocketAddr, auth_params: &str) -> keymaster_config::Config {
    try_config(origin, auth_params).expect("config")
}

fn try_config(origin: SocketAddr, auth_params: &str) -> Result<keymaster_config::Config, String> {
    let text = format!(
        r#"
[admin]
listen = "127.0.0.1:0"

[[listeners]]
name = "main"
address = "127.0.0.1:0"

[[clusters]]
name = "origin"
servers = [{{ address = "{origin}" }}]

[[routes]]
name = "all"
cluster = "origin"

[[filters]]
name = "auth"
type = "native"
native = "api_auth"
stage = "pre"
params = {auth_params}

[[filters]]
name = "stamp"
type = "native"
native = "stamp"
stage = "post"
params = {{ value = "example" }}
"#
    );
    keymaster_config::load_str(&text, "<test>").map_err(|e| e.to_string())
}

fn keymaster() -> Keymaster {
    Keymaster::new()
        .native_type("api_auth", ApiAuth::from_params)
        .native_type("stamp", Stamp::from_params)
}

/// One request on a new connection: the status line and the head, lower-cased.
fn get(addr: SocketAddr, key: Option<&str>) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    let key = key
        .map(|k| format!("x-api-key: {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET /orders HTTP/1.1\r\nHost: x\r\n{key}Connection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out.to_ascii_lowercase()
}

#[test]
fn native_filters_named_in_the_config_run_in_a_gateway() {
    // SAFETY of set_var: this test binary's only test that reads the variable, set before
    // the gateway (which reads it while building the config version) starts.
    std::env::set_var("EXAMPLE_KEY_ALICE", "k-alice");
    let params = r#"{ callers = { alice = { env = "EXAMPLE_KEY_ALICE" }, bob = "k-bob" } }"#;
    let (gw, _lua) = keymaster()
        .start(config(origin(), params), ConfigSource::Memory)
        .expect("start");
    let addr = gw.listener_addr("main").expect("listener");

    let ok = get(addr, Some("k-alice"));
    assert!(ok.starts_with("http/1.1 200"), "{ok}");
    assert!(ok.contains("x-stamp: example"), "{ok}");
    assert!(ok.contains("x-caller: alice"), "{ok}");
    assert!(ok.ends_with("origin"), "{ok}");
    assert!(get(addr, Some("k-bob")).contains("x-caller: bob"));

    for key in [None, Some("k-mallory")] {
        let no = get(addr, key);
        assert!(no.starts_with("http/1.1 401"), "{no}");
        assert!(no.contains("www-authenticate: apikey"), "{no}");
        // Post filters run on a response a pre filter answered with.
        assert!(no.contains("x-stamp: example"), "{no}");
        assert!(!no.contains("x-caller"), "{no}");
    }
    gw.shutdown();
}

#[test]
fn bad_parameters_and_unknown_types_refuse_the_config() {
    let origin: SocketAddr = ([127, 0, 0, 1], 9).into();
    let cases = [
        (r#"{ callers = {} }"#, "at least one caller"),
        (r#"{ callers = { a = "b" }, heder = "x" }"#, "heder"),
    ];
    for (params, expect) in cases {
        let e = match keymaster().start(config(origin, params), ConfigSource::Memory) {
            Ok(_) => panic!("{params}: started"),
            Err(e) => e,
        };
        assert!(e.contains("auth") && e.contains(expect), "{params}: {e}");
    }
    // An environment variable that is not set: the config is refused where it is named.
    let e = try_config(
        origin,
        r#"{ callers = { a = { env = "EXAMPLE_SURELY_UNSET_VAR" } } }"#,
    )
    .expect_err("refused");
    assert!(
        e.contains("filters[0].params.callers") && e.contains("EXAMPLE_SURELY_UNSET_VAR"),
        "{e}"
    );
    // A binary without the type: the config names one it does not have.
    let e = match Keymaster::new().start(
        config(origin, r#"{ callers = { a = "b" } }"#),
        ConfigSource::Memory,
    ) {
        Ok(_) => panic!("started without the native types"),
        Err(e) => e,
    };
    assert!(e.contains("no native filter type \"api_auth\""), "{e}");
}
