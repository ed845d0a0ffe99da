//! Semantic versions as Kubernetes parses and orders them (github.com/blang/semver/v4, strict
//! `Parse`), for attributes of type version and CEL's `semver()` library.
//!
//! Written here rather than taken from the `semver` crate because the two differ where it
//! matters for selectors: blang ignores build metadata when comparing (`1.0.0+a == 1.0.0+b`),
//! the crate orders by it.

use std::cmp::Ordering;
use std::fmt;

/// A pre-release identifier: numeric ones order numerically and before alphanumeric ones.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pre {
    Num(u64),
    Alpha(String),
}

/// A parsed semantic version.
#[derive(Clone, Debug)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pre: Vec<Pre>,
    build: Vec<String>,
}

fn only(s: &str, allowed: impl Fn(u8) -> bool) -> bool {
    s.bytes().all(allowed)
}
fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

fn number(s: &str, what: &str) -> Result<u64, String> {
    if !only(s, |c| c.is_ascii_digit()) {
        return Err(format!("Invalid character(s) found in {what} number {s:?}"));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(format!(
            "{what} number must not contain leading zeroes {s:?}"
        ));
    }
    s.parse::<u64>()
        .map_err(|e| format!("{what} number {s:?}: {e}"))
}

impl Version {
    /// Strict parse: `MAJOR.MINOR.PATCH[-PRE][+BUILD]`, no leading `v`, no leading zeros.
    pub fn parse(s: &str) -> Result<Version, String> {
        if s.is_empty() {
            return Err("Version string empty".into());
        }
        let mut parts = s.splitn(3, '.');
        let (Some(major), Some(minor), Some(rest)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err("No Major.Minor.Patch elements found".into());
        };
        let major = number(major, "Major")?;
        let minor = number(minor, "Minor")?;
        let mut patch = rest;
        let mut build = Vec::new();
        if let Some(i) = patch.find('+') {
            for b in patch[i + 1..].split('.') {
                if b.is_empty() {
                    return Err("Build meta data is empty".into());
                }
                if !only(b, alnum) {
                    return Err(format!(
                        "Invalid character(s) found in build meta data {b:?}"
                    ));
                }
                build.push(b.to_string());
            }
            patch = &patch[..i];
        }
        let mut pre = Vec::new();
        if let Some(i) = patch.find('-') {
            for p in patch[i + 1..].split('.') {
                if p.is_empty() {
                    return Err("Prerelease is empty".into());
                }
                if only(p, |c| c.is_ascii_digit()) {
                    if p.len() > 1 && p.starts_with('0') {
                        return Err(format!(
                            "Numeric PreRelease version must not contain leading zeroes {p:?}"
                        ));
                    }
                    pre.push(Pre::Num(p.parse().map_err(|e| format!("{p:?}: {e}"))?));
                } else if only(p, alnum) {
                    pre.push(Pre::Alpha(p.to_string()));
                } else {
                    return Err(format!("Invalid character(s) found in prerelease {p:?}"));
                }
            }
            patch = &patch[..i];
        }
        let patch = number(patch, "Patch")?;
        Ok(Version {
            major,
            minor,
            patch,
            pre,
            build,
        })
    }

    /// Kubernetes' lenient form (`semver(s, true)`): a leading `v` and leading zeros are
    /// dropped, missing minor/patch become 0.
    pub fn parse_normalized(s: &str) -> Result<Version, String> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts: Vec<String> = s.splitn(3, '.').map(str::to_string).collect();
        for p in parts.iter_mut() {
            if p.len() > 1 {
                let trimmed = p.trim_start_matches('0');
                *p = if trimmed.is_empty() || !trimmed.as_bytes()[0].is_ascii_digit() {
                    format!("0{trimmed}")
                } else {
                    trimmed.to_string()
                };
            }
        }
        if parts.len() < 3 {
            if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
                return Err("short version cannot contain PreRelease/Build meta data".into());
            }
            while parts.len() < 3 {
                parts.push("0".into());
            }
        }
        Version::parse(&parts.join("."))
    }

    /// Precedence as semver 2.0 defines it; build metadata is ignored.
    pub fn compare(&self, other: &Version) -> Ordering {
        let core =
            (self.major, self.minor, self.patch).cmp(&(other.major, other.minor, other.patch));
        if core != Ordering::Equal {
            return core;
        }
        match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            _ => {}
        }
        for (a, b) in self.pre.iter().zip(&other.pre) {
            let o = match (a, b) {
                (Pre::Num(x), Pre::Num(y)) => x.cmp(y),
                (Pre::Num(_), Pre::Alpha(_)) => Ordering::Less,
                (Pre::Alpha(_), Pre::Num(_)) => Ordering::Greater,
                (Pre::Alpha(x), Pre::Alpha(y)) => x.as_bytes().cmp(y.as_bytes()),
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        self.pre.len().cmp(&other.pre.len())
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.compare(other) == Ordering::Equal
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        for (i, p) in self.pre.iter().enumerate() {
            f.write_str(if i == 0 { "-" } else { "." })?;
            match p {
                Pre::Num(n) => write!(f, "{n}")?,
                Pre::Alpha(s) => f.write_str(s)?,
            }
        }
        for (i, b) in self.build.iter().enumerate() {
            f.write_str(if i == 0 { "+" } else { "." })?;
            f.write_str(b)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn precedence_follows_semver() {
        let ordered = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.1.0",
            "2.0.0",
        ];
        for w in ordered.windows(2) {
            assert_eq!(
                v(w[0]).compare(&v(w[1])),
                Ordering::Less,
                "{} < {}",
                w[0],
                w[1]
            );
        }
        assert_eq!(v("1.0.0+a"), v("1.0.0+b"));
    }

    #[test]
    fn strict_and_normalized_parsing() {
        for bad in [
            "",
            "1",
            "1.0",
            "v1.0.0",
            "01.0.0",
            "1.0.0-",
            "1.0.0-01",
            "1.0.0+",
            "1.0.0-a_b",
            "1.0.x",
        ] {
            assert!(Version::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(v("1.2.3-rc.1+build.5").to_string(), "1.2.3-rc.1+build.5");
        assert_eq!(
            Version::parse_normalized("v1.02").unwrap().to_string(),
            "1.2.0"
        );
        assert!(Version::parse_normalized("1.0-rc").is_err());
    }
}
