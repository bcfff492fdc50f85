//! Human-friendly units used in the config: durations ("250ms", "2s", "1m") and sizes ("64KiB").

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A duration written as "500ms", "2s", "1m", "1h" (or an integer number of seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    pub const fn from_secs(s: u64) -> Self {
        Self(std::time::Duration::from_secs(s))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Self(std::time::Duration::from_millis(ms))
    }
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
    /// Parse "500ms", "2s", "1.5s", "1m", "1h", "100us".
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("expected a duration like \"500ms\" or \"2s\", found {text:?}"))?;
        let secs = match unit.trim() {
            "" | "s" => value,
            "ms" => value / 1e3,
            "us" | "µs" => value / 1e6,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            other => {
                return Err(format!(
                    "unknown duration unit {other:?} in {text:?} (use us, ms, s, m or h)"
                ))
            }
        };
        if !secs.is_finite() || secs < 0.0 || secs > 1e9 {
            return Err(format!("duration {text:?} is out of range"));
        }
        Ok(Self(std::time::Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms % 1000 == 0 {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
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
                u64::try_from(v)
                    .map(Duration::from_secs)
                    .map_err(|_| E::custom("a duration cannot be negative"))
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
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: u64 = num
            .parse()
            .map_err(|_| format!("expected a size like \"64KiB\" or 1024, found {text:?}"))?;
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
