//! Tells a CPython binary's exact version from what the file holds.
//!
//! Two sources, both read from the file: `Py_Version` (3.11 on), a `uint32_t` in `.rodata` whose
//! initial value is `PY_VERSION_HEX`, which decides where it exists; before 3.11 the
//! `PY_VERSION` string (`"3.9.18"`) that `Py_GetVersion` formats `sys.version` from. The linker
//! may merge that string into the tail of a longer one (`"/root/.pyenv/versions/3.9.18"`), so a
//! candidate is any NUL-terminated string's tail
//! `M.N.P[aN|bN|rcN][+]` not preceded by a digit or a dot. Other libraries linked in bring their
//! own version strings (`"3.2.0"`), so candidates are narrowed by what the symbols prove:
//! `_PyRuntime` means 3.7 on, `PyUnicode_AsUTF8` Python 3. The file name decides only between
//! candidates the file itself offers.

use std::{fmt, fs::File};

use super::super::{elf::ElfFacts, Limits};

/// A CPython version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

impl Version {
    pub const fn new(major: u8, minor: u8, micro: u8) -> Self {
        Self {
            major,
            minor,
            micro,
        }
    }

    /// From `PY_VERSION_HEX` (`0xMMmmpp` followed by the release level and serial).
    pub fn from_hex(hex: u32) -> Self {
        Self::new((hex >> 24) as u8, (hex >> 16) as u8, (hex >> 8) as u8)
    }
}

/// The version of the CPython `facts` describe, or why it cannot be told.
pub(super) fn detect(
    file: &File,
    facts: &ElfFacts,
    name_hint: &str,
    limits: &Limits,
) -> Result<Version, String> {
    if let Some(symbol) = facts.symbol("Py_Version") {
        // Typed data with the exact version: it decides, and .rodata is not scanned (most of
        // the time recognition takes).
        let bytes = facts
            .read_vaddr(file, symbol.value, 4, limits)
            .map_err(|e| format!("Py_Version: {e}"))?;
        let word: [u8; 4] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| "Py_Version: short read".to_owned())?;
        let hex = Version::from_hex(u32::from_le_bytes(word));
        if hex.major != 3 || hex.minor < 11 {
            return Err(format!(
                "Py_Version says {hex}, a version without Py_Version"
            ));
        }
        return Ok(hex);
    }
    let rodata = facts
        .read_rodata(file, limits)
        .map_err(|e| format!("no version string to read: {e}"))?;
    let python3 = facts.symbol("PyUnicode_AsUTF8").is_some();
    let runtime = facts.symbol("_PyRuntime").is_some();
    // The release lines the symbols allow (Py_Version, from 3.11, is absent here).
    let allowed = |v: &Version| match (python3, runtime) {
        (false, _) => v.major == 2 && v.minor == 7,
        (true, true) => v.major == 3 && (7..=10).contains(&v.minor),
        (true, false) => v.major == 3 && v.minor <= 6,
    };
    let mut fitting: Vec<Version> = candidates(&rodata).into_iter().filter(allowed).collect();
    fitting.sort();
    fitting.dedup();
    match fitting.as_slice() {
        [one] => Ok(*one),
        [] => Err("no version string of the release lines its symbols allow".to_owned()),
        several => {
            let hinted: Vec<&Version> = several
                .iter()
                .filter(|v| name_claims(name_hint, v))
                .collect();
            match hinted.as_slice() {
                [one] => Ok(**one),
                _ => Err(format!(
                    "several version strings ({}) and the file name {name_hint:?} does not pick one",
                    list(several)
                )),
            }
        }
    }
}

fn list(versions: &[Version]) -> String {
    versions
        .iter()
        .map(Version::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether the file name (`python3.9`, `libpython3.9.so.1.0`, `libpython3.6m.so`) names the
/// release line of `v`.
fn name_claims(name: &str, v: &Version) -> bool {
    let line = format!("python{}.{}", v.major, v.minor);
    name.match_indices(&line).any(|(at, _)| {
        // "python3.1" must not claim "python3.11".
        !name[at + line.len()..].starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Every version-like tail of a NUL-terminated string in `rodata`.
fn candidates(rodata: &[u8]) -> Vec<Version> {
    rodata
        .split(|&b| b == 0)
        .filter_map(|s| {
            // A version string is short; a longer tail cannot be one.
            let start = s.len().saturating_sub(16);
            tail_version(&s[start..], start == 0)
        })
        .collect()
}

/// Parses `M.N.P` with an optional `aN`, `bN`, `rcN` and `+` at the end of `s`, preceded by
/// neither a digit nor a dot (the start of the string, when `whole`, counts as a boundary).
fn tail_version(s: &[u8], whole: bool) -> Option<Version> {
    let mut end = s.len();
    if s.last() == Some(&b'+') {
        end -= 1;
    }
    // Release level and serial: digits preceded by `a`, `b` or `rc`.
    let serial_start = s[..end]
        .iter()
        .rposition(|b| !b.is_ascii_digit())
        .map_or(0, |p| p + 1);
    if serial_start < end && serial_start > 0 {
        let before = &s[..serial_start];
        let level = if before.ends_with(b"rc") {
            2
        } else if before.ends_with(b"a") || before.ends_with(b"b") {
            1
        } else {
            0
        };
        if level > 0 {
            end = serial_start - level;
        }
    }
    let body = &s[..end];
    let mut parts = [0u8; 3];
    let mut rest = body;
    for i in (0..3).rev() {
        let digits_start = rest
            .iter()
            .rposition(|b| !b.is_ascii_digit())
            .map_or(0, |p| p + 1);
        let digits = &rest[digits_start..];
        if digits.is_empty() || digits.len() > 2 {
            return None;
        }
        parts[i] = std::str::from_utf8(digits).ok()?.parse().ok()?;
        rest = &rest[..digits_start];
        if i > 0 {
            rest = rest.strip_suffix(b".")?;
        }
    }
    let boundary = match rest.last() {
        None => whole,
        Some(b) => !b.is_ascii_digit() && *b != b'.',
    };
    (boundary && (2..=3).contains(&parts[0])).then(|| Version::new(parts[0], parts[1], parts[2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_tails_are_read_with_their_boundaries() {
        let v = |s: &str| tail_version(s.as_bytes(), true);
        assert_eq!(v("3.9.18"), Some(Version::new(3, 9, 18)));
        assert_eq!(
            v("/root/.pyenv/versions/3.9.18"),
            Some(Version::new(3, 9, 18))
        );
        assert_eq!(v("3.11.2+"), Some(Version::new(3, 11, 2)));
        assert_eq!(v("3.14.0rc3"), Some(Version::new(3, 14, 0)));
        assert_eq!(v("3.13.0b1"), Some(Version::new(3, 13, 0)));
        assert_eq!(v("13.9.18"), None, "a digit before is another number");
        assert_eq!(v("1.3.9.18"), None, "a dot before is a longer version");
        assert_eq!(v("5.9.18"), None, "not Python's major");
        assert_eq!(v("3.9"), None);
        assert_eq!(v("3.9.180"), None);
        assert_eq!(v(""), None);
        assert_eq!(v("+"), None);
        assert_eq!(v("rc"), None);
        // A tail cut from a longer string has no boundary at its start.
        assert_eq!(tail_version(b"3.9.18", false), None);
    }

    #[test]
    fn the_file_name_claims_only_its_own_release_line() {
        let v = Version::new(3, 1, 0);
        assert!(!name_claims("libpython3.11.so.1.0", &v));
        assert!(name_claims("libpython3.1.so", &v));
        assert!(name_claims("libpython3.6m.so.1.0", &Version::new(3, 6, 15)));
        assert!(!name_claims("python3", &Version::new(3, 6, 15)));
    }
}
