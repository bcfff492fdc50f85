//! The server list file of service discovery (`[[clusters]] discovery.file`): one server per
//! line, `host:port [weight]`, `#` starts a comment, blank lines are skipped. Parsed with the
//! same address and weight rules as `servers` entries; a problem names its line.

use crate::model::OriginServerConfig;
use crate::validate::{check_host_port, MAX_WEIGHT};

/// Parse a server list; `Err` names the first bad line (`line N: ...`).
pub fn parse_servers_file(text: &str) -> Result<Vec<OriginServerConfig>, String> {
    let mut servers = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let n = i + 1;
        let mut words = line.split_whitespace();
        let address = words.next().unwrap_or_default();
        check_host_port(address).map_err(|why| {
            format!("line {n}: {address:?}: {why}; expected \"host:port [weight]\"")
        })?;
        let weight = match words.next() {
            None => 1,
            Some(w) => match w.parse::<u32>() {
                Ok(w) if (1..=MAX_WEIGHT).contains(&w) => w,
                _ => {
                    return Err(format!(
                        "line {n}: weight {w:?} is not a number from 1 to {MAX_WEIGHT}"
                    ))
                }
            },
        };
        if let Some(extra) = words.next() {
            return Err(format!(
                "line {n}: unexpected {extra:?}; expected \"host:port [weight]\""
            ));
        }
        servers.push(OriginServerConfig {
            address: address.to_string(),
            weight,
        });
    }
    Ok(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_weights_comments() {
        let s =
            parse_servers_file("# api\n10.0.0.1:80\n\n api.internal:8080 3 # canary\n").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].address.as_str(), s[0].weight), ("10.0.0.1:80", 1));
        assert_eq!(
            (s[1].address.as_str(), s[1].weight),
            ("api.internal:8080", 3)
        );
        assert_eq!(parse_servers_file("# nothing\n").unwrap(), Vec::new());
    }

    #[test]
    fn bad_lines_are_named() {
        let e = parse_servers_file("10.0.0.1:80\nno-port\n").unwrap_err();
        assert!(e.starts_with("line 2: \"no-port\""), "{e}");
        let e = parse_servers_file("10.0.0.1:80 0\n").unwrap_err();
        assert!(e.starts_with("line 1: weight \"0\""), "{e}");
        let e = parse_servers_file("10.0.0.1:80 1 x\n").unwrap_err();
        assert!(e.starts_with("line 1: unexpected \"x\""), "{e}");
    }
}
