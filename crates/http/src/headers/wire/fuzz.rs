//! Fuzz properties of the wire-form field edits (proptest, bounded so they run with the unit
//! tests): any sequence of sets, appends and removals (a filter's or a configured one) on
//! any client field block, with or without its Connection lines left out, gives what a
//! plain model of the edits gives, the same whether it
//! is written upstream, made a map or looked up; the name summary never hides a name; a
//! repeated Content-Length is written as none of the client's lines (the gateway writes one).

use super::*;
use proptest::prelude::*;

/// Names a filter may edit (none the head scan looks at), in some of their spellings.
const NAMES: &[&str] = &[
    "x-a",
    "X-A",
    "x-b",
    "X-Long-Name",
    "accept",
    "User-Agent",
    "x-fresh",
];

#[derive(Debug, Clone)]
enum Edit {
    Set(usize, String),
    Append(usize, String),
    Remove(usize),
    SetCompiled(usize, String),
    AppendCompiled(usize, String),
}

fn value() -> impl Strategy<Value = String> {
    "[!-~]([ -~]{0,10}[!-~])?"
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let n = 0..NAMES.len();
    let edit = prop_oneof![
        (n.clone(), value()).prop_map(|(i, v)| Edit::Set(i, v)),
        (n.clone(), value()).prop_map(|(i, v)| Edit::Append(i, v)),
        n.clone().prop_map(Edit::Remove),
        (n.clone(), value()).prop_map(|(i, v)| Edit::SetCompiled(i, v)),
        (n, value()).prop_map(|(i, v)| Edit::AppendCompiled(i, v)),
    ];
    proptest::collection::vec(edit, 0..8)
}

/// A client's field lines: names from `NAMES` (and `host`), values with the spacing a
/// client may put around them.
fn block() -> impl Strategy<Value = Vec<(String, String, String)>> {
    let name = prop_oneof![
        4 => proptest::sample::select(NAMES).prop_map(str::to_string),
        1 => Just("Host".to_string()),
        1 => proptest::sample::select(&["Connection", "connection", "CONNECTION"][..])
            .prop_map(str::to_string),
    ];
    let line = (name, value(), "[ \t]{0,2}", "[ \t]{0,2}");
    proptest::collection::vec(line, 0..8).prop_map(|lines| {
        lines
            .into_iter()
            .map(|(n, v, before, after)| {
                let text = format!("{n}:{before}{v}{after}\r\n");
                (n.to_ascii_lowercase(), v, text)
            })
            .collect()
    })
}

fn name(i: usize) -> HeaderName {
    HeaderName::from_bytes(NAMES[i].as_bytes()).unwrap()
}

fn config() -> ProptestConfig {
    crate::fuzz_config(384)
}

proptest! {
    #![proptest_config(config())]

    /// Edits on wire-form fields give what the model gives: the client's lines kept as
    /// sent (those of a set or removed name dropped), then each edit's field in order; the
    /// map and every lookup agree with what is written.
    #[test]
    fn wire_form_edits_follow_the_model(
        lines in block(),
        edits in edits(),
        leave_out_connection in any::<bool>(),
    ) {
        let text: String = lines.iter().map(|(_, _, t)| t.as_str()).collect();
        let mut fields = RawRequestFields::from_block(bytes::Bytes::from(text), false);
        // The model: which client names are dropped, and the edits' fields in order.
        let mut dropped: Vec<String> = Vec::new();
        let mut added: Vec<(String, String)> = Vec::new();
        let sent = |n: &str| lines.iter().any(|(l, _, _)| l == n);
        if leave_out_connection {
            fields.leave_out_connection();
            dropped.push("connection".to_string());
        }
        for e in &edits {
            let lower = |i: usize| NAMES[i].to_ascii_lowercase();
            match e {
                Edit::Set(i, v) | Edit::SetCompiled(i, v) => {
                    let n = lower(*i);
                    added.retain(|(a, _)| *a != n);
                    if sent(&n) {
                        dropped.push(n.clone());
                    }
                    added.push((n, v.clone()));
                }
                Edit::Append(i, v) | Edit::AppendCompiled(i, v) => added.push((lower(*i), v.clone())),
                Edit::Remove(i) => {
                    let n = lower(*i);
                    added.retain(|(a, _)| *a != n);
                    if sent(&n) {
                        dropped.push(n);
                    }
                }
            }
            let hv = |v: &str| HeaderValue::from_str(v).unwrap();
            match e {
                Edit::Set(i, v) => fields.set(name(*i), hv(v)),
                Edit::Append(i, v) => fields.append(name(*i), hv(v)),
                Edit::Remove(i) => fields.remove(&name(*i)),
                Edit::SetCompiled(i, v) => fields.set_compiled(&CompiledField::new(&name(*i), &hv(v))),
                Edit::AppendCompiled(i, v) => fields.append_compiled(&CompiledField::new(&name(*i), &hv(v))),
            }
        }
        let kept: Vec<&(String, String, String)> =
            lines.iter().filter(|(n, _, _)| !dropped.contains(n)).collect();
        // Written upstream.
        let mut want = String::new();
        for (_, _, t) in &kept {
            want.push_str(t);
        }
        for (n, v) in &added {
            want.push_str(&format!("{n}: {v}\r\n"));
        }
        let mut wrote = Vec::new();
        fields.write(&mut wrote);
        prop_assert_eq!(String::from_utf8(wrote.clone()).unwrap(), want);
        prop_assert!(fields.len_hint() >= wrote.len());
        // As a map, and looked up.
        let all: Vec<(String, String)> = kept
            .iter()
            .map(|(n, v, _)| (n.clone(), v.clone()))
            .chain(added.iter().cloned())
            .collect();
        let map = fields.to_map();
        prop_assert_eq!(map.len(), all.len());
        for n in NAMES.iter().chain(&["host", "x-none", "connection"]) {
            let lower = n.to_ascii_lowercase();
            let model: Vec<&[u8]> =
                all.iter().filter(|(a, _)| *a == lower).map(|(_, v)| v.as_bytes()).collect();
            let from_map: Vec<&[u8]> = map.get_all(lower.as_str()).iter().map(|v| v.as_bytes()).collect();
            prop_assert_eq!(&from_map, &model, "{} in the map", n);
            let looked_up: Vec<&[u8]> = fields.get_all(n).collect();
            prop_assert_eq!(&looked_up, &model, "{} looked up", n);
        }
    }

    /// The name summary only ever errs towards a search: every name a block holds, in any
    /// spelling, may be there.
    #[test]
    fn the_name_summary_never_hides_a_name(names in proptest::collection::vec("[!#$%&'*+.^_`|~0-9A-Za-z-]{1,24}", 1..12)) {
        let text: String = names.iter().map(|n| format!("{n}: v\r\n")).collect();
        let summary = NameSummary::of(text.as_bytes());
        for n in &names {
            prop_assert!(summary.may_hold(n.to_ascii_lowercase().as_bytes()), "{}", n);
            prop_assert!(summary.may_hold(n.to_ascii_uppercase().as_bytes()), "{}", n);
        }
    }

    /// A length the client repeated: none of its Content-Length lines is written (the
    /// origin gets one, written from the body), every other line is, as sent.
    #[test]
    fn a_repeated_length_writes_no_client_length_line(
        lines in block(),
        at in proptest::collection::vec(0usize..8, 1..3),
        spelled in proptest::sample::select(&["Content-Length", "content-length", "CONTENT-length"][..]),
    ) {
        let mut texts: Vec<String> = lines.iter().map(|(_, _, t)| t.clone()).collect();
        for i in at {
            texts.insert(i.min(texts.len()), format!("{spelled}: 5\r\n"));
        }
        let text: String = texts.concat();
        let block = bytes::Bytes::from(text.clone());
        let fields = RawRequestFields::new(block, ClientLength::Rewritten, NameSummary::of(text.as_bytes()));
        let mut wrote = Vec::new();
        fields.write(&mut wrote);
        let want: String = lines.iter().map(|(_, _, t)| t.as_str()).collect();
        prop_assert_eq!(String::from_utf8(wrote).unwrap(), want);
        prop_assert!(!fields.declares_length());
    }
}
