//! What a reload cannot change. Listeners (but their TLS files), the worker count, the
//! admin listener, the access log and the trace exporter (`[traces]`) are set up once at
//! start; a reload that changes them still applies everything else, and the version it
//! builds keeps the running values of these, so `/config` shows what runs. The keys that
//! differ are reported (the reload's answer, `/config`'s `restart_required`, the log)
//! until a restart or a reload without them.

use keymaster_config::{Config, ListenerConfig};
use serde::Serialize;
use serde_json::Value;

/// Put `next`'s restart-only settings back to `running`'s and return the keys that differed,
/// like `listeners[0].address` or `server.workers`.
pub(crate) fn keep_running(running: &Config, next: &mut Config) -> Vec<String> {
    let mut changed = Vec::new();
    diff(
        "server.workers",
        &running.server.workers,
        &next.server.workers,
        &mut changed,
    );
    next.server.workers = running.server.workers;
    diff("admin", &running.admin, &next.admin, &mut changed);
    next.admin = running.admin.clone();
    diff(
        "access_log",
        &running.access_log,
        &next.access_log,
        &mut changed,
    );
    next.access_log = running.access_log.clone();
    diff("traces", &running.traces, &next.traces, &mut changed);
    next.traces = running.traces.clone();
    let listeners = running
        .listeners
        .iter()
        .map(|l| with_tls_files_of(l, &next.listeners))
        .collect::<Vec<_>>();
    diff("listeners", &listeners, &next.listeners, &mut changed);
    next.listeners = listeners;
    changed
}

/// The running listener `l` with the TLS files of its namesake in `next` (certificates are
/// re-read on every reload; turning TLS on or off needs a restart).
fn with_tls_files_of(l: &ListenerConfig, next: &[ListenerConfig]) -> ListenerConfig {
    let mut kept = l.clone();
    if let Some(Some(tls)) = next.iter().find(|n| n.name == l.name).map(|n| &n.tls) {
        if kept.tls.is_some() {
            kept.tls = Some(tls.clone());
        }
    }
    kept
}

fn diff<T: Serialize>(key: &str, running: &T, next: &T, out: &mut Vec<String>) {
    match (serde_json::to_value(running), serde_json::to_value(next)) {
        (Ok(a), Ok(b)) => diff_values(key, &a, &b, out),
        _ => out.push(key.to_string()),
    }
}

fn diff_values(key: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let (a, b) = (x.get(k), y.get(k));
                diff_values(
                    &format!("{key}.{k}"),
                    a.unwrap_or(&Value::Null),
                    b.unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (a, b)) in x.iter().zip(y).enumerate() {
                diff_values(&format!("{key}[{i}]"), a, b, out);
            }
        }
        _ if a != b => out.push(key.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        keymaster_config::load_str(text, "t.toml").expect("valid test config")
    }

    const BASE: &str = r#"
[server]
workers = 2
[[listeners]]
name = "main"
address = "127.0.0.1:8080"
[[clusters]]
name = "c"
servers = [{ address = "127.0.0.1:8081" }]
[[routes]]
name = "r"
cluster = "c"
"#;

    #[test]
    fn only_restart_only_keys_are_reported_and_put_back() {
        let running = config(BASE);
        let mut next = config(
            &BASE
                .replace("workers = 2", "workers = 4")
                .replace("127.0.0.1:8080", "127.0.0.1:9090")
                .replace("cluster = \"c\"", "cluster = \"c\"\npriority = 5"),
        );
        let changed = keep_running(&running, &mut next);
        assert_eq!(changed, ["server.workers", "listeners[0].address"]);
        assert_eq!(next.server.workers, running.server.workers);
        assert_eq!(next.listeners, running.listeners);
        assert_eq!(next.routes[0].priority, 5, "the rest is applied");
        let mut same = config(BASE);
        assert!(keep_running(&running, &mut same).is_empty());
    }

    #[test]
    fn a_new_listener_is_reported_as_the_list() {
        let running = config(BASE);
        let mut next = config(&format!(
            "{BASE}[[listeners]]\nname = \"b\"\naddress = \"127.0.0.1:8090\"\n"
        ));
        assert_eq!(keep_running(&running, &mut next), ["listeners"]);
        assert_eq!(next.listeners.len(), 1);
    }
}
