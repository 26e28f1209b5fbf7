//! Decodes a CPython `str` object from the raw bytes the kernel copied from its start (a code
//! object's name, qualified name or file name), with the version's [`Unicode`] offsets.
//!
//! The forms decoded (PEP 393): compact ASCII (the characters follow `PyASCIIObject`) and compact
//! non-ASCII of kind 1, 2 or 4 bytes per character (they follow `PyCompactUnicodeObject`, which
//! adds `utf8_length` and `utf8`, and to 3.11 `wstr_length`). Names and file names are always
//! compact; a legacy (non-compact) string, a not-ready one (to 3.11) or an unknown kind is
//! refused. The `state` bits, for builds with the GIL (the only ones with a layout): `interned`
//! 0-1, `kind` 2-4, `compact` 5, `ascii` 6, then `ready` 7 to 3.11 (gone in 3.12, whose bit 7 is
//! `statically_allocated`, as in 3.13 and 3.14).
//!
//! Invariants: the bytes are hostile (the sampled process may forge any of them). Nothing here
//! panics or allocates more than the copy allows; a copy shorter than the string is decoded as
//! far as it goes and marked truncated; garbage (a negative or absurd length, an unknown kind,
//! a non-ASCII byte in an ASCII string, a code point over U+10FFFF) is refused with its reason.

use super::{Unicode, Version};

/// Longest string accepted, in characters. Python itself allows names and file names of any
/// length (a program can `compile` a function with a 1 MiB name), and only the copy's first
/// bytes are decoded, so only a length no allocation could hold is taken for garbage.
pub const MAX_LENGTH: u64 = 1 << 40;

/// Appended to the text of a string the copy held only part of.
pub const TRUNCATED: char = '…';

/// A decoded string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// The characters the copy held.
    pub text: String,
    /// The string is longer than what the copy held.
    pub truncated: bool,
}

impl Decoded {
    /// The text as shown: the truncated ones end in [`TRUNCATED`].
    pub fn shown(&self) -> String {
        let mut text = self.text.clone();
        if self.truncated {
            text.push(TRUNCATED);
        }
        text
    }
}

/// Why a copy is not a string this module decodes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    #[error("{len} bytes copied, fewer than the string's {needed}-byte header")]
    Short { len: usize, needed: u64 },
    #[error("length {0} is negative or over {MAX_LENGTH} characters")]
    Length(i64),
    #[error("not a compact string (state {0:#x})")]
    NotCompact(u32),
    #[error("not ready (state {0:#x})")]
    NotReady(u32),
    #[error("unknown kind {kind} (state {state:#x})")]
    Kind { kind: u32, state: u32 },
    #[error("byte {0:#x} in a string marked ASCII")]
    NotAscii(u8),
    #[error("code point {0:#x} is over U+10FFFF")]
    CodePoint(u32),
}

/// Bytes `PyCompactUnicodeObject` adds to `PyASCIIObject`: `utf8_length`, `utf8`, and to 3.11
/// `wstr_length`.
fn compact_extra(version: Version) -> u64 {
    if (version.major, version.minor) <= (3, 11) {
        24
    } else {
        16
    }
}

/// Little-endian integer of `N` bytes at `at`, if the copy holds it.
fn word<const N: usize>(raw: &[u8], at: u64) -> Option<[u8; N]> {
    let at = usize::try_from(at).ok()?;
    raw.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// Decodes the `str` object whose first bytes are `raw`.
pub fn decode(raw: &[u8], unicode: &Unicode, version: Version) -> Result<Decoded, Refused> {
    let short = |needed: u64| Refused::Short {
        len: raw.len(),
        needed,
    };
    let length = word::<8>(raw, unicode.length)
        .map(i64::from_le_bytes)
        .ok_or_else(|| short(unicode.length.saturating_add(8)))?;
    let state = word::<4>(raw, unicode.state)
        .map(u32::from_le_bytes)
        .ok_or_else(|| short(unicode.state.saturating_add(4)))?;
    let chars = u64::try_from(length)
        .ok()
        .filter(|&n| n <= MAX_LENGTH)
        .ok_or(Refused::Length(length))?;
    let kind = (state >> 2) & 0b111;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    let ready = state & (1 << 7) != 0;
    if !compact {
        return Err(Refused::NotCompact(state));
    }
    if (version.major, version.minor) <= (3, 11) && !ready {
        return Err(Refused::NotReady(state));
    }
    let width: u64 = match kind {
        1 => 1,
        // ASCII is of kind 1 only.
        2 | 4 if !ascii => u64::from(kind),
        _ => return Err(Refused::Kind { kind, state }),
    };
    let start = if ascii {
        unicode.ascii_size
    } else {
        unicode.ascii_size.saturating_add(compact_extra(version))
    };
    let data = usize::try_from(start)
        .ok()
        .and_then(|s| raw.get(s..))
        .ok_or_else(|| short(start))?;
    let held = (data.len() as u64) / width;
    let count = chars.min(held);
    let truncated = chars > held;
    // `count` <= `data.len() / width`, so these bounds are inside `data`.
    let bytes = data
        .get(..usize::try_from(count * width).unwrap_or(usize::MAX))
        .ok_or_else(|| short(start))?;
    let mut text = String::with_capacity(bytes.len());
    match (width, ascii) {
        (1, true) => {
            for &b in bytes {
                if !b.is_ascii() {
                    return Err(Refused::NotAscii(b));
                }
                text.push(char::from(b));
            }
        }
        (1, false) => text.extend(bytes.iter().map(|&b| char::from(b))),
        (2, _) => {
            for pair in bytes.chunks_exact(2) {
                push_code_point(&mut text, u32::from(u16::from_le_bytes([pair[0], pair[1]])))?;
            }
        }
        _ => {
            for quad in bytes.chunks_exact(4) {
                push_code_point(
                    &mut text,
                    u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]),
                )?;
            }
        }
    }
    Ok(Decoded { text, truncated })
}

/// Appends code point `c`. A lone surrogate (valid in a Python `str`: a file name's undecodable
/// bytes, as `surrogateescape` keeps them) is shown as U+FFFD, as Python's `errors="replace"`
/// does; over U+10FFFF is garbage.
fn push_code_point(text: &mut String, c: u32) -> Result<(), Refused> {
    if c > 0x10_ffff {
        return Err(Refused::CodePoint(c));
    }
    text.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const V311: Version = Version::new(3, 11, 7);
    const V312: Version = Version::new(3, 12, 1);
    /// 3.6-3.11's offsets (`wstr` in `PyASCIIObject`).
    const OLD: Unicode = Unicode {
        length: 16,
        state: 32,
        ascii_size: 48,
    };
    /// 3.12 on.
    const NEW: Unicode = Unicode {
        length: 16,
        state: 32,
        ascii_size: 40,
    };

    /// A string object image: header of `unicode`'s shape, `state`, then `data` at `start`,
    /// cut to `copy` bytes.
    fn image(unicode: &Unicode, length: i64, state: u32, start: usize, data: &[u8]) -> Vec<u8> {
        let mut raw = vec![0xeeu8; start];
        raw[unicode.length as usize..][..8].copy_from_slice(&length.to_le_bytes());
        raw[unicode.state as usize..][..4].copy_from_slice(&state.to_le_bytes());
        raw.extend_from_slice(data);
        raw
    }

    /// `state` for `kind`, compact, ascii as given, ready (bit 7).
    fn state(kind: u32, ascii: bool) -> u32 {
        (kind << 2) | (1 << 5) | (u32::from(ascii) << 6) | (1 << 7)
    }

    #[test]
    fn compact_ascii_strings_decode_on_both_header_shapes() {
        for (unicode, version) in [(OLD, V311), (NEW, V312)] {
            let raw = image(
                &unicode,
                3,
                state(1, true),
                unicode.ascii_size as usize,
                b"hot\0",
            );
            let got = decode(&raw, &unicode, version).expect("decoded");
            assert_eq!(got.text, "hot");
            assert!(!got.truncated);
        }
    }

    #[test]
    fn compact_non_ascii_kinds_follow_the_compact_header_of_their_version() {
        // Given "café", "日本" and "𝔘x" in kinds 1, 2 and 4, after the compact header (72 bytes
        // to 3.11, 56 from 3.12)
        let latin: Vec<u8> = "café".chars().map(|c| c as u8).collect();
        let ucs2: Vec<u8> = "日本".encode_utf16().flat_map(u16::to_le_bytes).collect();
        let ucs4: Vec<u8> = "𝔘x"
            .chars()
            .flat_map(|c| (c as u32).to_le_bytes())
            .collect();
        for (unicode, version, start) in [(OLD, V311, 72), (NEW, V312, 56)] {
            for (kind, data, want) in [(1, &latin, "café"), (2, &ucs2, "日本"), (4, &ucs4, "𝔘x")]
            {
                let n = want.chars().count() as i64;
                let raw = image(&unicode, n, state(kind, false), start, data);
                let got = decode(&raw, &unicode, version).expect("decoded");
                assert_eq!(got.text, want, "kind {kind} on {version}");
            }
        }
    }

    #[test]
    fn a_copy_shorter_than_the_string_is_truncated_and_marked() {
        // Given a 300-character ASCII name of which a 192-byte copy holds 152 characters
        let name = "n".repeat(300);
        let mut raw = image(&NEW, 300, state(1, true), 40, name.as_bytes());
        raw.truncate(192);
        let got = decode(&raw, &NEW, V312).expect("decoded");
        assert_eq!(got.text.len(), 152);
        assert!(got.truncated);
        assert!(got.shown().ends_with("n…"));
        // And a 4-byte kind cut mid-character keeps only whole characters
        let mut raw = image(
            &NEW,
            3,
            state(4, false),
            56,
            &[0x41, 0, 0, 0, 0x42, 0, 0, 0],
        );
        raw.truncate(56 + 6);
        let got = decode(&raw, &NEW, V312).expect("decoded");
        assert_eq!((got.text.as_str(), got.truncated), ("A", true));
    }

    #[test]
    fn the_ready_bit_is_required_to_3_11_only() {
        let not_ready = state(1, true) & !(1 << 7);
        let raw = image(&OLD, 1, not_ready, 48, b"x");
        assert_eq!(decode(&raw, &OLD, V311), Err(Refused::NotReady(not_ready)));
        // From 3.12 bit 7 is `statically_allocated`: either value decodes
        let raw = image(&NEW, 1, not_ready, 40, b"x");
        assert_eq!(decode(&raw, &NEW, V312).expect("decoded").text, "x");
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let cases: Vec<(Vec<u8>, Refused)> = vec![
            (
                image(&NEW, -1, state(1, true), 40, b"x"),
                Refused::Length(-1),
            ),
            (
                image(&NEW, (1 << 40) + 1, state(1, true), 40, b"x"),
                Refused::Length((1 << 40) + 1),
            ),
            (
                image(&NEW, 1, state(1, true) & !(1 << 5), 40, b"x"),
                Refused::NotCompact(state(1, true) & !(1 << 5)),
            ),
            (
                image(&NEW, 1, state(3, false), 40, b"x"),
                Refused::Kind {
                    kind: 3,
                    state: state(3, false),
                },
            ),
            (
                image(&NEW, 1, state(2, true), 40, b"xx"),
                Refused::Kind {
                    kind: 2,
                    state: state(2, true),
                },
            ),
            (
                image(&NEW, 1, state(1, true), 40, &[0xc3]),
                Refused::NotAscii(0xc3),
            ),
            (
                image(&NEW, 1, state(4, false), 56, &0x11_0000u32.to_le_bytes()),
                Refused::CodePoint(0x11_0000),
            ),
            (
                vec![0; 20],
                Refused::Short {
                    len: 20,
                    needed: 24,
                },
            ),
            (
                image(&NEW, 1, state(2, false), 40, b""),
                Refused::Short {
                    len: 40,
                    needed: 56,
                },
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(decode(&raw, &NEW, V312), Err(want));
        }
    }

    #[test]
    fn a_lone_surrogate_is_shown_as_the_replacement_character() {
        let raw = image(&NEW, 2, state(2, false), 56, &[0x80, 0xdc, 0x61, 0]);
        assert_eq!(decode(&raw, &NEW, V312).expect("decoded").text, "\u{fffd}a");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // Every prefix of a few images, and pseudo-random bytes with offsets anywhere
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let len = (next() % 200) as usize;
            let raw: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let unicode = Unicode {
                length: next() % 64,
                state: next() % 64,
                ascii_size: next() % 256,
            };
            let _ = decode(&raw, &unicode, V311);
            let _ = decode(&raw, &unicode, V312);
        }
    }
}
