//! The filters directory watcher: a thread that looks at the `.lua` files' names, sizes and
//! modification times every `poll_interval` and asks the gateway for a reload when they
//! differ from what the last build (from any trigger: start, SIGHUP, admin, this watcher)
//! compiled. A cheap `stat` poll instead of inotify: no extra dependency, and it works on
//! every file system (bind mounts, NFS, editors that replace files).

use keymaster_config::LuaConfig;
use keymaster_filter::Reloader;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// What to watch, as of the last build.
#[derive(Default)]
pub(crate) struct Target {
    dir: Option<PathBuf>,
    enabled: bool,
    interval: Duration,
    seen: Option<Fingerprint>,
}

fn fingerprint(dir: &Path) -> Option<Fingerprint> {
    let files = crate::set::lua_files(dir).ok()?;
    Some(
        files
            .into_iter()
            .map(|p| {
                let m = std::fs::metadata(&p).ok();
                let len = m.as_ref().map(|m| m.len()).unwrap_or(0);
                let mtime = m.and_then(|m| m.modified().ok());
                (p, len, mtime)
            })
            .collect(),
    )
}

/// A build is about to compile `dir` with `l`'s settings.
pub(crate) fn record(target: &Mutex<Target>, dir: Option<&Path>, l: &LuaConfig) {
    let mut t = target.lock().unwrap_or_else(|e| e.into_inner());
    t.dir = dir.map(Path::to_path_buf);
    t.enabled = l.watch && dir.is_some();
    t.interval = l.poll_interval.get();
    t.seen = dir.and_then(fingerprint);
}

pub(crate) fn run(target: &Mutex<Target>, reloader: Reloader) {
    while reloader.is_alive() {
        let (dir, interval, seen) = {
            let t = target.lock().unwrap_or_else(|e| e.into_inner());
            let interval = if t.interval.is_zero() {
                Duration::from_secs(1)
            } else {
                t.interval
            };
            (
                t.enabled.then(|| t.dir.clone()).flatten(),
                interval,
                t.seen.clone(),
            )
        };
        std::thread::sleep(interval);
        let Some(dir) = dir else { continue };
        let now = fingerprint(&dir);
        if now.is_some() && now != seen {
            match reloader.reload() {
                Ok(v) => {
                    tracing::info!(version = v, dir = %dir.display(), "lua: filters changed; new version active")
                }
                Err(e) => {
                    tracing::error!(error = %e, "lua: filters changed but the new set was rejected; keeping the running one")
                }
            }
        }
    }
}
