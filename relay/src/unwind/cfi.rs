//! CFI evaluation: every FDE of the section through gimli's unwind-table evaluator, each row
//! classified into a [`Rule`] the eBPF unwinder can follow, or a stop row with its reason.
//!
//! Invariant: the work is bounded before it is done. An FDE costs the bytes of its CIE and its
//! own entry (every CFI instruction is at least one byte, and the CIE's initial instructions run
//! again for every FDE); an FDE over `Limits::max_fde_bytes` (or whose CIE is over
//! `Limits::max_cie_bytes`) becomes one stop row ([`StopReason::Budget`]) without evaluation,
//! and so does every FDE once the work budget ([`Limits::work_budget`]) is spent; once
//! `Limits::max_rows` or `Limits::max_time` is spent the rest of the section is left out (gaps).
//! Either way the table is marked truncated. An FDE outside the executable range is skipped and counted.

use std::time::Instant;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, FrameDescriptionEntry,
    Reader, RegisterRule, UnwindContext, UnwindSection, UnwindTableRow, X86_64,
};

use super::{
    elf::{CfiSection, Input},
    row::{Cfa, Rbp, Rule, StopReason},
    Limits, Stats, Truncation,
};

type Slice<'a> = EndianSlice<'a, gimli::LittleEndian>;

/// A rule over `[start, end)`, in absolute (ELF virtual) addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: u64,
    pub end: u64,
    pub rule: Rule,
}

/// Evaluates the whole section of `input` into spans, in section order.
pub fn evaluate(input: &Input, limits: &Limits, stats: &mut Stats) -> Vec<Span> {
    let bases = BaseAddresses::default()
        .set_eh_frame(input.section_addr)
        .set_text(input.text_addr)
        .set_got(input.got_addr);
    match input.section {
        CfiSection::EhFrame => {
            let section = EhFrame::new(&input.data, gimli::LittleEndian);
            walk(&section, &bases, input, limits, stats)
        }
        CfiSection::DebugFrame => {
            let mut section = DebugFrame::new(&input.data, gimli::LittleEndian);
            section.set_address_size(8);
            walk(&section, &bases, input, limits, stats)
        }
        // A Go binary without CFI: its rows come from the Go table alone.
        CfiSection::GoPclntab => Vec::new(),
    }
}

fn walk<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    input: &Input,
    limits: &Limits,
    stats: &mut Stats,
) -> Vec<Span> {
    let mut spans = Vec::new();
    let mut ctx = UnwindContext::new();
    let started = Instant::now();
    let work_budget = limits.work_budget(input.data.len() as u64);
    let mut entries = section.entries(bases);
    loop {
        let partial = match entries.next() {
            Ok(Some(CieOrFde::Fde(partial))) => partial,
            Ok(Some(CieOrFde::Cie(_))) => continue,
            Ok(None) => break,
            Err(_) => {
                // The framing of the section itself is broken: nothing after it can be trusted.
                stats.truncated.get_or_insert(Truncation::MalformedSection);
                break;
            }
        };
        stats.fdes += 1;
        let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
            stats.fdes_malformed += 1;
            continue;
        };
        let (start, end) = (fde.initial_address(), fde.end_address());
        if start >= end {
            stats.fdes_empty += 1;
            continue;
        }
        if start < input.exec.start || end > input.exec.end {
            stats.fdes_out_of_range += 1;
            continue;
        }
        let cie_cost = fde.cie().entry_len() as u64;
        let cost = cie_cost.saturating_add(fde.entry_len() as u64);
        // Past the work budget, FDEs are still read (their headers cost no evaluation) so their
        // ranges become stop rows rather than gaps: the unwinder stops instead of guessing.
        let over_work = stats.work_bytes.saturating_add(cost) > work_budget;
        if over_work {
            stats.truncated.get_or_insert(Truncation::WorkBudget);
        }
        if spans.len() >= limits.max_rows {
            stats.truncated.get_or_insert(Truncation::RowBudget);
            break;
        }
        if started.elapsed() > limits.max_time {
            stats.truncated.get_or_insert(Truncation::TimeBudget);
            break;
        }
        if over_work || cost > limits.max_fde_bytes || cie_cost > limits.max_cie_bytes {
            stats.fdes_over_budget += 1;
            spans.push(Span {
                start,
                end,
                rule: Rule::Stop(StopReason::Budget),
            });
            continue;
        }
        stats.work_bytes += cost;
        let before = spans.len();
        fde_rows(section, bases, &mut ctx, &fde, limits, stats, &mut spans);
        if spans.len() == before {
            stats.fdes_empty += 1;
        }
    }
    spans
}

/// Evaluates one admitted FDE into `spans`. Rows evaluated before a bad instruction are kept;
/// the rest of the FDE becomes a stop row.
fn fde_rows<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    fde: &FrameDescriptionEntry<Slice<'a>>,
    limits: &Limits,
    stats: &mut Stats,
    spans: &mut Vec<Span>,
) {
    let (start, end) = (fde.initial_address(), fde.end_address());
    let signal = fde.is_signal_trampoline();
    let mut covered = start;
    let failed = match fde.rows(section, bases, ctx) {
        Ok(mut rows) => loop {
            match rows.next_row() {
                Ok(Some(row)) => {
                    if spans.len() >= limits.max_rows {
                        stats.truncated.get_or_insert(Truncation::RowBudget);
                        break false;
                    }
                    stats.cfi_rows += 1;
                    // gimli keeps rows inside the FDE; clamp anyway, the bounds are ours.
                    let (s, e) = (row.start_address().max(start), row.end_address().min(end));
                    if s < e {
                        let rule = classify(row, section, signal);
                        spans.push(Span {
                            start: s,
                            end: e,
                            rule,
                        });
                        covered = e;
                    }
                }
                Ok(None) => break false,
                Err(_) => break true,
            }
        },
        Err(_) => true,
    };
    if failed {
        stats.fdes_malformed += 1;
        if covered < end {
            spans.push(Span {
                start: covered,
                end,
                rule: Rule::Stop(StopReason::Malformed),
            });
        }
    }
}

/// The rule for one evaluated CFI row.
fn classify<'a, S: UnwindSection<Slice<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
    signal: bool,
) -> Rule {
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(offset) = i32::try_from(*offset) else {
                return Rule::Stop(StopReason::OffsetRange);
            };
            match *register {
                X86_64::RSP => Cfa::Rsp(offset),
                X86_64::RBP => Cfa::Rbp(offset),
                _ => return Rule::Stop(StopReason::CfaRegister),
            }
        }
        CfaRule::Expression(expr) => {
            let Ok(expr) = expr.get(section) else {
                return Rule::Stop(StopReason::Malformed);
            };
            let bytes = expr.0.slice();
            if signal {
                return signal_rule(row, section, bytes);
            }
            return match plt_expression(bytes) {
                Some((rsp_offset, threshold)) if ra_at_cfa_minus_8(row) => Rule::Plt {
                    rsp_offset,
                    threshold,
                },
                Some(_) => Rule::Stop(StopReason::ReturnAddressRule),
                None => Rule::Stop(StopReason::CfaExpression),
            };
        }
    };
    match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return Rule::Stop(StopReason::Outermost),
        _ => return Rule::Stop(StopReason::ReturnAddressRule),
    }
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue | RegisterRule::Undefined) => Rbp::Unchanged,
        Some(RegisterRule::Offset(off)) => match i16::try_from(off) {
            Ok(off) => Rbp::AtCfa(off),
            Err(_) => return Rule::Stop(StopReason::OffsetRange),
        },
        Some(_) => return Rule::Stop(StopReason::RbpRule),
    };
    Rule::Frame { cfa, rbp }
}

fn ra_at_cfa_minus_8(row: &UnwindTableRow<usize>) -> bool {
    matches!(row.register(X86_64::RA), Some(RegisterRule::Offset(-8)))
}

/// `DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_litK; DW_OP_ge;
/// DW_OP_lit3; DW_OP_shl; DW_OP_plus`: the CFA of a 16-byte PLT entry, which pushes one more
/// word from byte K on. Returns (N, K).
fn plt_expression(bytes: &[u8]) -> Option<(i32, i16)> {
    let mut r = Slice::new(bytes, gimli::LittleEndian);
    if r.read_u8().ok()? != gimli::constants::DW_OP_breg7.0 {
        return None;
    }
    let rsp_offset = i32::try_from(r.read_sleb128().ok()?).ok()?;
    if r.read_u8().ok()? != gimli::constants::DW_OP_breg16.0 || r.read_sleb128().ok()? != 0 {
        return None;
    }
    let lit0 = gimli::constants::DW_OP_lit0.0;
    let mut rest = [0u8; 7];
    for b in &mut rest {
        *b = r.read_u8().ok()?;
    }
    if !r.is_empty() {
        return None;
    }
    let threshold = rest[2].checked_sub(lit0).filter(|k| *k <= 15)?;
    let expected = [
        gimli::constants::DW_OP_lit15.0,
        gimli::constants::DW_OP_and.0,
        rest[2],
        gimli::constants::DW_OP_ge.0,
        gimli::constants::DW_OP_lit3.0,
        gimli::constants::DW_OP_shl.0,
        gimli::constants::DW_OP_plus.0,
    ];
    (rest == expected).then_some((rsp_offset, i16::from(threshold)))
}

/// `DW_OP_bregN off` alone: returns (N, off).
fn breg(bytes: &[u8]) -> Option<(u16, i64)> {
    let mut r = Slice::new(bytes, gimli::LittleEndian);
    let op = r.read_u8().ok()?;
    let reg = op.checked_sub(gimli::constants::DW_OP_breg0.0)?;
    if reg > 31 {
        return None;
    }
    let off = r.read_sleb128().ok()?;
    r.is_empty().then_some((u16::from(reg), off))
}

/// The signal trampoline (a CIE with the `S` augmentation): CFA = *(rsp + a) (`DW_OP_breg7 a;
/// DW_OP_deref`), rip saved at rsp + a + 8, rbp saved at rsp + b. Anything else stops.
fn signal_rule<'a, S: UnwindSection<Slice<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
    cfa_expr: &[u8],
) -> Rule {
    let Some(rsp_at) = cfa_expr
        .split_last()
        .filter(|(last, _)| **last == gimli::constants::DW_OP_deref.0)
        .and_then(|(_, head)| breg(head))
        .filter(|(reg, _)| *reg == X86_64::RSP.0)
        .map(|(_, off)| off)
    else {
        return Rule::Stop(StopReason::CfaExpression);
    };
    let saved_at = |reg| match row.register(reg) {
        Some(RegisterRule::Expression(e)) => e
            .get(section)
            .ok()
            .and_then(|e| breg(e.0.slice()))
            .filter(|(base, _)| *base == X86_64::RSP.0)
            .map(|(_, off)| off),
        _ => None,
    };
    let (Some(rip_at), Some(rbp_at)) = (saved_at(X86_64::RA), saved_at(X86_64::RBP)) else {
        return Rule::Stop(StopReason::ReturnAddressRule);
    };
    match (i32::try_from(rsp_at), i16::try_from(rbp_at)) {
        (Ok(rsp), Ok(rbp)) if Some(rip_at) == rsp_at.checked_add(8) => Rule::Signal {
            rsp_at: rsp,
            rbp_at: rbp,
        },
        (Ok(_), Ok(_)) => Rule::Stop(StopReason::ReturnAddressRule),
        _ => Rule::Stop(StopReason::OffsetRange),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linker_plt_expression_is_recognised() {
        // From `readelf --debug-dump=frames /bin/ls`: breg7 8; breg16 0; lit15; and; lit11; ge;
        // lit3; shl; plus.
        let bytes = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(plt_expression(&bytes), Some((8, 11)));
        // Any other expression is not a PLT.
        let mut other = bytes;
        other[5] = 0x1b; // div instead of and
        assert_eq!(plt_expression(&other), None);
        assert_eq!(plt_expression(&bytes[..10]), None);
        let mut longer = bytes.to_vec();
        longer.push(0x96);
        assert_eq!(plt_expression(&longer), None);
    }

    #[test]
    fn breg_reads_one_register_and_offset() {
        assert_eq!(breg(&[0x77, 0xa0, 0x01]), Some((7, 160)));
        assert_eq!(breg(&[0x77, 0xa0, 0x01, 0x06]), None);
        assert_eq!(breg(&[0x06]), None);
    }
}
