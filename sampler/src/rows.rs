//! The unwinder's row array (`UNWIND_ROWS`, created `BPF_F_MMAPABLE`), written through shared
//! mappings of it, so a checked table's rows are stored with plain memory writes.
//!
//! Why: one `bpf(BPF_MAP_UPDATE_ELEM)` per row cost about 5 µs here, so a large library's table
//! (a million rows and more) held the single-threaded drain loop for seconds, and meanwhile it
//! read no first-sample events: short-lived processes exited before their facts were read and
//! their samples lost their names (`tests/tests/shortlived.rs` with `--unwind dwarf`).
//!
//! The kernel lays the array out as `entries` slots of the row size rounded up to 8 bytes, from
//! offset 0 of the mapping. Each write maps only the pages it stores to, at most [`WINDOW_BYTES`]
//! at a time, and unmaps them at once: the kernel maps every page of a BPF array at `mmap` and
//! counts it in the process's RSS (file pages), so a mapping of the whole array kept for the
//! sampler's life made its RSS the size of the array (56 MiB of the default 64 MiB budget). The
//! rows stay in the kernel's array; only the sampler's view of them goes.

use std::{
    os::fd::{AsRawFd as _, BorrowedFd},
    ptr::NonNull,
};

use ember_sampler_ebpf::UnwindRow;

/// Bytes between two rows in the kernel's array (its value size rounded up to 8).
const STRIDE: usize = size_of::<UnwindRow>().next_multiple_of(8);

/// Most bytes of the array mapped at once: the most a table write adds to the sampler's RSS.
/// One `mmap` + `munmap` per MiB (256 pages) costs tens of µs; the 65,536 row updates it
/// replaces took 0.3 s.
const WINDOW_BYTES: usize = 1 << 20;

/// Writes rows into the row array through short-lived shared mappings.
pub struct MappedRows {
    entries: u32,
    page: usize,
}

impl MappedRows {
    /// For the array map behind `fd`, which holds `entries` rows; maps and unmaps its first
    /// page to check that the kernel lets it be mapped.
    pub fn map(fd: BorrowedFd<'_>, entries: u32) -> std::io::Result<Self> {
        // SAFETY: sysconf has no memory effects.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let rows = Self {
            entries,
            page: page.max(1),
        };
        Window::map(fd, 0, rows.page)?;
        Ok(rows)
    }

    /// Stores `rows` at indices `first..` of the array behind `fd`; refused (nothing written)
    /// beyond the array. A failed mapping may leave the rows before it written.
    pub fn write(&self, fd: BorrowedFd<'_>, first: u32, rows: &[UnwindRow]) -> Result<(), String> {
        let end = (first as usize).checked_add(rows.len());
        if end.is_none_or(|end| end > self.entries as usize) {
            return Err(format!(
                "rows {first}..+{} beyond the row array ({} rows)",
                rows.len(),
                self.entries
            ));
        }
        let mut index = first as usize;
        for part in rows.chunks(WINDOW_BYTES / STRIDE) {
            // The pages holding slots index..index + part.len(): whole pages, inside the
            // array's mapped size (entries * STRIDE rounded up to a page).
            let offset = index * STRIDE / self.page * self.page;
            let len = ((index + part.len()) * STRIDE - offset).next_multiple_of(self.page);
            let window = Window::map(fd, offset, len)
                .map_err(|err| format!("mapping the row array: {err}"))?;
            for (slot, row) in (index * STRIDE - offset..).step_by(STRIDE).zip(part) {
                // SAFETY: slot + STRIDE <= len, so the slot's STRIDE >= size_of::<UnwindRow>()
                // bytes are inside the window. The program reads no slot of a range being
                // written: a table's entry is removed before its rows are reused and set after
                // they are written (`unwind.rs`).
                unsafe {
                    window
                        .base
                        .as_ptr()
                        .add(slot)
                        .cast::<UnwindRow>()
                        .write_unaligned(*row);
                }
            }
            index += part.len();
        }
        Ok(())
    }
}

impl MappedRows {
    /// Reads `count` rows at indices `first..` of the array behind `fd` (to move a table when
    /// the free rows are compacted); refused beyond the array.
    pub fn read(
        &self,
        fd: BorrowedFd<'_>,
        first: u32,
        count: u32,
    ) -> Result<Vec<UnwindRow>, String> {
        let end = (first as usize).checked_add(count as usize);
        if end.is_none_or(|end| end > self.entries as usize) {
            return Err(format!(
                "rows {first}..+{count} beyond the row array ({} rows)",
                self.entries
            ));
        }
        let mut out = Vec::with_capacity(count as usize);
        let mut index = first as usize;
        let mut left = count as usize;
        while left > 0 {
            let part = left.min(WINDOW_BYTES / STRIDE);
            let offset = index * STRIDE / self.page * self.page;
            let len = ((index + part) * STRIDE - offset).next_multiple_of(self.page);
            let window = Window::map(fd, offset, len)
                .map_err(|err| format!("mapping the row array: {err}"))?;
            for slot in (index * STRIDE - offset..).step_by(STRIDE).take(part) {
                // SAFETY: slot + STRIDE <= len (as in `write`): the slot is inside the window.
                out.push(unsafe {
                    window
                        .base
                        .as_ptr()
                        .add(slot)
                        .cast::<UnwindRow>()
                        .read_unaligned()
                });
            }
            index += part;
            left -= part;
        }
        Ok(out)
    }
}

/// `len` bytes of the array from `offset` (both page multiples), mapped read-write and shared
/// with the kernel; unmapped when dropped.
struct Window {
    base: NonNull<u8>,
    len: usize,
}

impl Window {
    fn map(fd: BorrowedFd<'_>, offset: usize, len: usize) -> std::io::Result<Self> {
        let offset =
            libc::off_t::try_from(offset).map_err(|_| std::io::Error::other("offset overflows"))?;
        // SAFETY: a new shared mapping of a BPF array map; nothing else is mapped at the address
        // the kernel picks, and the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null address"))?;
        Ok(Self { base, len })
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference into it outlives self.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd as _, FromRawFd as _, OwnedFd};

    use aya::maps::{Array, Map, MapData};

    use super::*;

    fn row(pc: u32) -> UnwindRow {
        UnwindRow {
            pc,
            a: -8,
            b: -16,
            kind: 2,
            flags: 1,
        }
    }

    /// `BPF_F_MMAPABLE` (linux/bpf.h).
    const BPF_F_MMAPABLE: u32 = 1 << 10;

    /// A `BPF_F_MMAPABLE` array of `entries` rows, as the program's `UNWIND_ROWS` is created.
    fn mappable_array(entries: u32) -> Map {
        // bpf_attr for BPF_MAP_CREATE: map_type (ARRAY = 2), key_size, value_size,
        // max_entries, map_flags; the rest zero.
        let mut attr = [0u32; 32];
        attr[..5].copy_from_slice(&[2, 4, size_of::<UnwindRow>() as u32, entries, BPF_F_MMAPABLE]);
        // SAFETY: BPF_MAP_CREATE (0) reads `attr`, valid and zero-padded for the size given.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, 0, attr.as_ptr(), size_of_val(&attr)) };
        assert!(
            fd >= 0,
            "BPF_MAP_CREATE: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a descriptor the kernel just returned, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Map::Array(MapData::from_fd(fd).expect("the new map"))
    }

    /// This process's `RssFile` in KiB (file and shared pages mapped, BPF arrays included).
    fn rss_file_kib() -> u64 {
        let status = ember_common::ProcStatus::read_self();
        let field = status.field("RssFile");
        field
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("RssFile in /proc/self/status: {field:?}"))
    }

    /// Mappings of BPF maps in this process.
    fn bpf_map_mappings() -> usize {
        std::fs::read_to_string("/proc/self/maps")
            .expect("/proc/self/maps")
            .lines()
            .filter(|line| line.ends_with("anon_inode:bpf-map"))
            .count()
    }

    #[test]
    fn rows_written_through_the_mapping_are_what_the_map_holds_once_unmapped() {
        // Creating a BPF map needs root; under CI this must not be skipped.
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "this test creates a BPF map and needs root"
            );
            eprintln!("SKIPPED: creating a BPF map needs root");
            return;
        }
        // Given a mappable array of a million rows (16 MiB, 16 windows).
        const ENTRIES: u32 = 1 << 20;
        let map = mappable_array(ENTRIES);
        let Map::Array(data) = &map else {
            unreachable!("made as an array")
        };
        let fd = data.fd().as_fd();
        let mapped = MappedRows::map(fd, ENTRIES).expect("mapping the array");
        let (mappings, rss_kib) = (bpf_map_mappings(), rss_file_kib());
        // When rows are written at 3.., at the last slot, and a table of 900,000 rows that
        // starts mid-page and crosses windows.
        let rows: Vec<UnwindRow> = (0..600).map(|i| row(i * 4)).collect();
        mapped.write(fd, 3, &rows).expect("in range");
        mapped
            .write(fd, ENTRIES - 1, &[row(77)])
            .expect("the last slot");
        let big: Vec<UnwindRow> = (0..900_000).map(|i| row(i * 2 + 1)).collect();
        let big_first = 100_003;
        mapped.write(fd, big_first, &big).expect("in range");
        // Then nothing of the array stays mapped: no mapping of it is left, and the RSS grew
        // by far less than the 14 MiB written (it would hold them all if the pages stayed).
        assert_eq!(bpf_map_mappings(), mappings, "a window stayed mapped");
        let grown_kib = rss_file_kib().saturating_sub(rss_kib);
        assert!(grown_kib < 4096, "RssFile grew by {grown_kib} KiB");
        // And the kernel's map holds the rows at those indices, and nothing else is written.
        let array: Array<&MapData, UnwindRow> = Array::try_from(&map).expect("an array");
        for (index, want) in (3..).zip(&rows) {
            assert_eq!(array.get(&index, 0).expect("read back"), *want);
        }
        // And reading through the mapping gives them back, across windows too.
        assert_eq!(mapped.read(fd, 3, 600).expect("in range"), rows);
        assert_eq!(
            mapped.read(fd, big_first, 900_000).expect("in range"),
            big,
            "the big table read back"
        );
        assert!(mapped.read(fd, ENTRIES - 1, 2).is_err(), "beyond the array");
        assert_eq!(array.get(&(ENTRIES - 1), 0).expect("read back"), row(77));
        // Every 997th row of the big table, its ends, and the rows at each window boundary.
        let per_window = (WINDOW_BYTES / STRIDE) as u32;
        let boundaries = (1..14).flat_map(|w| [w * per_window - 1, w * per_window]);
        for i in (0..900_000).step_by(997).chain([899_999]).chain(boundaries) {
            let got = array.get(&(big_first + i), 0).expect("read back");
            assert_eq!(got, big[i as usize], "row {i} of the table");
        }
        for untouched in [2, 603, big_first - 1, big_first + 900_000] {
            assert_eq!(
                array.get(&untouched, 0).expect("read back"),
                UnwindRow::default()
            );
        }
        assert!(mapped.write(fd, ENTRIES - 1, &[row(1), row(2)]).is_err());
        assert!(mapped.write(fd, u32::MAX, &[row(1)]).is_err());
    }
}
