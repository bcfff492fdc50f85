//! Where and when a bake-off ran, for its report: the machine (CPU model, kernel, cores)
//! and UTC timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

use super::model::Machine;

pub(super) fn machine(cpus: usize) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or_else(|| "unknown CPU".to_owned(), |(_, m)| m.trim().to_owned());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned());
    Machine {
        cpus,
        cpu_model,
        kernel,
    }
}

/// UTC time as `2024-05-01T12:34:56Z`, or `20240501-123456` for a directory name.
pub fn timestamp(t: SystemTime, compact: bool) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    if compact {
        format!("{y:04}{mo:02}{d:02}-{h:02}{m:02}{s:02}")
    } else {
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(timestamp(t, false), "2023-11-14T22:13:20Z");
        assert_eq!(timestamp(t, true), "20231114-221320");
        assert_eq!(timestamp(UNIX_EPOCH, false), "1970-01-01T00:00:00Z");
    }
}
