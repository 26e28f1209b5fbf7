//! Go's own symbol table, `.gopclntab` ("pc-line table"), parsed from its bytes: function names,
//! source files and lines, the functions the compiler inlined at a pc (the inline tree), and each
//! pc's stack-pointer delta (the `pcsp` table the unwind compiler turns into rows). Every Go
//! binary carries it, since the Go runtime itself needs it for tracebacks and garbage
//! collection, so it is there when the binary is stripped (`-ldflags='-s -w'`: no symbol table,
//! no DWARF) and names what blazesym cannot.
//!
//! Layouts read: Go 1.16-1.17 (header magic `0xfffffffa`), 1.18-1.19 (`0xfffffff0`) and 1.20 on
//! (`0xfffffff1`), 64-bit little-endian only. Go 1.2-1.15 (`0xfffffffb`) is refused.
//!
//! Invariant: the bytes are hostile. Every read goes through [`Bytes`], which answers `None`
//! past the end, so a lie in an offset or count never panics; nothing is allocated by a size
//! the table claims (names and files are borrowed from the bytes, cut at [`MAX_NAME`]); every
//! loop is bounded by the bytes it consumes or by a fixed count ([`MAX_INLINE_DEPTH`],
//! [`MAX_PCVALUE_STEPS`]).

use std::ops::Range;

/// Header magics.
const MAGIC_116: u32 = 0xffff_fffa;
const MAGIC_118: u32 = 0xffff_fff0;
const MAGIC_120: u32 = 0xffff_fff1;
/// Go 1.2 to 1.15: not read.
const MAGIC_12: u32 = 0xffff_fffb;

/// `PCDATA_InlTreeIndex` and `FUNCDATA_InlTree` (runtime/symtab.go, internal/abi).
const PCDATA_INL_TREE_INDEX: u32 = 2;
const FUNCDATA_INL_TREE: u32 = 3;
/// `_func.flag` bits (1.17 on): the outermost frame of a stack, and a function that writes the
/// stack pointer (a stack switch): the Go runtime's own traceback stops at both.
pub const FLAG_TOPFRAME: u8 = 1;
pub const FLAG_SPWRITE: u8 = 2;

/// Longest name or file path read; longer ones are cut.
pub const MAX_NAME: usize = 4096;
/// Most inlined frames listed at one pc (real ones rarely pass 10).
pub const MAX_INLINE_DEPTH: usize = 32;
/// Most entries decoded from one pc-value table for one lookup (and never more than the
/// function has bytes, plus 2: every real entry advances the pc), so a lookup costs at most a
/// few milliseconds whatever a hostile table says.
const MAX_PCVALUE_STEPS: usize = 1 << 16;
/// Most functions a table may claim (the `go` tool has about 20,000; Kubernetes' binaries 100,000).
const MAX_FUNCS: u64 = 1 << 22;

/// Which layout a table has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    /// Go 1.16 and 1.17.
    Go116,
    /// Go 1.18 and 1.19.
    Go118,
    /// Go 1.20 and later.
    Go120,
}

impl Version {
    pub fn name(self) -> &'static str {
        match self {
            Self::Go116 => "1.16",
            Self::Go118 => "1.18",
            Self::Go120 => "1.20+",
        }
    }

    /// Offset of `gofunc` (the base of funcdata offsets) in the runtime's `moduledata`, for
    /// finding it in a binary (`gofile`); 1.16 stores funcdata as absolute pointers.
    pub fn moduledata_gofunc_offset(self) -> Option<usize> {
        match self {
            Self::Go116 => None,
            Self::Go118 => Some(304),
            // 1.20 added `covctrs, ecovctrs` before `end`.
            Self::Go120 => Some(320),
        }
    }
}

/// Why bytes are not a table this module reads.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    #[error("no Go pclntab header (magic {0:#010x})")]
    Magic(u32),
    #[error("a Go 1.2-1.15 pclntab, which is not read")]
    TooOld,
    #[error("not a 64-bit little-endian pclntab")]
    Layout,
    #[error("the header's {0} is out of range")]
    Header(&'static str),
}

/// Bounds-checked little-endian reads from a byte slice.
#[derive(Clone, Copy)]
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn slice(self, at: usize, len: usize) -> Option<&'a [u8]> {
        self.0.get(at..at.checked_add(len)?)
    }

    fn u8(self, at: usize) -> Option<u8> {
        self.0.get(at).copied()
    }

    fn u32(self, at: usize) -> Option<u32> {
        Some(u32::from_le_bytes(self.slice(at, 4)?.try_into().ok()?))
    }

    fn u64(self, at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(self.slice(at, 8)?.try_into().ok()?))
    }

    /// The NUL-terminated string at `at`, cut at [`MAX_NAME`] bytes.
    fn cstr(self, at: usize) -> Option<&'a [u8]> {
        let rest = self.0.get(at..)?;
        let rest = &rest[..rest.len().min(MAX_NAME)];
        Some(match rest.iter().position(|&b| b == 0) {
            Some(end) => &rest[..end],
            None => rest,
        })
    }

    /// A little-endian base-128 u32 at `*at`, advancing it; `None` past the end or over 5 bytes.
    fn uvarint(self, at: &mut usize) -> Option<u32> {
        let mut value: u32 = 0;
        for shift in (0..35).step_by(7) {
            let byte = self.u8(*at)?;
            *at += 1;
            if shift == 28 && byte > 0x0f {
                // More than 32 bits.
                return None;
            }
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
}

/// A parsed table header over the table's bytes; lookups read the bytes as they go.
#[derive(Clone, Debug)]
pub struct Table {
    data: Vec<u8>,
    pub version: Version,
    /// The address function entries are offsets from (1.18 on).
    pub text_start: u64,
    min_lc: u32,
    nfunc: usize,
    funcname: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    pcln: usize,
}

/// One function of the table.
#[derive(Clone, Copy, Debug)]
pub struct Func {
    /// Offset of its `_func` record in the table's bytes.
    at: usize,
    /// Its code: from its entry to the next function's entry.
    pub entry: u64,
    pub end: u64,
}

/// One named frame at a pc: the innermost inlined call first, the function itself last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoFrame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub inlined: bool,
}

/// Where the funcdata the table points at (the inline trees) can be read: the bytes of the
/// binary at [`FuncData::vaddr`] on (1.18 on: from the runtime's `gofunc`).
#[derive(Clone, Debug, Default)]
pub struct FuncData {
    pub vaddr: u64,
    pub bytes: Vec<u8>,
}

/// Whether `bytes` start with a header this module reads (a cheap test for scanning).
pub fn looks_like_header(bytes: &[u8]) -> bool {
    let b = Bytes(bytes);
    matches!(b.u32(0), Some(MAGIC_116 | MAGIC_118 | MAGIC_120))
        && b.u8(4) == Some(0)
        && b.u8(5) == Some(0)
        && matches!(b.u8(6), Some(1 | 2 | 4))
        && b.u8(7) == Some(8)
}

impl Table {
    /// Parses the header of the table in `data` (the table's bytes from its first byte to at
    /// least its end). `text_hint` is the start of the binary's text: the entry base of 1.18 on
    /// when the header's own is not in the file (a position-independent binary's is relocated
    /// at load time).
    pub fn parse(data: Vec<u8>, text_hint: u64) -> Result<Self, Error> {
        let b = Bytes(&data);
        let magic = b.u32(0).ok_or(Error::Magic(0))?;
        let version = match magic {
            MAGIC_116 => Version::Go116,
            MAGIC_118 => Version::Go118,
            MAGIC_120 => Version::Go120,
            MAGIC_12 => return Err(Error::TooOld),
            other => return Err(Error::Magic(other)),
        };
        if !looks_like_header(&data) {
            return Err(Error::Layout);
        }
        let word = |i: usize| b.u64(8 + 8 * i).ok_or(Error::Header("size"));
        let nfunc = word(0)?;
        if nfunc == 0 || nfunc > MAX_FUNCS {
            return Err(Error::Header("function count"));
        }
        let (text_start, rest) = match version {
            Version::Go116 => (0, 2),
            Version::Go118 | Version::Go120 => (word(2)?, 3),
        };
        let offset = |i: usize, what: &'static str| -> Result<usize, Error> {
            let at = word(rest + i)?;
            usize::try_from(at)
                .ok()
                .filter(|&at| at < data.len())
                .ok_or(Error::Header(what))
        };
        let table = Self {
            version,
            text_start: if text_start == 0 {
                text_hint
            } else {
                text_start
            },
            min_lc: u32::from(b.u8(6).unwrap_or(1)),
            nfunc: usize::try_from(nfunc).map_err(|_| Error::Header("function count"))?,
            funcname: offset(0, "funcname offset")?,
            cutab: offset(1, "cu offset")?,
            filetab: offset(2, "filetab offset")?,
            pctab: offset(3, "pctab offset")?,
            pcln: offset(4, "functab offset")?,
            data,
        };
        // The function index must be there whole: nfunc + 1 entries.
        let entries = table.nfunc.checked_add(1).ok_or(Error::Header("functab"))?;
        let bytes = entries
            .checked_mul(table.functab_entry_size())
            .ok_or(Error::Header("functab"))?;
        if table
            .pcln
            .checked_add(bytes)
            .is_none_or(|end| end > table.data.len())
        {
            return Err(Error::Header("functab size"));
        }
        Ok(table)
    }

    /// Offset of the function name table from the table's start (what the runtime's
    /// `moduledata.funcnametab` points at).
    pub fn funcname_offset(&self) -> usize {
        self.funcname
    }

    fn bytes(&self) -> Bytes<'_> {
        Bytes(&self.data)
    }

    /// Size of the table's bytes.
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }

    pub fn func_count(&self) -> usize {
        self.nfunc
    }

    fn functab_entry_size(&self) -> usize {
        match self.version {
            Version::Go116 => 16,
            Version::Go118 | Version::Go120 => 8,
        }
    }

    /// The entry address of function index `i` (`i == nfunc`: the end of the last function).
    fn entry_of(&self, i: usize) -> Option<u64> {
        let at = self
            .pcln
            .checked_add(i.checked_mul(self.functab_entry_size())?)?;
        match self.version {
            Version::Go116 => self.bytes().u64(at),
            _ => self
                .text_start
                .checked_add(u64::from(self.bytes().u32(at)?)),
        }
    }

    /// Function index `i`, if its record is inside the table.
    pub fn func(&self, i: usize) -> Option<Func> {
        if i >= self.nfunc {
            return None;
        }
        let size = self.functab_entry_size();
        let at = self.pcln.checked_add(i.checked_mul(size)?)?;
        let funcoff = match self.version {
            Version::Go116 => usize::try_from(self.bytes().u64(at + 8)?).ok()?,
            _ => self.bytes().u32(at + 4)? as usize,
        };
        let record = self.pcln.checked_add(funcoff)?;
        // The record's fixed part must be inside the table.
        self.bytes().slice(record, self.func_header_size())?;
        let (entry, end) = (self.entry_of(i)?, self.entry_of(i + 1)?);
        (entry < end).then_some(Func {
            at: record,
            entry,
            end,
        })
    }

    /// The function whose code holds `pc`.
    pub fn find(&self, pc: u64) -> Option<Func> {
        // The last entry whose start is <= pc (entries are sorted; a table that is not only
        // finds the wrong function, never reads out of bounds).
        let (mut lo, mut hi) = (0usize, self.nfunc);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.entry_of(mid)? <= pc {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let func = self.func(lo.checked_sub(1)?)?;
        (func.entry..func.end).contains(&pc).then_some(func)
    }

    fn func_header_size(&self) -> usize {
        match self.version {
            Version::Go116 | Version::Go120 => 44,
            Version::Go118 => 40,
        }
    }

    /// The u32 field `index` of a record (after the entry), laid out alike in every version:
    /// 0 nameOff, 1 args, 2 deferreturn, 3 pcsp, 4 pcfile, 5 pcln, 6 npcdata, 7 cuOffset.
    fn field(&self, func: &Func, index: usize) -> Option<u32> {
        let first = match self.version {
            Version::Go116 => 8,
            _ => 4,
        };
        self.bytes().u32(func.at + first + 4 * index)
    }

    /// The function's name, as Go writes it (`main.main`, `net/http.(*Server).Serve`).
    pub fn name(&self, func: &Func) -> Option<&str> {
        let off = self.field(func, 0)? as usize;
        self.name_at(off)
    }

    fn name_at(&self, off: usize) -> Option<&str> {
        let bytes = self.bytes().cstr(self.funcname.checked_add(off)?)?;
        std::str::from_utf8(bytes).ok().filter(|s| !s.is_empty())
    }

    /// The record's `flag` byte (1.17 on; padding, so 0, in 1.16).
    pub fn flag(&self, func: &Func) -> u8 {
        let at = match self.version {
            Version::Go118 => 37,
            Version::Go116 | Version::Go120 => 41,
        };
        self.bytes().u8(func.at + at).unwrap_or(0)
    }

    /// The table's bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    fn nfuncdata(&self, func: &Func) -> u8 {
        self.bytes()
            .u8(func.at + self.func_header_size() - 1)
            .unwrap_or(0)
    }

    /// Decodes the pc-value table at `offset` of `pctab` for `func`, calling `each(start, end,
    /// value)` for each run of pcs; stops early when `each` returns false. Bounded by the table's
    /// bytes, by the function's size and by [`MAX_PCVALUE_STEPS`]; returns the entries decoded.
    fn pcvalue_runs(
        &self,
        func: &Func,
        offset: u32,
        mut each: impl FnMut(u64, u64, i32) -> bool,
    ) -> usize {
        if offset == 0 {
            return 0;
        }
        let Some(mut at) = self.pctab.checked_add(offset as usize) else {
            return 0;
        };
        let b = self.bytes();
        let (mut pc, mut value) = (func.entry, -1i32);
        let size = usize::try_from(func.end - func.entry).unwrap_or(usize::MAX);
        let steps = MAX_PCVALUE_STEPS.min(size.saturating_add(2));
        for step in 0..steps {
            let Some(delta) = b.uvarint(&mut at) else {
                return step;
            };
            if delta == 0 && step > 0 {
                return step;
            }
            // Zig-zag: the low bit is the sign.
            let delta = if delta & 1 != 0 {
                !(delta >> 1) as i32
            } else {
                (delta >> 1) as i32
            };
            value = value.wrapping_add(delta);
            let Some(pc_delta) = b.uvarint(&mut at) else {
                return step;
            };
            let next =
                pc.saturating_add(u64::from(pc_delta).saturating_mul(u64::from(self.min_lc)));
            if next > pc && !each(pc, next.min(func.end), value) {
                return step + 1;
            }
            pc = next;
            if pc >= func.end {
                return step + 1;
            }
        }
        steps
    }

    /// The value of the pc-value table at `offset` at `pc`.
    fn pcvalue(&self, func: &Func, offset: u32, pc: u64) -> Option<i32> {
        let mut found = None;
        self.pcvalue_runs(func, offset, |start, end, value| {
            if (start..end).contains(&pc) {
                found = Some(value);
                false
            } else {
                start <= pc
            }
        });
        found
    }

    /// The stack-pointer delta of `func` (bytes below the CFA - 8, the return address) over its
    /// code, as runs `(start..end, delta)`, in order; returns the entries decoded (the work).
    pub fn sp_runs(&self, func: &Func, mut each: impl FnMut(Range<u64>, i32)) -> usize {
        let Some(pcsp) = self.field(func, 3) else {
            return 0;
        };
        self.pcvalue_runs(func, pcsp, |start, end, value| {
            each(start..end, value);
            true
        })
    }

    /// The source file and line of `pc` in `func` (for a pc in inlined code, the inlined
    /// function's).
    fn position(&self, func: &Func, pc: u64) -> (Option<&str>, Option<u32>) {
        let line = self
            .field(func, 5)
            .and_then(|t| self.pcvalue(func, t, pc))
            .and_then(|l| u32::try_from(l).ok())
            .filter(|&l| l > 0);
        let file = self
            .field(func, 4)
            .and_then(|t| self.pcvalue(func, t, pc))
            .and_then(|index| self.file_name(func, index));
        (file, line)
    }

    fn file_name(&self, func: &Func, index: i32) -> Option<&str> {
        let index = usize::try_from(index).ok()?;
        let cu = self.field(func, 7)? as usize;
        let slot = self
            .cutab
            .checked_add(cu.checked_add(index)?.checked_mul(4)?)?;
        let off = self.bytes().u32(slot)?;
        if off == u32::MAX {
            return None;
        }
        let bytes = self.bytes().cstr(self.filetab.checked_add(off as usize)?)?;
        std::str::from_utf8(bytes).ok().filter(|s| !s.is_empty())
    }

    /// The `i`th pcdata table offset of `func`.
    fn pcdata(&self, func: &Func, i: u32) -> Option<u32> {
        let n = self.field(func, 6)?;
        if i >= n {
            return None;
        }
        self.bytes()
            .u32(func.at + self.func_header_size() + 4 * i as usize)
    }

    /// Where `func`'s inline tree is, as an offset into `funcdata` (1.18 on).
    fn inline_tree(&self, func: &Func) -> Option<usize> {
        if self.version == Version::Go116 || FUNCDATA_INL_TREE >= u32::from(self.nfuncdata(func)) {
            return None;
        }
        let npcdata = self.field(func, 6)? as usize;
        let slot = func.at + self.func_header_size() + 4 * (npcdata + FUNCDATA_INL_TREE as usize);
        let off = self.bytes().u32(slot)?;
        if off == u32::MAX {
            return None;
        }
        // `off` is from gofunc, which is where `FuncData::bytes` start.
        Some(off as usize)
    }

    /// The frames at `pc`: the functions inlined there, innermost first, then `func` itself,
    /// each with its file and line. `funcdata` gives the inline trees (none: one frame).
    pub fn frames(&self, func: &Func, pc: u64, funcdata: Option<&FuncData>) -> Vec<GoFrame> {
        let mut out = Vec::new();
        let mut at = pc;
        if let Some((fd, tree)) = funcdata.and_then(|fd| Some((fd, self.inline_tree(func)?))) {
            let index_table = self.pcdata(func, PCDATA_INL_TREE_INDEX);
            for _ in 0..MAX_INLINE_DEPTH {
                let Some(index) = index_table.and_then(|t| self.pcvalue(func, t, at)) else {
                    break;
                };
                let Ok(index) = usize::try_from(index) else {
                    break;
                };
                let Some(call) = self.inlined_call(fd, tree, index) else {
                    break;
                };
                let (file, line) = self.position(func, at);
                out.push(GoFrame {
                    function: self.name_at(call.name_off).unwrap_or("?").to_owned(),
                    file: file.map(str::to_owned),
                    line,
                    inlined: true,
                });
                // The call site: an instruction of the caller whose position is the call.
                match func.entry.checked_add(call.parent_pc) {
                    Some(parent) if parent < func.end && parent != at => at = parent,
                    _ => break,
                }
            }
        }
        let (file, line) = self.position(func, at);
        out.push(GoFrame {
            function: self.name(func).unwrap_or("?").to_owned(),
            file: file.map(str::to_owned),
            line,
            inlined: false,
        });
        out
    }

    /// Entry `index` of the inline tree at `tree` in `funcdata`.
    fn inlined_call(&self, funcdata: &FuncData, tree: usize, index: usize) -> Option<InlinedCall> {
        let b = Bytes(&funcdata.bytes);
        let (size, name_at, parent_pc_at) = match self.version {
            // parent i16, funcID u8, pad, file i32, line i32, func_ i32, parentPc i32
            Version::Go118 => (20, 12, 16),
            // funcID u8, pad [3], nameOff i32, parentPc i32, startLine i32
            Version::Go120 => (16, 4, 8),
            Version::Go116 => return None,
        };
        let at = tree.checked_add(index.checked_mul(size)?)?;
        let name_off = usize::try_from(b.u32(at + name_at)?).ok()?;
        let parent_pc = u64::from(b.u32(at + parent_pc_at)?);
        Some(InlinedCall {
            name_off,
            parent_pc,
        })
    }

    /// Every function in table order (bounded by the table's count).
    pub fn funcs(&self) -> impl Iterator<Item = Func> + '_ {
        (0..self.nfunc).filter_map(|i| self.func(i))
    }
}

struct InlinedCall {
    name_off: usize,
    parent_pc: u64,
}

/// A small Go 1.20 table made here: `main.a` (16 bytes, no frame, line 10) and `main.b` (16
/// bytes, a 24-byte frame from its 5th byte, line 11, `main.a` inlined in its first 8 bytes,
/// called from its 13th), at text 0x401000, with its inline tree at offset 268 of the same bytes.
/// The unit tests read it and the `go_pclntab` fuzz target's seed is it (behind an 8-byte pc).
#[cfg(test)]
pub(crate) fn synthetic() -> Vec<u8> {
    let mut t = vec![0u8; 284];
    let put32 =
        |t: &mut Vec<u8>, at: usize, v: u32| t[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 =
        |t: &mut Vec<u8>, at: usize, v: u64| t[at..at + 8].copy_from_slice(&v.to_le_bytes());
    t[..8].copy_from_slice(&[0xf1, 0xff, 0xff, 0xff, 0, 0, 1, 8]);
    for (i, word) in [2u64, 1, 0x40_1000, 72, 88, 92, 104, 128]
        .into_iter()
        .enumerate()
    {
        put64(&mut t, 8 + 8 * i, word);
    }
    t[72..86].copy_from_slice(b"main.a\0main.b\0");
    put32(&mut t, 88, 0);
    t[92..102].copy_from_slice(b"/src/a.go\0");
    // pctab: a's sp (1), file (4), line (7); b's sp (10), line (15), inline index (18).
    let pctab: [u8; 23] = [
        0, 2, 16, 0, 2, 16, 0, 22, 16, 0, 2, 4, 48, 12, 0, 24, 16, 0, 2, 8, 1, 8, 0,
    ];
    t[104..127].copy_from_slice(&pctab);
    // functab: (entry offset, record offset from 128).
    for (i, (entry, record)) in [(0u32, 24u32), (16, 68), (32, 0)].into_iter().enumerate() {
        put32(&mut t, 128 + 8 * i, entry);
        put32(&mut t, 132 + 8 * i, record);
    }
    // main.a at 152: name 0, pcsp 1, pcfile 4, pcln 7, no pcdata, no funcdata.
    for (field, value) in [(0, 0u32), (4, 0), (16, 1), (20, 4), (24, 7)] {
        put32(&mut t, 152 + field, value);
    }
    // main.b at 196: name 7, pcsp 10, pcfile 4, pcln 15, 3 pcdata (the inline index is the
    // third), 4 funcdata (the inline tree is the fourth, at 268).
    for (field, value) in [(0, 16u32), (4, 7), (16, 10), (20, 4), (24, 15), (28, 3)] {
        put32(&mut t, 196 + field, value);
    }
    t[196 + 43] = 4;
    put32(&mut t, 240 + 8, 18);
    for (i, value) in [u32::MAX, u32::MAX, u32::MAX, 268].into_iter().enumerate() {
        put32(&mut t, 252 + 4 * i, value);
    }
    // The inline tree: one call of main.a (name 0), from b's byte 12.
    put32(&mut t, 268 + 4, 0);
    put32(&mut t, 268 + 8, 12);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, line: u32, inlined: bool) -> GoFrame {
        GoFrame {
            function: function.to_owned(),
            file: Some("/src/a.go".to_owned()),
            line: Some(line),
            inlined,
        }
    }

    #[test]
    fn a_synthetic_table_reads_back() {
        // Given the table made by `synthetic`
        let bytes = synthetic();
        let funcdata = FuncData {
            vaddr: 0,
            bytes: bytes.clone(),
        };
        let table = Table::parse(bytes, 0).expect("parses");
        assert_eq!((table.version, table.func_count()), (Version::Go120, 2));
        // Then each pc is in its function, with its line, and b's first bytes in inlined a
        let a = table.find(0x40_1004).expect("main.a");
        assert_eq!(
            table.frames(&a, 0x40_1004, Some(&funcdata)),
            [frame("main.a", 10, false)]
        );
        let b = table.find(0x40_1014).expect("main.b");
        assert_eq!(
            table.frames(&b, 0x40_1014, Some(&funcdata)),
            [frame("main.a", 11, true), frame("main.b", 11, false)]
        );
        assert_eq!(
            table.frames(&b, 0x40_101c, Some(&funcdata)),
            [frame("main.b", 11, false)]
        );
        assert!(table.find(0x40_1020).is_none() && table.find(0x40_0fff).is_none());
        // And b's stack-pointer runs are its frame's
        let mut runs = Vec::new();
        table.sp_runs(&b, |run, delta| runs.push((run, delta)));
        assert_eq!(
            runs,
            [(0x40_1010..0x40_1014, 0), (0x40_1014..0x40_1020, 24)]
        );
    }

    #[test]
    fn the_fuzz_seed_is_the_synthetic_table() {
        let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds/go_pclntab/synthetic-1.20");
        let mut expected = 0x40_1014u64.to_le_bytes().to_vec();
        expected.extend(synthetic());
        if std::env::var_os("EMBER_WRITE_SEEDS").is_some() {
            std::fs::write(&seed, &expected).expect("write seed");
        }
        assert_eq!(
            std::fs::read(&seed).expect("the seed (EMBER_WRITE_SEEDS=1 writes it)"),
            expected,
            "fuzz/seeds/go_pclntab/synthetic-1.20 drifted from `synthetic` (EMBER_WRITE_SEEDS=1 \
             rewrites it)"
        );
    }

    #[test]
    fn every_cut_of_a_table_is_refused_or_read_within_bounds() {
        // Given the synthetic table cut at every length, and with every byte flipped
        let whole = synthetic();
        let mut inputs: Vec<Vec<u8>> = (0..whole.len()).map(|n| whole[..n].to_vec()).collect();
        for i in 0..whole.len() {
            let mut flipped = whole.clone();
            flipped[i] ^= 0xff;
            inputs.push(flipped);
        }
        // When each is parsed and looked up everywhere, Then nothing panics
        for bytes in inputs {
            let funcdata = FuncData {
                vaddr: 0,
                bytes: bytes.clone(),
            };
            let Ok(table) = Table::parse(bytes, 0x40_1000) else {
                continue;
            };
            for pc in 0x40_0ff0..0x40_1030 {
                if let Some(f) = table.find(pc) {
                    let _ = table.frames(&f, pc, Some(&funcdata));
                    table.sp_runs(&f, |_, _| {});
                }
            }
        }
    }

    #[test]
    fn varints_and_zigzag_decode_as_go_writes_them() {
        let b = Bytes(&[0x96, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        let mut at = 0;
        assert_eq!(b.uvarint(&mut at), Some(150));
        assert_eq!(at, 2);
        assert_eq!(b.uvarint(&mut at), Some(0));
        // Five bytes whose value does not fit in 32 bits: refused, not wrapped.
        let mut at = 3;
        assert_eq!(b.uvarint(&mut at), None);
        // Past the end.
        let mut at = 8;
        assert_eq!(b.uvarint(&mut at), None);
    }

    #[test]
    fn garbage_and_old_tables_are_refused() {
        assert_eq!(Table::parse(vec![], 0).err(), Some(Error::Magic(0)));
        let mut old = vec![0u8; 64];
        old[..4].copy_from_slice(&MAGIC_12.to_le_bytes());
        assert_eq!(Table::parse(old, 0).err(), Some(Error::TooOld));
        // A 1.20 header claiming more functions than its bytes hold.
        let mut lying = vec![0u8; 128];
        lying[..8].copy_from_slice(&[0xf1, 0xff, 0xff, 0xff, 0, 0, 1, 8]);
        lying[8..16].copy_from_slice(&1000u64.to_le_bytes());
        for (i, off) in [64u64, 64, 64, 64, 72].iter().enumerate() {
            let at = 32 + 8 * i;
            lying[at..at + 8].copy_from_slice(&off.to_le_bytes());
        }
        assert_eq!(
            Table::parse(lying, 0).err(),
            Some(Error::Header("functab size"))
        );
    }
}
