//! The process-wide shared dictionary Lua filters use for counters across requests and
//! workers (`shared.get/set/incr/delete`, with an optional TTL).
//!
//! It is sharded: a key hashes to one of [`SHARDS`] maps, each behind its own `Mutex`. Every
//! operation is one hash-map lookup or insert under that shard's lock, with no allocation
//! beyond the key and no I/O or Lua code inside the critical section, so a worker waits at
//! most for another worker's single map operation on the same shard (well under a
//! microsecond): it never blocks a worker's event loop meaningfully. Expired entries are
//! removed when touched, and a shard is swept of them whenever it has doubled since its last
//! sweep, so memory is bounded by the live keys.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Number of independently locked shards.
pub const SHARDS: usize = 32;

/// A stored value.
#[derive(Debug, Clone, PartialEq)]
pub enum DictValue {
    Number(f64),
    Text(String),
}

struct Entry {
    value: DictValue,
    expires: Option<Instant>,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.expires.is_none_or(|e| e > now)
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<String, Entry>,
    /// Length after the last sweep of expired entries.
    swept_len: usize,
}

impl Shard {
    fn maybe_sweep(&mut self, now: Instant) {
        if self.map.len() >= 64 && self.map.len() >= 2 * self.swept_len {
            self.map.retain(|_, e| e.live(now));
            self.swept_len = self.map.len();
        }
    }
}

/// The shared dictionary (one per `LuaFilters`, i.e. per process in the binary).
pub struct SharedDict {
    shards: Vec<Mutex<Shard>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for SharedDict {
    fn default() -> Self {
        SharedDict {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: Default::default(),
        }
    }
}

impl SharedDict {
    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let i = (self.hasher.hash_one(key) as usize) % SHARDS;
        // A panic never happens inside a critical section (plain map operations), so a
        // poisoned lock still holds consistent data.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live value of `key`.
    pub fn get(&self, key: &str) -> Option<DictValue> {
        let now = Instant::now();
        let mut s = self.shard(key);
        match s.map.get(key) {
            Some(e) if e.live(now) => Some(e.value.clone()),
            Some(_) => {
                s.map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Store `value`, expiring after `ttl` if given.
    pub fn set(&self, key: &str, value: DictValue, ttl: Option<Duration>) {
        let now = Instant::now();
        let mut s = self.shard(key);
        s.maybe_sweep(now);
        s.map.insert(
            key.to_owned(),
            Entry {
                value,
                expires: ttl.map(|t| now + t),
            },
        );
    }

    /// Add `delta` to the number at `key` atomically and return the new value. A missing or
    /// expired key starts at 0 and gets `ttl` (an existing key keeps its expiry). A key
    /// holding text is an error.
    pub fn incr(&self, key: &str, delta: f64, ttl: Option<Duration>) -> Result<f64, String> {
        let now = Instant::now();
        let mut s = self.shard(key);
        if let Some(e) = s.map.get_mut(key) {
            if e.live(now) {
                return match &mut e.value {
                    DictValue::Number(n) => {
                        *n += delta;
                        Ok(*n)
                    }
                    DictValue::Text(_) => Err(format!("shared key {key:?} holds text")),
                };
            }
        }
        s.maybe_sweep(now);
        s.map.insert(
            key.to_owned(),
            Entry {
                value: DictValue::Number(delta),
                expires: ttl.map(|t| now + t),
            },
        );
        Ok(delta)
    }

    /// Remove `key`.
    pub fn delete(&self, key: &str) {
        self.shard(key).map.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incr_is_atomic_across_threads() {
        let d = std::sync::Arc::new(SharedDict::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        d.incr("n", 1.0, None).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(d.get("n"), Some(DictValue::Number(4000.0)));
    }

    #[test]
    fn ttl_expires_and_text_is_not_a_counter() {
        let d = SharedDict::default();
        d.set("t", DictValue::Text("x".into()), Some(Duration::ZERO));
        assert_eq!(d.get("t"), None);
        d.set("s", DictValue::Text("x".into()), None);
        assert!(d.incr("s", 1.0, None).is_err());
        assert_eq!(d.incr("c", 2.0, Some(Duration::ZERO)).unwrap(), 2.0);
        assert_eq!(
            d.incr("c", 2.0, None).unwrap(),
            2.0,
            "expired counter restarts"
        );
        d.delete("s");
        assert_eq!(d.get("s"), None);
    }
}
