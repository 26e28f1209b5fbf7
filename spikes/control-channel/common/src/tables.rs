//! The sampler-side checker both servers call: tables arrive in chunks of 12-byte rows (the
//! format of relay/src/unwind/row.rs), are assembled in a bounded staging buffer, and are checked
//! whole (sizes, strictly increasing pc, canonical fields) before they are "loaded". Loading is a
//! stand-in for the BPF map update: the rows are counted and the staging memory freed, which is
//! what the real sampler's memory does once the kernel holds the rows.
use std::collections::HashMap;

/// Size of one encoded row.
pub const ROW_BYTES: usize = 12;
/// Rows per chunk: 48 KiB of rows, one datagram's worth.
pub const CHUNK_ROWS: usize = 4096;
/// Largest table accepted (rows): 16 MiB of rows.
pub const MAX_TABLE_ROWS: usize = 16 * 1024 * 1024 / ROW_BYTES;
/// Tables being assembled at once; a new one beyond this is refused.
pub const MAX_PENDING: usize = 2;

#[derive(Default)]
pub struct Tables {
    pending: HashMap<u64, Pending>,
    pub loaded: HashMap<u64, usize>,
    pub tables_loaded: u64,
    pub rows_loaded: u64,
    pub refused: u64,
    /// Microseconds of simulated load work per chunk (a slow BPF map update).
    pub delay_us: u64,
}

struct Pending {
    next_chunk: u32,
    chunks: u32,
    bytes: Vec<u8>,
}

impl Tables {
    pub fn new(delay_us: u64) -> Self {
        Self {
            delay_us,
            ..Self::default()
        }
    }

    /// Takes chunk `chunk` of `chunks` of table `file_id`. Chunks come in order; a table is loaded
    /// when its last chunk passed the whole-table check, never in part.
    pub fn load_chunk(
        &mut self,
        file_id: u64,
        chunk: u32,
        chunks: u32,
        rows: &[u8],
    ) -> Result<(), String> {
        let result = self.take(file_id, chunk, chunks, rows);
        if result.is_err() {
            self.pending.remove(&file_id);
            self.refused += 1;
        }
        result
    }

    fn take(&mut self, file_id: u64, chunk: u32, chunks: u32, rows: &[u8]) -> Result<(), String> {
        if self.delay_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(self.delay_us));
        }
        let max_chunks = MAX_TABLE_ROWS.div_ceil(CHUNK_ROWS) as u32;
        if chunks == 0 || chunks > max_chunks || chunk >= chunks {
            return Err(format!("chunk {chunk} of {chunks}: out of range"));
        }
        if rows.is_empty()
            || !rows.len().is_multiple_of(ROW_BYTES)
            || rows.len() > CHUNK_ROWS * ROW_BYTES
        {
            return Err(format!("chunk of {} bytes", rows.len()));
        }
        if chunk == 0 {
            if !self.pending.contains_key(&file_id) && self.pending.len() >= MAX_PENDING {
                return Err("too many tables being loaded".into());
            }
            self.pending.insert(
                file_id,
                Pending {
                    next_chunk: 0,
                    chunks,
                    bytes: Vec::new(),
                },
            );
        }
        let p = self.pending.get_mut(&file_id).ok_or("chunk of no table")?;
        if p.next_chunk != chunk || p.chunks != chunks {
            return Err(format!(
                "chunk {chunk} out of order (expected {})",
                p.next_chunk
            ));
        }
        p.bytes.extend_from_slice(rows);
        p.next_chunk += 1;
        if p.next_chunk < p.chunks {
            return Ok(());
        }
        let done = self.pending.remove(&file_id).ok_or("vanished")?;
        check(&done.bytes)?;
        let n = done.bytes.len() / ROW_BYTES;
        self.loaded.insert(file_id, n);
        self.tables_loaded += 1;
        self.rows_loaded += n as u64;
        Ok(())
    }

    pub fn drop_table(&mut self, file_id: u64) -> bool {
        self.pending.remove(&file_id);
        self.loaded.remove(&file_id).is_some()
    }

    /// The relay went away: tables it had not finished are dropped, never loaded in part.
    pub fn disconnected(&mut self) {
        self.refused += self.pending.len() as u64;
        self.pending.clear();
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending
            .values()
            .map(|p| p.bytes.capacity() as u64)
            .sum()
    }
}

/// The whole-table check: sorted, canonical rows (relay/src/unwind/row.rs decoding rules).
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let mut last: Option<u32> = None;
    for (i, row) in bytes.chunks_exact(ROW_BYTES).enumerate() {
        let pc = u32::from_le_bytes([row[0], row[1], row[2], row[3]]);
        let a = i32::from_le_bytes([row[4], row[5], row[6], row[7]]);
        let b = i16::from_le_bytes([row[8], row[9]]);
        let (kind, flags) = (row[10], row[11]);
        if last.is_some_and(|l| pc <= l) {
            return Err(format!("row {i}: pc not increasing"));
        }
        last = Some(pc);
        let ok = match kind {
            0 => a == 0 && b == 0 && flags == 0,
            1 | 2 => flags & !1 == 0 && (flags & 1 == 1 || b == 0),
            3 => flags == 0 && (0..16).contains(&b),
            4 => flags == 0,
            5 => (1..=8).contains(&a) && b == 0 && flags == 0,
            _ => false,
        };
        if !ok {
            return Err(format!("row {i}: not canonical (kind {kind})"));
        }
    }
    Ok(())
}

/// VmHWM of this process in KiB (0 if unknown).
pub fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A valid table of `rows` rows (kind 1, CFA = rsp + 8), for clients.
pub fn sample_table(rows: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * ROW_BYTES);
    for i in 0..rows {
        out.extend_from_slice(&((i as u32) * 4).to_le_bytes());
        out.extend_from_slice(&8i32.to_le_bytes());
        out.extend_from_slice(&0i16.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
    }
    out
}
