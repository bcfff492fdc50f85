//! The process-wide shared dictionary Lua filters use for counters and small values across
//! requests and workers (`shared.get/set/safe_set/incr/delete`, with an optional TTL), with
//! a byte budget as OpenResty's `lua_shared_dict`.
//!
//! **Budget.** The dictionary holds at most `[lua] shared_dict_size` bytes, counting for
//! every entry its key, its value (a string's length, 8 bytes for a number) and
//! [`ENTRY_OVERHEAD`] bytes. It is split into [`SHARDS`] shards, each with an equal share
//! of the budget and its own least-recently-used order (`get`, `set` and `incr` make an
//! entry the most recent). A value longer than `[lua] shared_max_value`, or an entry larger
//! than a shard's share, is never stored ("no memory"). To make room, `set` removes entries
//! from the least recently used end of the key's shard (a live one removed is an eviction,
//! which `set` reports as `forcible`); `safe_set` removes only expired entries found at that
//! end, and otherwise fails. [`SharedDict::stats`] reports the bytes used, the entries and
//! the evictions; [`SharedDict::configure`] applies a new budget.
//!
//! **Locking.** A key hashes to one shard, behind its own `Mutex`. A critical section is a
//! few map and list operations: keys and values are allocated before the lock is taken,
//! values read are reference-counted (no copy under the lock), and entries removed are
//! dropped after it is released. A worker therefore waits at most for another worker's few
//! operations on the same shard: it never blocks an event loop meaningfully. Expired entries
//! are also removed when touched, and a shard is swept of them whenever it has doubled in
//! entries since its last sweep.

use bytes::Bytes;
use lru::LruCache;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Number of independently locked shards.
pub const SHARDS: usize = keymaster_config::SHARED_DICT_SHARDS as usize;
/// Bytes counted for every entry besides its key and value (map slot, list node, expiry).
pub const ENTRY_OVERHEAD: usize = 128;

/// A stored value.
#[derive(Debug, Clone, PartialEq)]
pub enum DictValue {
    Number(f64),
    Text(Bytes),
}

impl DictValue {
    fn len(&self) -> usize {
        match self {
            DictValue::Number(_) => 8,
            DictValue::Text(t) => t.len(),
        }
    }
}

/// The value can never be stored (longer than the largest value, or larger than a shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoMemory;

/// What the dictionary holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DictStats {
    /// Bytes counted (keys, values and per-entry overhead).
    pub bytes: usize,
    pub entries: usize,
    /// Live entries removed to make room since the process started.
    pub evictions: u64,
    /// The budget, `[lua] shared_dict_size`.
    pub capacity: usize,
}

struct Entry {
    value: DictValue,
    expires: Option<Instant>,
    size: usize,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.expires.is_none_or(|e| e > now)
    }
}

/// Entries taken out under a shard lock, dropped once it is released.
type Removed = Vec<Entry>;

struct Shard {
    map: LruCache<Box<str>, Entry>,
    used: usize,
    evictions: u64,
    /// Length after the last sweep of expired entries.
    swept_len: usize,
}

impl Shard {
    fn new() -> Shard {
        Shard {
            map: LruCache::unbounded(),
            used: 0,
            evictions: 0,
            swept_len: 0,
        }
    }

    fn remove(&mut self, key: &str, out: &mut Removed) {
        if let Some(e) = self.map.pop(key) {
            self.used -= e.size;
            out.push(e);
        }
    }

    /// Remove least recently used entries until `need` more bytes fit in `cap`: expired
    /// ones, and live ones too if `evict`. Whether it fits, and whether a live entry went.
    fn make_room(
        &mut self,
        need: usize,
        cap: usize,
        evict: bool,
        now: Instant,
        out: &mut Removed,
    ) -> (bool, bool) {
        let mut forcible = false;
        while self.used + need > cap {
            let live = match self.map.peek_lru() {
                Some((_, e)) => e.live(now),
                None => break,
            };
            if live && !evict {
                break;
            }
            if let Some((_, e)) = self.map.pop_lru() {
                self.used -= e.size;
                out.push(e);
            }
            if live {
                forcible = true;
                self.evictions += 1;
            }
        }
        (self.used + need <= cap, forcible)
    }

    fn maybe_sweep(&mut self, now: Instant) {
        if self.map.len() >= 64 && self.map.len() >= 2 * self.swept_len {
            let mut freed = 0;
            self.map.retain(|_, e| {
                let keep = e.live(now);
                if !keep {
                    freed += e.size;
                }
                keep
            });
            self.used -= freed;
            self.swept_len = self.map.len();
        }
    }

    fn insert(&mut self, key: Box<str>, entry: Entry, out: &mut Removed) {
        self.used += entry.size;
        if let Some(old) = self.map.put(key, entry) {
            self.used -= old.size;
            out.push(old);
        }
    }
}

/// The shared dictionary (one per `LuaFilters`, i.e. per process in the binary).
pub struct SharedDict {
    shards: Vec<Mutex<Shard>>,
    hasher: std::collections::hash_map::RandomState,
    /// `shared_dict_size / SHARDS` and `shared_max_value`, set from every config version.
    shard_capacity: AtomicUsize,
    max_value: AtomicUsize,
}

impl Default for SharedDict {
    fn default() -> Self {
        let c = keymaster_config::LuaConfig::default();
        SharedDict::new(c.shared_dict_size.0 as usize, c.shared_max_value.0 as usize)
    }
}

impl SharedDict {
    /// A dictionary of `capacity` bytes storing values of at most `max_value` bytes.
    pub fn new(capacity: usize, max_value: usize) -> SharedDict {
        SharedDict::with_shards(SHARDS, capacity, max_value)
    }

    fn with_shards(shards: usize, capacity: usize, max_value: usize) -> SharedDict {
        SharedDict {
            shards: (0..shards).map(|_| Mutex::new(Shard::new())).collect(),
            hasher: Default::default(),
            shard_capacity: AtomicUsize::new(capacity / shards),
            max_value: AtomicUsize::new(max_value),
        }
    }

    /// Apply a config version's budget: entries past a smaller one are evicted now.
    pub fn configure(&self, capacity: usize, max_value: usize) {
        let cap = capacity / self.shards.len();
        self.max_value.store(max_value, Ordering::Relaxed);
        if self.shard_capacity.swap(cap, Ordering::Relaxed) <= cap {
            return;
        }
        let now = Instant::now();
        for shard in &self.shards {
            let mut removed = Removed::new();
            lock(shard).make_room(0, cap, true, now, &mut removed);
            drop(removed);
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let i = (self.hasher.hash_one(key) as usize) % self.shards.len();
        lock(&self.shards[i])
    }

    /// The live value of `key` (now its shard's most recently used entry).
    pub fn get(&self, key: &str) -> Option<DictValue> {
        let now = Instant::now();
        let mut removed = Removed::new();
        let mut s = self.shard(key);
        let live = s.map.get(key).map(|e| e.live(now).then(|| e.value.clone()));
        match live {
            Some(Some(v)) => Some(v),
            Some(None) => {
                s.remove(key, &mut removed);
                drop(s);
                None
            }
            None => None,
        }
    }

    /// Store `value`, expiring after `ttl` if given, evicting least recently used entries
    /// of the key's shard if needed: whether a live entry was evicted (`forcible`).
    pub fn set(
        &self,
        key: &str,
        value: DictValue,
        ttl: Option<Duration>,
    ) -> Result<bool, NoMemory> {
        self.store(key, value, ttl, true)
    }

    /// [`SharedDict::set`] that evicts no live entry: it fails when the shard is full.
    pub fn safe_set(
        &self,
        key: &str,
        value: DictValue,
        ttl: Option<Duration>,
    ) -> Result<(), NoMemory> {
        self.store(key, value, ttl, false).map(|_| ())
    }

    fn store(
        &self,
        key: &str,
        value: DictValue,
        ttl: Option<Duration>,
        evict: bool,
    ) -> Result<bool, NoMemory> {
        let cap = self.shard_capacity.load(Ordering::Relaxed);
        let size = key.len() + value.len() + ENTRY_OVERHEAD;
        if value.len() > self.max_value.load(Ordering::Relaxed) || size > cap {
            return Err(NoMemory);
        }
        let now = Instant::now();
        let entry = Entry {
            value,
            expires: ttl.map(|t| now + t),
            size,
        };
        let key: Box<str> = key.into();
        let mut removed = Removed::new();
        let mut s = self.shard(&key);
        s.maybe_sweep(now);
        let old = s.map.pop(&key);
        s.used -= old.as_ref().map_or(0, |e| e.size);
        let (fits, forcible) = s.make_room(size, cap, evict, now, &mut removed);
        if !fits {
            // Only `safe_set` gets here: the old value stays.
            if let Some(old) = old {
                s.insert(key, old, &mut removed);
            }
            drop(s);
            return Err(NoMemory);
        }
        removed.extend(old);
        s.insert(key, entry, &mut removed);
        drop(s);
        Ok(forcible)
    }

    /// Add `delta` to the number at `key` atomically and return the new value. A missing or
    /// expired key starts at 0 and gets `ttl` (an existing key keeps its expiry), evicting
    /// as `set` does. A key holding text is an error, as is a key too long to store.
    pub fn incr(&self, key: &str, delta: f64, ttl: Option<Duration>) -> Result<f64, String> {
        let now = Instant::now();
        if let Some(e) = self.shard(key).map.get_mut(key).filter(|e| e.live(now)) {
            return add_to(e, key, delta);
        }
        self.new_counter(key, delta, ttl, now)
    }

    /// [`SharedDict::incr`] of a key that held no live value when looked at: the key is
    /// allocated without the lock, and the entry looked at again under it.
    fn new_counter(
        &self,
        key: &str,
        delta: f64,
        ttl: Option<Duration>,
        now: Instant,
    ) -> Result<f64, String> {
        let cap = self.shard_capacity.load(Ordering::Relaxed);
        let size = key.len() + 8 + ENTRY_OVERHEAD;
        if size > cap {
            return Err(format!("shared key {key:?}: no memory"));
        }
        let owned: Box<str> = key.into();
        let mut removed = Removed::new();
        let mut s = self.shard(key);
        if let Some(e) = s.map.get_mut(key).filter(|e| e.live(now)) {
            return add_to(e, key, delta);
        }
        s.maybe_sweep(now);
        s.remove(key, &mut removed);
        s.make_room(size, cap, true, now, &mut removed);
        let entry = Entry {
            value: DictValue::Number(delta),
            expires: ttl.map(|t| now + t),
            size,
        };
        s.insert(owned, entry, &mut removed);
        drop(s);
        Ok(delta)
    }

    /// Remove `key`.
    pub fn delete(&self, key: &str) {
        let mut removed = Removed::new();
        self.shard(key).remove(key, &mut removed);
    }

    /// Bytes used, entries and evictions, summed over the shards (each locked in turn).
    pub fn stats(&self) -> DictStats {
        let mut st = DictStats {
            capacity: self.shard_capacity.load(Ordering::Relaxed) * self.shards.len(),
            ..DictStats::default()
        };
        for shard in &self.shards {
            let s = lock(shard);
            st.bytes += s.used;
            st.entries += s.map.len();
            st.evictions += s.evictions;
        }
        st
    }
}

/// `incr` on a live entry.
fn add_to(e: &mut Entry, key: &str, delta: f64) -> Result<f64, String> {
    match &mut e.value {
        DictValue::Number(n) => {
            *n += delta;
            Ok(*n)
        }
        DictValue::Text(_) => Err(format!("shared key {key:?} holds text")),
    }
}

/// A panic never happens inside a critical section (plain map operations), so a poisoned
/// lock still holds consistent data.
fn lock(m: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
#[path = "dict_tests.rs"]
mod tests;
