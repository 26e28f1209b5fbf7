//! The buffer request bodies are written into, kept from one profile to the next so that a
//! steady stream of intervals reuses one allocation instead of taking and freeing a body-sized
//! one every second; bounded, so one exceptional interval does not pin its size for good.
//!
//! How: a body is split off the buffer and frozen ([`Bytes`]); once the exporter has sent it
//! and dropped it, the buffer is that allocation's only owner again, and the next body of a
//! size that fits is written into it ([`BytesMut::try_reclaim`]). A body still queued (the
//! receiver is slow or down) keeps its allocation, and the next body gets a new one: the queue's
//! own byte bound is what bounds them.
//!
//! The bound: the bytes each profile needed are remembered as a peak that decays by a sixteenth
//! a profile; an allocation more than twice that peak (and worth freeing) is let go after the
//! profile, so after an exceptional interval the buffer is back to size within about a dozen.

use bytes::{Bytes, BytesMut};

/// An allocation this small is kept whatever the profiles need: freeing it saves nothing.
const KEEP_ALWAYS: usize = 64 << 10;

#[derive(Debug, Default)]
pub(super) struct BodyBuffer {
    buf: BytesMut,
    /// Bytes of the allocation `buf` writes into (0: none).
    allocated: usize,
    /// The most bytes a profile's bodies took lately, decaying by a sixteenth a profile.
    peak: usize,
}

impl BodyBuffer {
    /// A body of `len` bytes, which `write` appends to the buffer it is given.
    pub(super) fn body(&mut self, len: usize, write: impl FnOnce(&mut BytesMut)) -> Bytes {
        if !self.buf.try_reclaim(len) {
            // An eighth more than asked: the next interval is often a little larger.
            let capacity = len.saturating_add(len / 8);
            self.buf = BytesMut::with_capacity(capacity);
            self.allocated = capacity;
        }
        write(&mut self.buf);
        self.buf.split().freeze()
    }

    /// A profile's bodies were written, `bytes` in all: lets the allocation go when it is far
    /// larger than what profiles have needed lately.
    pub(super) fn profile_done(&mut self, bytes: usize) {
        self.peak = bytes.max(self.peak - self.peak / 16);
        if self.allocated > KEEP_ALWAYS && self.allocated / 2 > self.peak {
            self.buf = BytesMut::new();
            self.allocated = 0;
        }
    }

    /// Bytes of the allocation kept for the next body.
    #[cfg(test)]
    pub(super) fn allocated(&self) -> usize {
        self.allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(buffer: &mut BodyBuffer, len: usize) -> Bytes {
        buffer.body(len, |buf| buf.extend(std::iter::repeat_n(7u8, len)))
    }

    #[test]
    fn a_sent_body_gives_its_allocation_to_the_next_one() {
        // Given a body written and sent (dropped)
        let mut buffer = BodyBuffer::default();
        let first = write(&mut buffer, 100_000);
        let at = first.as_ptr();
        buffer.profile_done(first.len());
        drop(first);
        // When the next profile's body is as large or a little larger
        let second = write(&mut buffer, 105_000);
        buffer.profile_done(second.len());
        // Then it is written where the first was, no new allocation
        assert_eq!(second.as_ptr(), at);
        assert_eq!(buffer.allocated(), 112_500);
        assert!(second.iter().all(|&b| b == 7));
    }

    #[test]
    fn a_body_still_queued_keeps_its_bytes_and_the_next_gets_its_own() {
        // Given a body not yet sent
        let mut buffer = BodyBuffer::default();
        let queued = write(&mut buffer, 100_000);
        // When the next is written
        let next = write(&mut buffer, 100_000);
        // Then both hold their own bytes
        assert_ne!(queued.as_ptr(), next.as_ptr());
        assert!(queued.iter().chain(next.iter()).all(|&b| b == 7));
    }

    #[test]
    fn after_an_exceptional_profile_the_buffer_shrinks_back() {
        // Given steady 100 kB profiles, then one of 10 MB
        let mut buffer = BodyBuffer::default();
        for _ in 0..3 {
            let body = write(&mut buffer, 100_000);
            buffer.profile_done(body.len());
        }
        let big = write(&mut buffer, 10_000_000);
        buffer.profile_done(big.len());
        drop(big);
        assert!(buffer.allocated() >= 10_000_000);
        // When steady profiles follow
        let mut profiles = 0;
        while buffer.allocated() > 1_000_000 && profiles < 100 {
            let body = write(&mut buffer, 100_000);
            buffer.profile_done(body.len());
            profiles += 1;
        }
        // Then within a dozen or so the big allocation is gone, and the steady size is back
        assert!((8..=16).contains(&profiles), "{profiles} profiles");
        let body = write(&mut buffer, 100_000);
        buffer.profile_done(body.len());
        assert_eq!(buffer.allocated(), 112_500);
    }
}
