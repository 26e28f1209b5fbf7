//! The stack walker's reads of user memory, through a per-CPU window onto the stack.
//!
//! A walk reads one or two words per frame (the return address, a saved rbp), nearly all on
//! the interrupted thread's stack, each a little above the last. A `bpf_probe_read_user` call
//! costs far more than the bytes it copies (about 70 ns a call on the benchmark machine, most
//! of what a frame cost: bench/RESULTS.md), so on a miss the window copies, in one call, from
//! the word asked for up to the end of its page (at most [`WINDOW_BYTES`]), and the words
//! after it are read from the copy.
//!
//! The window never reaches past the page of the word asked for: a page is readable whole or
//! not at all, so the copy fails exactly when a read of the word alone would, and the window
//! never turns a good read into a failed one (nor takes a fault the word's read would not).
//! It is emptied at the start of each walk: it holds one thread's memory at one instant.

use aya_ebpf::helpers::{bpf_probe_read_user, generated};

/// Bytes the window holds at most: a page, the most one copy may take (see above).
pub const WINDOW_BYTES: u64 = 4096;
const WINDOW_WORDS: usize = (WINDOW_BYTES / 8) as usize;
const PAGE_BYTES: u64 = 4096;

/// A copy of `len` words of user memory from `base`, or nothing (`len` 0).
#[repr(C)]
pub struct StackWindow {
    /// User address of `words[0]` (8-byte aligned).
    base: u64,
    /// Words copied.
    len: u64,
    words: [u64; WINDOW_WORDS],
}

impl StackWindow {
    /// Forgets the copy (a new walk, another thread or instant).
    #[inline(always)]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The word of user memory at `addr`, or `None` when it cannot be read.
    #[inline(always)]
    pub fn read(&mut self, addr: u64) -> Option<u64> {
        let index = addr.wrapping_sub(self.base) >> 3;
        if addr & 7 == 0 && addr >= self.base && index < self.len {
            // `len` is at most WINDOW_WORDS, so the mask changes nothing; it is there for the
            // verifier, which does not see the bound LLVM derives from the comparison.
            return Some(self.words[index as usize & (WINDOW_WORDS - 1)]);
        }
        self.fill(addr)
    }

    /// Copies from `addr` to the end of its page (a misaligned word, which may span two
    /// pages, is read alone) and returns the word at `addr`.
    #[inline(never)]
    fn fill(&mut self, addr: u64) -> Option<u64> {
        self.len = 0;
        if addr & 7 != 0 {
            // SAFETY: bpf_probe_read_user copies from user memory with fault handling; any
            // address is safe to pass.
            return unsafe { bpf_probe_read_user(addr as *const u64) }.ok();
        }
        let bytes = (PAGE_BYTES - (addr & (PAGE_BYTES - 1))).min(WINDOW_BYTES);
        // Said again for the verifier, which checks the size against the buffer.
        if bytes == 0 || bytes > WINDOW_BYTES {
            return None;
        }
        // SAFETY: as above; `bytes` fits `words`, which this CPU's program run owns.
        let rc = unsafe {
            generated::bpf_probe_read_user(
                self.words.as_mut_ptr().cast(),
                bytes as u32,
                addr as *const core::ffi::c_void,
            )
        };
        if rc != 0 {
            return None;
        }
        self.base = addr;
        self.len = bytes >> 3;
        Some(self.words[0])
    }
}
