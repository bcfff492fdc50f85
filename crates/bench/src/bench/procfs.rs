//! CPU time, context switches and RSS of a process tree, read from `/proc`.
//!
//! A system under test may be one process with many threads (keymaster, HAProxy) or a master
//! with worker processes (nginx), so everything is summed over the root process and all its
//! descendants, found by scanning every `/proc/<pid>/stat` for its parent pid.
//!
//! - **CPU**: `utime + stime` of `/proc/<pid>/stat` (fields 14 and 15, clock ticks). For a
//!   process (not a task) the kernel sums all its threads, dead ones included, so a thread that
//!   exits mid-step still counts.
//! - **Context switches**: `voluntary_ctxt_switches + nonvoluntary_ctxt_switches` of every
//!   `/proc/<pid>/task/<tid>/status`: the process-level file only reports the main thread. A
//!   thread that exits between two samples loses its switches (rare: none of the systems spawn
//!   short-lived threads while serving); deltas are taken per thread so this never goes negative.
//! - **RSS**: `VmRSS` of `/proc/<pid>/status`, summed (so an nginx master and its workers count
//!   shared pages more than once: an upper bound).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Parent pid (field 4).
    pub ppid: u32,
    /// User-mode CPU time in clock ticks (field 14).
    pub utime: u64,
    /// Kernel-mode CPU time in clock ticks (field 15).
    pub stime: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may itself contain
/// spaces and parentheses, so the fields are counted from the *last* `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), so field n is fields[n - 3].
    Some(Stat {
        ppid: fields.get(1)?.parse().ok()?,
        utime: fields.get(11)?.parse().ok()?,
        stime: fields.get(12)?.parse().ok()?,
    })
}

/// What `/proc/<pid>/status` (or a task's) says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Status {
    /// Resident set size, KiB (`VmRSS`; absent for kernel threads and zombies).
    pub rss_kib: u64,
    /// `voluntary_ctxt_switches`.
    pub voluntary: u64,
    /// `nonvoluntary_ctxt_switches`.
    pub nonvoluntary: u64,
}

impl Status {
    /// Voluntary plus involuntary switches.
    pub fn switches(&self) -> u64 {
        self.voluntary + self.nonvoluntary
    }
}

/// Parses the fields of `/proc/<pid>/status` that the bench uses; missing ones are 0.
pub fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let number = || {
            value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match key {
            "VmRSS" => s.rss_kib = number(),
            "voluntary_ctxt_switches" => s.voluntary = number(),
            "nonvoluntary_ctxt_switches" => s.nonvoluntary = number(),
            _ => {}
        }
    }
    s
}

/// Every pid in `parents` (pid → ppid) that is `root` or descends from it.
pub fn descendants(root: u32, parents: &BTreeMap<u32, u32>) -> BTreeSet<u32> {
    let mut tree = BTreeSet::from([root]);
    // Parents can have larger pids than their children after pid wrap-around: iterate to a fixpoint.
    loop {
        let before = tree.len();
        for (&pid, ppid) in parents {
            if tree.contains(ppid) {
                tree.insert(pid);
            }
        }
        if tree.len() == before {
            return tree;
        }
    }
}

/// One reading of a process tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeSample {
    /// CPU ticks (`utime + stime`) per process.
    pub cpu_ticks: BTreeMap<u32, u64>,
    /// Context switches per thread (`(pid, tid)`).
    pub switches: BTreeMap<(u32, u32), u64>,
    /// Summed RSS, KiB.
    pub rss_kib: u64,
    /// Processes in the tree.
    pub processes: usize,
    /// Threads in the tree.
    pub threads: usize,
}

/// The difference between two samples of the same tree.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TreeDelta {
    /// CPU seconds used between the samples.
    pub cpu_secs: f64,
    /// Context switches between the samples.
    pub switches: u64,
}

/// What happened between `before` and `after`, per process and per thread: a process or thread
/// that appears only in `after` counts from zero; one that disappeared counts nothing.
pub fn delta(before: &TreeSample, after: &TreeSample, ticks_per_sec: u64) -> TreeDelta {
    let ticks: u64 = after
        .cpu_ticks
        .iter()
        .map(|(pid, t)| t.saturating_sub(before.cpu_ticks.get(pid).copied().unwrap_or(0)))
        .sum();
    let switches = after
        .switches
        .iter()
        .map(|(id, n)| n.saturating_sub(before.switches.get(id).copied().unwrap_or(0)))
        .sum();
    TreeDelta {
        cpu_secs: ticks as f64 / ticks_per_sec.max(1) as f64,
        switches,
    }
}

/// Clock ticks per second for `/proc/<pid>/stat` CPU fields.
pub fn ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Reads the current state of the tree rooted at `root` from `/proc`. A process that exits while
/// it is being read is skipped.
pub fn sample_tree(root: u32) -> (TreeSample, Instant) {
    let mut parents = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(stat) = read_stat(pid) {
                parents.insert(pid, stat.ppid);
            }
        }
    }
    let at = Instant::now();
    let mut sample = TreeSample::default();
    for pid in descendants(root, &parents) {
        let Some(stat) = read_stat(pid) else { continue };
        sample.processes += 1;
        sample.cpu_ticks.insert(pid, stat.utime + stat.stime);
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            sample.rss_kib += parse_status(&text).rss_kib;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) {
                sample.threads += 1;
                sample
                    .switches
                    .insert((pid, tid), parse_status(&text).switches());
            }
        }
    }
    (sample, at)
}

fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Busy and total clock ticks of `cpus` summed, from `/proc/stat` text (`cpuN user nice system
/// idle iowait irq softirq steal ...`; idle and iowait are not busy). `None` if a CPU is missing.
pub fn parse_cpu_ticks(stat: &str, cpus: &[usize]) -> Option<(u64, u64)> {
    let (mut busy, mut total) = (0u64, 0u64);
    for cpu in cpus {
        let name = format!("cpu{cpu}");
        let line = stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|t| t.parse().unwrap_or(0))
            .collect();
        let all: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        busy += all - idle.min(all);
        total += all;
    }
    Some((busy, total))
}

/// [`parse_cpu_ticks`] of the running system.
pub fn cpu_ticks(cpus: &[usize]) -> Option<(u64, u64)> {
    parse_cpu_ticks(&std::fs::read_to_string("/proc/stat").ok()?, cpus)
}

/// The 1-minute load average of `/proc/loadavg` (its first field).
pub fn parse_load_avg(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The machine's 1-minute load average now (the 2013 table's LdAvg).
pub fn load_avg() -> Option<f64> {
    parse_load_avg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

/// Percent of `cpus`' time that was busy between two [`cpu_ticks`] readings.
pub fn busy_pct(a: (u64, u64), b: (u64, u64)) -> Option<f64> {
    let total = b.1.checked_sub(a.1).filter(|t| *t > 0)?;
    Some(100.0 * b.0.saturating_sub(a.0) as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (nginx: worker (1)) S 4241 4241 4241 0 -1 4194624 1052 0 0 0 \
                        731 268 0 0 20 0 1 0 51234 11649024 2048 18446744073709551615 1 1 0 0 0 \
                        0 0 4096 402736647 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    const STATUS: &str = "Name:\tkeymaster\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t77\n\
                          VmPeak:\t  120000 kB\nVmRSS:\t   10240 kB\nThreads:\t3\n\
                          voluntary_ctxt_switches:\t1500\nnonvoluntary_ctxt_switches:\t25\n";

    #[test]
    fn stat_fields_after_a_name_with_parens_and_spaces() {
        let s = parse_stat(STAT).unwrap();
        assert_eq!(
            s,
            Stat {
                ppid: 4241,
                utime: 731,
                stime: 268
            }
        );
        assert_eq!(parse_stat("12 (x) S"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn status_fields() {
        let s = parse_status(STATUS);
        assert_eq!(s.rss_kib, 10240);
        assert_eq!(s.voluntary, 1500);
        assert_eq!(s.nonvoluntary, 25);
        assert_eq!(s.switches(), 1525);
        // A kernel thread has no VmRSS.
        assert_eq!(parse_status("Name:\tkthreadd\n").rss_kib, 0);
    }

    #[test]
    fn tree_of_a_master_and_its_workers() {
        let parents = BTreeMap::from([(1, 0), (10, 1), (11, 10), (12, 10), (13, 1), (14, 11)]);
        assert_eq!(descendants(10, &parents), BTreeSet::from([10, 11, 12, 14]));
        assert_eq!(descendants(99, &parents), BTreeSet::from([99]));
        // A child with a smaller pid than its parent (pid wrap-around).
        let parents = BTreeMap::from([(2, 50), (1, 2), (50, 0)]);
        assert_eq!(descendants(50, &parents), BTreeSet::from([50, 2, 1]));
    }

    #[test]
    fn deltas_per_process_and_thread() {
        let before = TreeSample {
            cpu_ticks: BTreeMap::from([(10, 100), (11, 50)]),
            switches: BTreeMap::from([((10, 10), 1000), ((10, 20), 500), ((11, 11), 7)]),
            ..TreeSample::default()
        };
        let after = TreeSample {
            // Process 11 exited; 12 is new.
            cpu_ticks: BTreeMap::from([(10, 350), (12, 30)]),
            // Thread 20 exited; thread 21 is new.
            switches: BTreeMap::from([((10, 10), 1600), ((10, 21), 40), ((12, 12), 60)]),
            ..TreeSample::default()
        };
        let d = delta(&before, &after, 100);
        assert!((d.cpu_secs - 2.8).abs() < 1e-9, "{}", d.cpu_secs);
        assert_eq!(d.switches, 600 + 40 + 60);
    }

    #[test]
    fn samples_this_process() {
        let me = std::process::id();
        let (a, _) = sample_tree(me);
        assert!(a.processes >= 1);
        assert!(a.threads >= 1);
        assert!(a.rss_kib > 0);
        assert!(a.cpu_ticks.contains_key(&me));
        let busy = Instant::now();
        while busy.elapsed().as_millis() < 60 {
            std::hint::black_box(busy.elapsed());
        }
        let (b, _) = sample_tree(me);
        let d = delta(&a, &b, ticks_per_sec());
        assert!(d.cpu_secs >= 0.0);
    }

    #[test]
    fn cpu_ticks_sum_the_named_cpus_busy_and_total() {
        let stat = "cpu  10 0 10 100 0 0 0 0 0 0\n\
                    cpu0 1 0 1 50 0 0 0 0 0 0\n\
                    cpu1 30 2 10 40 8 0 10 0 0 0\n";
        assert_eq!(parse_cpu_ticks(stat, &[1]), Some((52, 100)));
        assert_eq!(parse_cpu_ticks(stat, &[0, 1]), Some((54, 152)));
        assert_eq!(parse_cpu_ticks(stat, &[2]), None);
        assert_eq!(busy_pct((52, 100), (152, 200)), Some(100.0));
        assert_eq!(busy_pct((52, 100), (52, 100)), None);
    }

    #[test]
    fn load_avg_is_the_first_field() {
        assert_eq!(parse_load_avg("3.52 2.10 1.05 4/612 91234\n"), Some(3.52));
        assert_eq!(parse_load_avg(""), None);
        assert!(load_avg().is_some_and(|l| l >= 0.0));
    }
}
