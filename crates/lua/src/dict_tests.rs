use super::*;

fn text(s: &str) -> DictValue {
    DictValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

/// One shard (so the least recently used order is the whole dictionary's) holding exactly
/// `n` entries of a one-byte key and a 100-byte value.
fn small(n: usize) -> SharedDict {
    SharedDict::with_shards(1, n * (1 + 100 + ENTRY_OVERHEAD), 1000)
}

fn value() -> DictValue {
    text(&"v".repeat(100))
}

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
    d.set("t", text("x"), Some(Duration::ZERO)).unwrap();
    assert_eq!(d.get("t"), None);
    d.set("s", text("x"), None).unwrap();
    assert!(d.incr("s", 1.0, None).is_err());
    assert_eq!(d.incr("c", 2.0, Some(Duration::ZERO)).unwrap(), 2.0);
    assert_eq!(
        d.incr("c", 2.0, None).unwrap(),
        2.0,
        "expired counter restarts"
    );
    d.delete("s");
    assert_eq!(d.get("s"), None);
    assert_eq!(d.stats().entries, 1, "only the counter is left");
}

#[test]
fn the_budget_holds_and_set_evicts() {
    let d = small(10);
    let cap = d.stats().capacity;
    for i in 0..20u8 {
        let key = char::from(b'a' + i).to_string();
        let forcible = d.set(&key, value(), None).unwrap();
        assert_eq!(forcible, i >= 10, "key {i}");
        assert!(d.stats().bytes <= cap);
    }
    let st = d.stats();
    assert_eq!((st.entries, st.evictions), (10, 10));
    assert_eq!(st.bytes, 10 * (1 + 100 + ENTRY_OVERHEAD));
    assert_eq!(d.get("a"), None, "the oldest went first");
    assert_eq!(d.get("t"), Some(value()));
}

#[test]
fn get_and_incr_refresh_recency() {
    let d = small(3);
    for k in ["a", "b", "c"] {
        d.set(k, value(), None).unwrap();
    }
    assert!(d.get("a").is_some());
    assert_eq!(d.set("d", value(), None), Ok(true));
    assert_eq!(d.get("b"), None, "b was the least recently used");
    d.delete("d");
    d.incr("n", 1.0, None).unwrap();
    // c is now the least recently used: a was read, n written after it.
    assert!(d.incr("n", 1.0, None).is_ok());
    assert_eq!(d.set("e", value(), None), Ok(true));
    assert_eq!(d.get("c"), None);
    assert!(d.get("a").is_some() && d.get("n").is_some() && d.get("e").is_some());
}

#[test]
fn values_that_can_never_fit_are_refused() {
    let d = small(3);
    assert_eq!(d.set("k", text(&"x".repeat(1001)), None), Err(NoMemory));
    assert_eq!(
        d.safe_set("k", text(&"x".repeat(1001)), None),
        Err(NoMemory)
    );
    let huge_key = "k".repeat(1000);
    assert_eq!(d.set(&huge_key, value(), None), Err(NoMemory), "keys count");
    assert!(d.incr(&huge_key, 1.0, None).is_err());
    assert_eq!(d.stats().entries, 0);
}

#[test]
fn safe_set_never_evicts_a_live_entry() {
    let d = small(2);
    d.set("a", value(), None).unwrap();
    d.set("b", value(), Some(Duration::from_secs(3600)))
        .unwrap();
    assert_eq!(d.safe_set("c", value(), None), Err(NoMemory));
    assert_eq!(d.get("a"), Some(value()));
    assert_eq!(
        d.safe_set("a", text(&"w".repeat(100)), None),
        Ok(()),
        "replacing fits"
    );
    let bigger = text(&"w".repeat(200));
    assert_eq!(d.safe_set("a", bigger, None), Err(NoMemory));
    assert_eq!(
        d.get("a"),
        Some(text(&"w".repeat(100))),
        "the old value stays"
    );
    d.delete("b");
    assert_eq!(d.safe_set("c", value(), None), Ok(()));
    // An expired entry at the least recently used end makes room.
    d.set("a", value(), Some(Duration::ZERO)).unwrap();
    assert!(d.get("c").is_some());
    assert_eq!(d.safe_set("d", value(), None), Ok(()));
    assert_eq!(d.stats().evictions, 0);
}

#[test]
fn a_smaller_budget_evicts_at_once() {
    let d = small(4);
    for k in ["a", "b", "c", "d"] {
        d.set(k, value(), None).unwrap();
    }
    d.configure(2 * (1 + 100 + ENTRY_OVERHEAD), 1000);
    let st = d.stats();
    assert_eq!((st.entries, st.evictions), (2, 2));
    assert!(d.get("c").is_some() && d.get("d").is_some());
    d.configure(1 << 20, 10);
    assert_eq!(
        d.set("x", value(), None),
        Err(NoMemory),
        "the new largest value"
    );
}
