//! `--compare-drivers`: the same step run with the built-in load generator and with wrk,
//! compared (requests/s and p50 within [`AGREEMENT`]), and the report's table of them.

use crate::load::LoadReport;

/// Drivers agree when requests/s and p50 differ by at most this fraction.
pub const AGREEMENT: f64 = 0.10;

/// One step run with both drivers.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverComparison {
    /// Scenario.
    pub scenario: String,
    /// System under test.
    pub system: String,
    /// Connections.
    pub connections: usize,
    /// Requests/s: built-in, wrk.
    pub rps: (f64, f64),
    /// p50 latency, ms: built-in, wrk.
    pub p50_ms: (f64, f64),
    /// Whether either run had errors.
    pub errors: bool,
}

impl DriverComparison {
    /// Compares the built-in generator's and wrk's reports of the same step.
    pub fn new(
        scenario: &str,
        system: &str,
        connections: usize,
        builtin: &LoadReport,
        wrk: &LoadReport,
    ) -> DriverComparison {
        DriverComparison {
            scenario: scenario.to_owned(),
            system: system.to_owned(),
            connections,
            rps: (builtin.requests_per_sec, wrk.requests_per_sec),
            p50_ms: (builtin.latency_ms.p50, wrk.latency_ms.p50),
            errors: !builtin.all_ok() || !wrk.all_ok(),
        }
    }

    /// wrk / built-in requests/s.
    pub fn rps_ratio(&self) -> f64 {
        ratio(self.rps.1, self.rps.0)
    }

    /// wrk / built-in p50.
    pub fn p50_ratio(&self) -> f64 {
        ratio(self.p50_ms.1, self.p50_ms.0)
    }

    /// Whether requests/s or p50 differ by more than [`AGREEMENT`] (or either run had errors).
    pub fn disagree(&self) -> bool {
        let off = |r: f64| !r.is_finite() || (r - 1.0).abs() > AGREEMENT;
        self.errors || off(self.rps_ratio()) || off(self.p50_ratio())
    }

    /// A progress line.
    pub fn line(&self) -> String {
        format!(
            "drivers {} {} c={}: req/s builtin {:.0} wrk {:.0} (x{:.3}), p50 builtin {:.3} wrk {:.3} ms (x{:.3}){}",
            self.scenario,
            self.system,
            self.connections,
            self.rps.0,
            self.rps.1,
            self.rps_ratio(),
            self.p50_ms.0,
            self.p50_ms.1,
            self.p50_ratio(),
            if self.disagree() { "  DISAGREE" } else { "  agree" }
        )
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else if a == 0.0 {
        1.0
    } else {
        f64::INFINITY
    }
}

/// The `--compare-drivers` table.
pub fn comparison_markdown(rows: &[DriverComparison]) -> String {
    let mut md = format!(
        "# Load drivers compared\n\nEach step run with the built-in generator and with wrk, one right after \
         the other, against the same system. Ratios are wrk / built-in; a step is flagged when \
         requests/s or p50 differ by more than {:.0}% or either run had errors.\n\n\
         | scenario | system | conns | req/s builtin | req/s wrk | ratio | p50 builtin (ms) | p50 wrk (ms) | ratio | verdict |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
        AGREEMENT * 100.0
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {} |\n",
            r.scenario,
            r.system,
            r.connections,
            r.rps.0,
            r.rps.1,
            r.rps_ratio(),
            r.p50_ms.0,
            r.p50_ms.1,
            r.p50_ratio(),
            match (r.disagree(), r.errors) {
                (_, true) => "**errors**",
                (true, false) => "**disagree**",
                (false, false) => "agree",
            }
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::wrk;
    use crate::load::LoadConfig;

    #[test]
    fn driver_agreement() {
        let report = |rps: f64, p50: f64| LoadReport {
            requests_per_sec: rps,
            latency_ms: crate::load::LatencySummary {
                p50,
                ..Default::default()
            },
            ..run_load_report_template()
        };
        let c = DriverComparison::new(
            "saturation",
            "direct",
            20,
            &report(1000.0, 2.0),
            &report(1090.0, 1.85),
        );
        assert!((c.rps_ratio() - 1.09).abs() < 1e-9);
        assert!((c.p50_ratio() - 0.925).abs() < 1e-9);
        assert!(!c.disagree());
        assert!(c.line().ends_with("agree"));
        let c = DriverComparison::new(
            "ramp",
            "keymaster",
            20,
            &report(1000.0, 2.0),
            &report(880.0, 2.0),
        );
        assert!(c.disagree());
        let c = DriverComparison::new(
            "ramp",
            "keymaster",
            20,
            &report(1000.0, 2.0),
            &report(1000.0, 2.3),
        );
        assert!(c.disagree());
        let md = comparison_markdown(&[c]);
        assert!(md.contains("| ramp | keymaster | 20 | 1000 | 1000 | 1.000 | 2.000 | 2.300 | 1.150 | **disagree** |"), "{md}");
        let c = DriverComparison::new("x", "y", 1, &report(0.0, 0.0), &report(0.0, 0.0));
        assert!(!c.disagree());
    }

    fn run_load_report_template() -> LoadReport {
        wrk::parse_wrk_output(
            "  1 threads and 1 connections\n  10 requests in 1.00s, 1.00KB read\n    Latency 1ms 1ms 1ms 1%\n 50% 1ms\n 75% 1ms\n 90% 1ms\n 99% 1ms\nRequests/sec: 10\n",
        )
        .unwrap()
        .to_report(&LoadConfig::default())
    }
}
