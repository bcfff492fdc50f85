//! Human-friendly units used in the config: durations ("250ms", "2s", "1m") and sizes ("64KiB").
//! Parsing, display (round-trips exactly) and serde for both.

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A duration written as "500ms", "2s", "1m", "1h" (or an integer number of seconds).
/// At most [`Duration::MAX_SECS`] seconds, so adding it to an `Instant` cannot overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    /// Largest accepted duration, in seconds (about 31 years).
    pub const MAX_SECS: u64 = 1_000_000_000;

    pub const fn from_secs(s: u64) -> Self {
        Self(std::time::Duration::from_secs(s))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Self(std::time::Duration::from_millis(ms))
    }
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
    /// Parse "500ms", "2s", "1.5s", "1m", "1h", "100us", "10ns"; no unit means seconds.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.starts_with('-') {
            return Err(format!("a duration cannot be negative, found {text:?}"));
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("expected a duration like \"500ms\" or \"2s\", found {text:?}"))?;
        let secs = match unit.trim() {
            "" | "s" => value,
            "ns" => value / 1e9,
            "ms" => value / 1e3,
            "us" | "µs" => value / 1e6,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            other => {
                return Err(format!(
                    "unknown duration unit {other:?} in {text:?} (use ns, us, ms, s, m or h)"
                ))
            }
        };
        if !secs.is_finite() || secs < 0.0 || secs > Self::MAX_SECS as f64 {
            return Err(format!(
                "duration {text:?} is out of range (at most {} seconds)",
                Self::MAX_SECS
            ));
        }
        Ok(Self(std::time::Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for Duration {
    /// The largest unit (s, ms, us, ns) that shows the value exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        match ns {
            n if n % 1_000_000_000 == 0 => write!(f, "{}s", n / 1_000_000_000),
            n if n % 1_000_000 == 0 => write!(f, "{}ms", n / 1_000_000),
            n if n % 1_000 == 0 => write!(f, "{}us", n / 1_000),
            n => write!(f, "{n}ns"),
        }
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration like \"500ms\", \"2s\" or \"1m\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                Duration::parse(v).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                match u64::try_from(v) {
                    Err(_) => Err(E::custom("a duration cannot be negative")),
                    Ok(s) if s > Duration::MAX_SECS => Err(E::custom(format!(
                        "duration {s} is out of range (at most {} seconds)",
                        Duration::MAX_SECS
                    ))),
                    Ok(s) => Ok(Duration::from_secs(s)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A size in bytes written as an integer or "64KiB", "1MiB", "10MB", "1GiB".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn get(self) -> u64 {
        self.0
    }
    /// Parse "1024", "64KiB", "10MB" (decimal) or "1GiB" (binary); no unit means bytes.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.starts_with('-') {
            return Err(format!("a size cannot be negative, found {text:?}"));
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: u64 = match num.parse() {
            Ok(v) => v,
            Err(_) if !num.is_empty() => return Err(format!("size {text:?} is too large")),
            Err(_) => {
                return Err(format!(
                    "expected a size like \"64KiB\" or 1024, found {text:?}"
                ))
            }
        };
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KB" | "kB" => 1000,
            "KiB" | "K" | "k" => 1024,
            "MB" => 1000 * 1000,
            "MiB" | "M" => 1024 * 1024,
            "GB" => 1000 * 1000 * 1000,
            "GiB" | "G" => 1024 * 1024 * 1024,
            other => {
                return Err(format!(
                    "unknown size unit {other:?} in {text:?} (use B, KiB, MiB, GiB, KB, MB or GB)"
                ))
            }
        };
        value
            .checked_mul(mult)
            .map(Self)
            .ok_or_else(|| format!("size {text:?} is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: u64 = 1024 * 1024;
        match self.0 {
            n if n >= MIB && n % MIB == 0 => write!(f, "{}MiB", n / MIB),
            n if n >= 1024 && n % 1024 == 0 => write!(f, "{}KiB", n / 1024),
            n => write!(f, "{n}"),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size like 1024, \"64KiB\" or \"10MiB\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration as Std;

    #[derive(Debug, Deserialize)]
    struct T {
        d: Option<Duration>,
        b: Option<ByteSize>,
    }

    fn de(text: &str) -> Result<T, String> {
        toml::from_str(text).map_err(|e| e.message().to_string())
    }

    #[test]
    fn duration_units() {
        let ok = |t: &str| Duration::parse(t).map(Duration::get);
        assert_eq!(ok("500ms"), Ok(Std::from_millis(500)));
        assert_eq!(ok("2s"), Ok(Std::from_secs(2)));
        assert_eq!(ok("2"), Ok(Std::from_secs(2)));
        assert_eq!(ok(" 1.5s "), Ok(Std::from_millis(1500)));
        assert_eq!(ok("1.1s"), Ok(Std::from_millis(1100)));
        assert_eq!(ok("1m"), Ok(Std::from_secs(60)));
        assert_eq!(ok("1h"), Ok(Std::from_secs(3600)));
        assert_eq!(ok("100us"), Ok(Std::from_micros(100)));
        assert_eq!(ok("100µs"), Ok(Std::from_micros(100)));
        assert_eq!(ok("7ns"), Ok(Std::from_nanos(7)));
        assert_eq!(ok("0"), Ok(Std::ZERO));
        assert_eq!(ok("1000000000s"), Ok(Std::from_secs(Duration::MAX_SECS)));
    }

    #[test]
    fn duration_rejects() {
        for (bad, why) in [
            ("", "expected a duration"),
            ("ms", "expected a duration"),
            ("-1s", "negative"),
            ("1.2.3s", "expected a duration"),
            ("5 fortnights", "unknown duration unit \"fortnights\""),
            ("1S", "unknown duration unit"),
            ("1e3s", "unknown duration unit"),
            ("1000000001s", "out of range"),
            ("99999999999999999999999h", "out of range"),
        ] {
            let e = Duration::parse(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn duration_serde() {
        assert_eq!(de("d = 3").map(|t| t.d), Ok(Some(Duration::from_secs(3))));
        assert_eq!(
            de("d = \"3ms\"").map(|t| t.d),
            Ok(Some(Duration::from_millis(3)))
        );
        assert!(de("d = -3").unwrap_err().contains("negative"));
        assert!(de("d = 1000000001").unwrap_err().contains("out of range"));
        assert!(de("d = 1.5").unwrap_err().contains("expected a duration"));
        assert!(de("d = true").unwrap_err().contains("expected a duration"));
    }

    #[test]
    fn duration_display_round_trips() {
        for (d, s) in [
            (Std::from_secs(30), "30s"),
            (Std::from_millis(1500), "1500ms"),
            (Std::from_micros(100), "100us"),
            (Std::from_nanos(7), "7ns"),
            (Std::ZERO, "0s"),
        ] {
            assert_eq!(Duration(d).to_string(), s);
            assert_eq!(Duration::parse(s), Ok(Duration(d)));
        }
    }

    #[test]
    fn size_units() {
        let ok = |t: &str| ByteSize::parse(t).map(ByteSize::get);
        assert_eq!(ok("1024"), Ok(1024));
        assert_eq!(ok("0"), Ok(0));
        assert_eq!(ok("10B"), Ok(10));
        assert_eq!(ok("64KiB"), Ok(65_536));
        assert_eq!(ok("64 KiB"), Ok(65_536));
        assert_eq!(ok("1k"), Ok(1024));
        assert_eq!(ok("2KB"), Ok(2000));
        assert_eq!(ok("1MiB"), Ok(1 << 20));
        assert_eq!(ok("1MB"), Ok(1_000_000));
        assert_eq!(ok("1GiB"), Ok(1 << 30));
        assert_eq!(ok("3GB"), Ok(3_000_000_000));
        assert_eq!(ok("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn size_rejects() {
        for (bad, why) in [
            ("", "expected a size"),
            ("KiB", "expected a size"),
            ("-1", "negative"),
            ("1.5MiB", "unknown size unit \".5MiB\""),
            ("1TiB", "unknown size unit"),
            ("1kib", "unknown size unit"),
            ("18446744073709551616", "too large"),
            ("17179869184GiB", "too large"),
        ] {
            let e = ByteSize::parse(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn size_serde_and_display() {
        assert_eq!(de("b = 7").map(|t| t.b), Ok(Some(ByteSize(7))));
        assert_eq!(de("b = \"2MiB\"").map(|t| t.b), Ok(Some(ByteSize(2 << 20))));
        assert!(de("b = -7").unwrap_err().contains("negative"));
        assert!(de("b = 1.5").unwrap_err().contains("expected a size"));
        for (n, s) in [(1 << 20, "1MiB"), (3072, "3KiB"), (1000, "1000"), (0, "0")] {
            assert_eq!(ByteSize(n).to_string(), s);
            assert_eq!(ByteSize::parse(s), Ok(ByteSize(n)));
        }
    }
}
