//! Validation of the resilience settings (`crate::resilience`): health checks, outlier
//! ejection, retry budgets, cluster caps, route retry policies and load shedding.

use crate::locate::KeyPath;
use crate::model::{ClusterConfig, Config, UpstreamProtocol};
use crate::resilience::{HealthCheckConfig, HealthCheckKind};
use crate::validate::{check_path, Problems};

/// Most attempts a route's retry policy may ask for.
const MAX_ATTEMPTS: u32 = 10;

pub(crate) fn check(config: &Config, p: &mut Problems) {
    let root = KeyPath::root();
    for (i, c) in config.clusters.iter().enumerate() {
        let at = root.key("clusters").index(i);
        if let Some(h) = &c.health_check {
            health_check(h, c, at.key("health_check"), p);
        }
        let o = &c.outlier_detection;
        let oat = at.key("outlier_detection");
        p.positive(oat.key("base_ejection"), o.base_ejection);
        if o.max_ejection < o.base_ejection {
            p.push(
                oat.key("max_ejection"),
                format!(
                    "max_ejection ({}) is shorter than base_ejection ({}); expected at least base_ejection",
                    o.max_ejection, o.base_ejection
                ),
            );
        }
        percent(o.max_ejected_percent, oat.key("max_ejected_percent"), p);
        percent(
            c.retry_budget.percent,
            at.key("retry_budget").key("percent"),
            p,
        );
        let lat = at.key("limits");
        p.positive(lat.key("queue_timeout"), c.limits.queue_timeout);
        p.positive(lat.key("retry_after"), c.limits.retry_after);
        if c.limits.max_pending > 0 && c.limits.max_requests == 0 {
            p.push(
                lat.key("max_pending"),
                "a queue needs a cap to wait for; expected limits.max_requests > 0 as well",
            );
        }
    }
    for (i, r) in config.routes.iter().enumerate() {
        let at = root.key("routes").index(i).key("retry");
        let rt = &r.retry;
        if !(1..=MAX_ATTEMPTS).contains(&rt.attempts) {
            p.push(
                at.key("attempts"),
                format!(
                    "attempts {} is out of range; expected 1 (no retries) to {MAX_ATTEMPTS}",
                    rt.attempts
                ),
            );
        }
        p.positive_opt(at.key("per_try_timeout"), rt.per_try_timeout);
        p.positive(at.key("backoff_base"), rt.backoff_base);
        if rt.backoff_max < rt.backoff_base {
            p.push(
                at.key("backoff_max"),
                format!(
                    "backoff_max ({}) is shorter than backoff_base ({}); expected at least backoff_base",
                    rt.backoff_max, rt.backoff_base
                ),
            );
        }
        for (j, s) in rt.statuses.iter().enumerate() {
            if !(500..=599).contains(s) {
                p.push(
                    at.key("statuses").index(j),
                    format!("{s} is not a 5xx status; expected e.g. 502, 503 or 504"),
                );
            }
        }
    }
    let ls = &config.load_shedding;
    let at = root.key("load_shedding");
    p.positive_opt(at.key("max_event_loop_lag"), ls.max_event_loop_lag);
    p.positive(at.key("retry_after"), ls.retry_after);
}

/// A cluster's active health check: its values, and whether it can work over the cluster's
/// transport.
fn health_check(h: &HealthCheckConfig, c: &ClusterConfig, hat: KeyPath, p: &mut Problems) {
    if h.path.is_empty() {
        p.push(
            hat.key("path"),
            "must not be empty; expected e.g. \"/healthz\"",
        );
    } else {
        check_path(&Some(h.path.clone()), hat.key("path"), p);
        if http::uri::PathAndQuery::try_from(h.path.as_str()).is_err() {
            p.push(
                hat.key("path"),
                format!("{:?} is not a valid request path", h.path),
            );
        }
    }
    p.positive(hat.key("interval"), h.interval);
    p.positive(hat.key("timeout"), h.timeout);
    for (key, v) in [
        ("healthy_threshold", h.healthy_threshold),
        ("unhealthy_threshold", h.unhealthy_threshold),
    ] {
        if v == 0 {
            p.push(hat.key(key), "must be at least 1");
        }
    }
    match h.kind {
        HealthCheckKind::Http => {
            if h.grpc_service.is_some() {
                p.push(
                    hat.key("grpc_service"),
                    "a service name is for gRPC checks; expected kind = \"grpc\", or no grpc_service",
                );
            }
        }
        HealthCheckKind::Grpc => {
            if c.protocol == UpstreamProtocol::Http1 {
                p.push(
                    hat.key("kind"),
                    "a gRPC check speaks HTTP/2, but the cluster's protocol is \"http1\"; expected protocol = \"h2\" (or \"auto\" with tls) on the cluster, or kind = \"http\"",
                );
            }
            if h.path != HealthCheckConfig::default().path {
                p.push(
                    hat.key("path"),
                    "a gRPC check calls /grpc.health.v1.Health/Check, not a path; expected no path (name the service with grpc_service), or kind = \"http\"",
                );
            }
        }
    }
}

fn percent(v: u32, at: KeyPath, p: &mut Problems) {
    if v > 100 {
        p.push(at, format!("{v} is out of range; expected 0 to 100"));
    }
}

#[cfg(test)]
mod tests {
    use crate::load_str;

    const BASE: &str = r#"
[[listeners]]
address = "127.0.0.1:0"
[[routes]]
name = "r"
cluster = "c"
[[clusters]]
name = "c"
servers = [{ address = "127.0.0.1:1" }]
"#;

    #[test]
    fn defaults_are_valid_and_off() {
        let c = load_str(BASE, "t").expect("valid");
        assert!(c.clusters[0].health_check.is_none());
        assert_eq!(c.routes[0].retry.attempts, 1);
        assert_eq!(c.load_shedding.max_in_flight, 0);
    }

    #[test]
    fn bad_values_are_located() {
        let text = format!(
            "{BASE}health_check = {{ path = \"x\", healthy_threshold = 0 }}\n\
             outlier_detection = {{ max_ejected_percent = 101 }}\n\
             limits = {{ max_pending = 5 }}\n\
             [routes.retry]\nattempts = 0\nstatuses = [404]\n"
        );
        // `[routes.retry]` after `[[clusters]]` applies to the last route table.
        let errs = load_str(&text, "t").unwrap_err().to_string();
        for key in [
            "clusters[0].health_check.path",
            "clusters[0].health_check.healthy_threshold",
            "clusters[0].outlier_detection.max_ejected_percent",
            "clusters[0].limits.max_pending",
            "routes[0].retry.attempts",
            "routes[0].retry.statuses[0]",
        ] {
            assert!(errs.contains(key), "{key} missing from:\n{errs}");
        }
        assert!(errs.contains("t:"), "{errs}");
    }
}
