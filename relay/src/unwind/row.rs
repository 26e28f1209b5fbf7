//! One unwind row and its fixed-width encoding: the unit the eBPF unwinder will binary-search.
//!
//! A row says how to unwind every address from its `pc` up to the next row's `pc`. The encoding
//! is 12 bytes, little-endian, 4-byte aligned, so a table is a plain array a BPF map can hold and
//! a bounded loop can bisect:
//!
//! | bytes  | field  | meaning                                                                     |
//! |--------|--------|-----------------------------------------------------------------------------|
//! | 0..4   | pc     | u32: first address of the row, as an offset from the table's base address |
//! | 4..8   | a      | i32: see `kind`                                                             |
//! | 8..10  | b      | i16: see `kind`                                                             |
//! | 10     | kind   | u8: 0 gap, 1 CFA = rsp + a, 2 CFA = rbp + a, 3 PLT, 4 signal frame, 5 stop |
//! | 11     | flags  | u8: bit 0 = rbp was saved at CFA + b (kinds 1 and 2); other bits zero       |
//!
//! - kinds 1, 2 (a frame): the return address is at CFA - 8 and the caller's rsp is the CFA
//!   (x86-64 `call` semantics; a row whose CFI says otherwise is a stop row instead). Without
//!   flag bit 0, rbp is unchanged in the caller.
//! - kind 3 (a PLT stub, the one expression every x86-64 linker emits for `.plt`):
//!   CFA = rsp + a + 8 if (rip & 15) >= b, else rsp + a. Return address at CFA - 8, rbp unchanged.
//! - kind 4 (the signal trampoline, `__restore_rt`): the kernel's `ucontext` is at rsp; the
//!   interrupted rsp is stored at rsp + a, its rip at rsp + a + 8, its rbp at rsp + b.
//! - kind 5 (stop): `a` is a [`StopReason`] code; the unwinder ends the stack here and counts why.
//! - kind 0 (gap): no CFI covers these addresses; the unwinder may fall back to frame pointers.
//!
//! Decoding is strict: every field that a kind does not use must be zero, so a table has exactly
//! one encoding and the sampler can refuse anything else. The bytes and the canonical rule are
//! [`ember_protocol::unwind_table`]'s, the one copy both sides use; this module gives them
//! their meaning.

use std::fmt;

pub use ember_protocol::unwind_table::ROW_BYTES;
use ember_protocol::unwind_table::{
    RawRow, FLAG_RBP_AT_CFA, KIND_CFA_RBP, KIND_CFA_RSP, KIND_GAP, KIND_PLT, KIND_SIGNAL, KIND_STOP,
};

/// Why the unwinder must stop at a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum StopReason {
    /// The CFI marks the return address undefined: the outermost frame (`_start`, thread start).
    Outermost = 1,
    /// The CFA is computed from a register other than rsp or rbp.
    CfaRegister = 2,
    /// The CFA is a DWARF expression other than the PLT and signal-frame ones.
    CfaExpression = 3,
    /// An offset does not fit the row's field (CFA offset in i32, rbp offset in i16).
    OffsetRange = 4,
    /// The return address is not at CFA - 8.
    ReturnAddressRule = 5,
    /// rbp is restored by a rule the unwinder has no kind for (register, expression, ...).
    RbpRule = 6,
    /// The FDE's instructions could not be evaluated (malformed CFI).
    Malformed = 7,
    /// The FDE was over the per-FDE instruction budget and was not evaluated.
    Budget = 8,
}

impl StopReason {
    /// Every reason, in code order.
    pub const ALL: [Self; 8] = [
        Self::Outermost,
        Self::CfaRegister,
        Self::CfaExpression,
        Self::OffsetRange,
        Self::ReturnAddressRule,
        Self::RbpRule,
        Self::Malformed,
        Self::Budget,
    ];

    /// The code stored in a stop row.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The reason for `code`, if it is one.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.code() == code)
    }

    /// A short stable name for logs and figures.
    pub fn name(self) -> &'static str {
        match self {
            Self::Outermost => "outermost",
            Self::CfaRegister => "cfa_register",
            Self::CfaExpression => "cfa_expression",
            Self::OffsetRange => "offset_range",
            Self::ReturnAddressRule => "return_address_rule",
            Self::RbpRule => "rbp_rule",
            Self::Malformed => "malformed",
            Self::Budget => "budget",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the CFA of a frame row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cfa {
    /// CFA = rsp + offset.
    Rsp(i32),
    /// CFA = rbp + offset.
    Rbp(i32),
}

/// How to restore the caller's rbp in a frame row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rbp {
    /// The caller's rbp is the current rbp.
    Unchanged,
    /// The caller's rbp was saved at CFA + offset.
    AtCfa(i16),
}

/// How to unwind the addresses of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// No CFI here: fall back to frame pointers.
    Gap,
    /// An ordinary frame: the return address is at CFA - 8.
    Frame { cfa: Cfa, rbp: Rbp },
    /// A PLT stub: CFA = rsp + `rsp_offset` (+ 8 when `(rip & 15) >= threshold`).
    Plt { rsp_offset: i32, threshold: i16 },
    /// The signal trampoline: the interrupted rsp is at rsp + `rsp_at`, its rip right after it,
    /// its rbp at rsp + `rbp_at`.
    Signal { rsp_at: i32, rbp_at: i16 },
    /// Stop unwinding, for this reason.
    Stop(StopReason),
}

impl Rule {}

/// One decoded row: `rule` holds from `pc` (an offset from the table base) to the next row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub pc: u32,
    pub rule: Rule,
}

/// A row whose bytes are not a canonical encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad unwind row: {0}")]
pub struct BadRow(&'static str);

impl Row {
    /// The 12-byte encoding documented at the top of this module.
    pub fn encode(&self) -> [u8; ROW_BYTES] {
        let (a, b, kind, flags): (i32, i16, u8, u8) = match self.rule {
            Rule::Gap => (0, 0, KIND_GAP, 0),
            Rule::Frame { cfa, rbp } => {
                let (a, kind) = match cfa {
                    Cfa::Rsp(off) => (off, KIND_CFA_RSP),
                    Cfa::Rbp(off) => (off, KIND_CFA_RBP),
                };
                match rbp {
                    Rbp::Unchanged => (a, 0, kind, 0),
                    Rbp::AtCfa(off) => (a, off, kind, FLAG_RBP_AT_CFA),
                }
            }
            Rule::Plt {
                rsp_offset,
                threshold,
            } => (rsp_offset, threshold, KIND_PLT, 0),
            Rule::Signal { rsp_at, rbp_at } => (rsp_at, rbp_at, KIND_SIGNAL, 0),
            // Codes are 1..=8: the cast cannot wrap.
            Rule::Stop(reason) => (reason.code() as i32, 0, KIND_STOP, 0),
        };
        RawRow {
            pc: self.pc,
            a,
            b,
            kind,
            flags,
        }
        .to_bytes()
    }

    /// Decodes one row, refusing any non-canonical encoding (tables decode theirs through
    /// `ember_protocol::unwind_table::check`, then [`Row::from_raw`]).
    #[cfg(test)]
    pub fn decode(bytes: &[u8; ROW_BYTES]) -> Result<Self, BadRow> {
        Self::from_raw(RawRow::from_bytes(bytes))
    }

    /// The meaning of one row's fields, refusing any non-canonical encoding.
    pub fn from_raw(raw: RawRow) -> Result<Self, BadRow> {
        if !raw.is_canonical() {
            return Err(BadRow("not the canonical encoding of its kind"));
        }
        let RawRow {
            pc,
            a,
            b,
            kind,
            flags,
        } = raw;
        let rbp = if flags & FLAG_RBP_AT_CFA != 0 {
            Rbp::AtCfa(b)
        } else {
            Rbp::Unchanged
        };
        let rule = match kind {
            KIND_GAP => Rule::Gap,
            KIND_CFA_RSP => Rule::Frame {
                cfa: Cfa::Rsp(a),
                rbp,
            },
            KIND_CFA_RBP => Rule::Frame {
                cfa: Cfa::Rbp(a),
                rbp,
            },
            KIND_PLT => Rule::Plt {
                rsp_offset: a,
                threshold: b,
            },
            KIND_SIGNAL => Rule::Signal {
                rsp_at: a,
                rbp_at: b,
            },
            _ => {
                // A canonical stop row's code is one of STOP_CODES.
                let code = u32::try_from(a).map_err(|_| BadRow("negative stop reason"))?;
                Rule::Stop(StopReason::from_code(code).ok_or(BadRow("unknown stop reason"))?)
            }
        };
        Ok(Self { pc, rule })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<Rule> {
        let mut rules = vec![
            Rule::Gap,
            Rule::Frame {
                cfa: Cfa::Rsp(8),
                rbp: Rbp::Unchanged,
            },
            Rule::Frame {
                cfa: Cfa::Rbp(16),
                rbp: Rbp::AtCfa(-16),
            },
            Rule::Frame {
                cfa: Cfa::Rsp(i32::MAX),
                rbp: Rbp::AtCfa(i16::MIN),
            },
            Rule::Plt {
                rsp_offset: 8,
                threshold: 11,
            },
            Rule::Signal {
                rsp_at: 160,
                rbp_at: 120,
            },
        ];
        rules.extend(StopReason::ALL.map(Rule::Stop));
        rules
    }

    #[test]
    fn every_rule_round_trips_through_twelve_bytes() {
        for (i, rule) in every_kind().into_iter().enumerate() {
            let row = Row {
                pc: 0x1000 + i as u32,
                rule,
            };
            assert_eq!(Row::decode(&row.encode()), Ok(row), "{rule:?}");
        }
    }

    #[test]
    fn non_canonical_bytes_are_refused() {
        // Given: a valid frame row.
        let good = Row {
            pc: 4,
            rule: Rule::Frame {
                cfa: Cfa::Rsp(8),
                rbp: Rbp::Unchanged,
            },
        }
        .encode();
        // When/Then: each corruption of an unused field or the kind is refused.
        let mut b_without_flag = good;
        b_without_flag[8] = 1;
        assert!(Row::decode(&b_without_flag).is_err());
        let mut unknown_flag = good;
        unknown_flag[11] = 2;
        assert!(Row::decode(&unknown_flag).is_err());
        let mut unknown_kind = good;
        unknown_kind[10] = 6;
        assert!(Row::decode(&unknown_kind).is_err());
        let mut gap_with_offset = good;
        gap_with_offset[10] = KIND_GAP;
        assert!(Row::decode(&gap_with_offset).is_err());
        let mut stop_bad_code = good;
        stop_bad_code[10] = KIND_STOP;
        stop_bad_code[4..8].copy_from_slice(&99i32.to_le_bytes());
        assert!(Row::decode(&stop_bad_code).is_err());
        stop_bad_code[4..8].copy_from_slice(&(-1i32).to_le_bytes());
        assert!(Row::decode(&stop_bad_code).is_err());
    }

    #[test]
    fn the_stop_codes_are_those_the_sampler_accepts() {
        let codes: Vec<i32> = StopReason::ALL
            .iter()
            .map(|r| i32::try_from(r.code()).expect("small"))
            .collect();
        let accepted: Vec<i32> = ember_protocol::unwind_table::STOP_CODES.collect();
        assert_eq!(codes, accepted);
    }

    #[test]
    fn stop_codes_are_stable() {
        // The codes are an ABI with the eBPF side: changing one breaks cached tables.
        let codes: Vec<u32> = StopReason::ALL.iter().map(|r| r.code()).collect();
        assert_eq!(codes, vec![1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
