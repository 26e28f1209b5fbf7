//! The instruction a CPython frame is at, as a byte offset into its code object's instructions,
//! from the 8 raw bytes the kernel read at the layout's `frame.instruction` offset. The offset is
//! what CPython's own `frame.f_lasti` reports and what its line table is indexed by
//! (`PyCode_Addr2Line`).
//!
//! - 3.6 to 3.9: `f_lasti`, an `int`: the byte offset itself (-1 before the first instruction).
//! - 3.10: `f_lasti` counts 2-byte code units.
//! - 3.11, 3.12: `prev_instr`, a pointer to the last instruction started, inside the code
//!   object: the offset is `prev_instr - (code + co_code_adaptive)` (one code unit before the
//!   start when the frame has not started).
//! - 3.13 on: `instr_ptr`, the instruction executing or about to begin, the same way: CPython's
//!   `_PyInterpreterFrame_LASTI` is `instr_ptr - _PyCode_CODE(code)` there too.
//!
//! Invariants: the bytes and the code address are the process's (hostile): a negative, odd or
//! absurd offset is `None` (the frame is then shown at its first line), never a panic.

use super::{Layout, Version};

/// Largest offset accepted: a code object's instructions are far smaller (CPython limits a
/// jump to 2^31 code units, but no real function comes near 16 MiB of bytecode).
pub const MAX_OFFSET: u64 = 1 << 24;

/// The byte offset of the instruction a frame of `code` (its address, tag bits cleared) is at,
/// from the `raw` instruction field, if it is a plausible one.
pub fn offset(version: Version, layout: &Layout, code: u64, raw: u64) -> Option<u32> {
    let bytes = match (version.major, version.minor) {
        (3, ..=9) => u64::try_from(f_lasti(raw)).ok()?,
        (3, 10) => u64::try_from(f_lasti(raw)).ok()?.checked_mul(2)?,
        _ => {
            let start = code.checked_add(layout.code.code_adaptive?)?;
            raw.checked_sub(start)?
        }
    };
    (bytes < MAX_OFFSET && bytes % 2 == 0)
        .then(|| u32::try_from(bytes).ok())
        .flatten()
}

/// `f_lasti`: the `int` in the field's low 4 bytes (x86-64 is little-endian).
fn f_lasti(raw: u64) -> i32 {
    // Truncation intended: the other 4 bytes are whatever follows the field.
    i32::from_le_bytes((raw as u32).to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::{super::table, *};

    fn layout(version: Version) -> Layout {
        table::layout(version).expect("a table layout")
    }

    #[test]
    fn f_lasti_is_bytes_to_3_9_and_code_units_in_3_10() {
        let v39 = Version::new(3, 9, 18);
        let v310 = Version::new(3, 10, 13);
        // The high half of the 8 raw bytes is not the field's
        let raw = 0xdead_beef_0000_0000 | 24;
        assert_eq!(offset(v39, &layout(v39), 0x1000, raw), Some(24));
        assert_eq!(offset(v310, &layout(v310), 0x1000, raw), Some(48));
        // Not started yet (-1), and an odd byte offset: no instruction
        assert_eq!(offset(v39, &layout(v39), 0x1000, u64::from(u32::MAX)), None);
        assert_eq!(offset(v39, &layout(v39), 0x1000, 25), None);
        assert_eq!(offset(v310, &layout(v310), 0x1000, 0x7fff_ffff), None);
    }

    #[test]
    fn pointers_count_from_the_code_objects_instructions() {
        for (version, adaptive) in [(Version::new(3, 11, 7), 184), (Version::new(3, 12, 1), 192)] {
            let l = layout(version);
            let code = 0x7f00_0000_1000u64;
            assert_eq!(offset(version, &l, code, code + adaptive + 10), Some(10));
            assert_eq!(offset(version, &l, code, code + adaptive), Some(0));
            // One code unit before the start (a frame not started), below the code object,
            // and far past it: no instruction
            assert_eq!(offset(version, &l, code, code + adaptive - 2), None);
            assert_eq!(offset(version, &l, code, 0), None);
            assert_eq!(offset(version, &l, code, u64::MAX), None);
        }
        // A code address near the top cannot wrap
        let v = Version::new(3, 12, 1);
        assert_eq!(offset(v, &layout(v), u64::MAX - 8, 4), None);
    }

    #[test]
    fn a_layout_without_co_code_adaptive_names_no_instruction_from_3_11() {
        let v = Version::new(3, 13, 0);
        let mut l = layout(Version::new(3, 12, 1));
        l.code.code_adaptive = None;
        assert_eq!(offset(v, &l, 0x1000, 0x1100), None);
    }
}
