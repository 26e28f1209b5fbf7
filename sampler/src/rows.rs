//! The unwinder's row array (`UNWIND_ROWS`, created `BPF_F_MMAPABLE`) mapped into the sampler's
//! memory, so a checked table's rows are stored with plain memory writes.
//!
//! Why: one `bpf(BPF_MAP_UPDATE_ELEM)` per row cost about 5 µs here, so a large library's table
//! (a million rows and more) held the single-threaded drain loop for seconds, and meanwhile it
//! read no first-sample events: short-lived processes exited before their facts were read and
//! their samples lost their names (`tests/tests/shortlived.rs` with `--unwind dwarf`).
//!
//! The kernel lays the array out as `entries` slots of the row size rounded up to 8 bytes, from
//! offset 0 of the mapping. The mapping is made once, at load, and kept for the sampler's life.

use std::{
    os::fd::{AsRawFd as _, BorrowedFd},
    ptr::NonNull,
};

use ember_sampler_ebpf::UnwindRow;

/// Bytes between two rows in the kernel's array (its value size rounded up to 8).
const STRIDE: usize = size_of::<UnwindRow>().next_multiple_of(8);

/// The row array, mapped read-write and shared with the kernel.
pub struct MappedRows {
    base: NonNull<u8>,
    entries: u32,
    bytes: usize,
}

impl MappedRows {
    /// Maps the array map behind `fd`, which holds `entries` rows.
    pub fn map(fd: BorrowedFd<'_>, entries: u32) -> std::io::Result<Self> {
        // SAFETY: sysconf has no memory effects.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let bytes = (entries as usize)
            .checked_mul(STRIDE)
            .map(|b| b.next_multiple_of(page.max(1)))
            .ok_or_else(|| std::io::Error::other("row array size overflows"))?;
        // SAFETY: a new shared mapping of a BPF array map; nothing else is mapped at the address
        // the kernel picks, and the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null address"))?;
        Ok(Self {
            base,
            entries,
            bytes,
        })
    }

    /// Stores `rows` at indices `first..`; refused (nothing written) beyond the array.
    pub fn write(&mut self, first: u32, rows: &[UnwindRow]) -> Result<(), String> {
        let end = (first as usize).checked_add(rows.len());
        if end.is_none_or(|end| end > self.entries as usize) {
            return Err(format!(
                "rows {first}..+{} beyond the row array ({} rows)",
                rows.len(),
                self.entries
            ));
        }
        for (index, row) in (first as usize..).zip(rows) {
            // SAFETY: index < entries, so the slot's STRIDE >= size_of::<UnwindRow>() bytes are
            // inside the mapping (entries * STRIDE <= bytes). The program reads no slot of a
            // range being written: a table's entry is removed before its rows are reused and
            // set after they are written (`unwind.rs`).
            unsafe {
                self.base
                    .as_ptr()
                    .add(index * STRIDE)
                    .cast::<UnwindRow>()
                    .write_unaligned(*row);
            }
        }
        Ok(())
    }
}

impl Drop for MappedRows {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference into it outlives self.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
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

    #[test]
    fn rows_written_through_the_mapping_are_what_the_map_holds() {
        // Creating a BPF map needs root; under CI this must not be skipped.
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "this test creates a BPF map and needs root"
            );
            eprintln!("SKIPPED: creating a BPF map needs root");
            return;
        }
        // Given a mappable array of 1000 rows (several pages), mapped.
        let map = mappable_array(1000);
        let Map::Array(data) = &map else {
            unreachable!("made as an array")
        };
        let mut mapped = MappedRows::map(data.fd().as_fd(), 1000).expect("mapping the array");
        // When rows are written at 3.. and at the last slot.
        let rows: Vec<UnwindRow> = (0..600).map(|i| row(i * 4)).collect();
        mapped.write(3, &rows).expect("in range");
        mapped.write(999, &[row(77)]).expect("the last slot");
        // Then the kernel's map holds them at those indices, and nothing else is written.
        let array: Array<&MapData, UnwindRow> = Array::try_from(&map).expect("an array");
        for (index, want) in (3..).zip(&rows) {
            assert_eq!(array.get(&index, 0).expect("read back"), *want);
        }
        assert_eq!(array.get(&999, 0).expect("read back"), row(77));
        assert_eq!(array.get(&2, 0).expect("read back"), UnwindRow::default());
        assert_eq!(array.get(&603, 0).expect("read back"), UnwindRow::default());
        assert!(mapped.write(999, &[row(1), row(2)]).is_err());
        assert!(mapped.write(u32::MAX, &[row(1)]).is_err());
    }
}
