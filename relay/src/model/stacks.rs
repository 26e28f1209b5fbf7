//! The profile model's stack table: every distinct stack (a list of frame ids, leaf first)
//! stored once, all of them back to back in one byte buffer, each id as a LEB128 varint.
//!
//! Why: a window under process churn holds hundreds of thousands of distinct stacks, and the
//! stacks are most of the model's memory. A frame id is a table index assigned in order of first
//! appearance, so the frames every stack shares (`main`, `_start`, the C library's) have the
//! smallest ids and take one byte; an id takes two bytes past 127 and three past 16,383. Stored
//! this way a stack costs its varints, 4 bytes for where it ends, and its slot in the hash index
//! (a 4-byte id and a control byte); one boxed `[u32]` per stack in an `IndexSet` cost 4 bytes a
//! frame, the allocator's header, a 24-byte entry and 9 bytes of index.
//!
//! Invariants: ids are dense (0..len) in order of insertion; a stack's bytes never change once
//! written (so ids stay valid until [`StackTable::clear`]); the hash index holds each id once,
//! keyed by its stack's bytes, so equal stacks have one id. LEB128 ends each number with a byte
//! below 0x80, so a stack's ids read from either end ([`Ids`] is double-ended). Nothing here
//! panics on any input: the buffer cannot reach 4 GiB (a stack takes at least one byte and the
//! relay's memory is far smaller); past that, a new stack gets [`NONE`], which names no stack.

use std::hash::BuildHasher as _;

use hashbrown::HashTable;

use super::Hasher;

/// Distinct stacks of frame ids, interned (see the module header).
#[derive(Clone, Default)]
pub(crate) struct StackTable {
    /// Every stack's ids as LEB128, back to back.
    bytes: Vec<u8>,
    /// Where each stack's bytes end in `bytes` (its start is where the one before ends).
    ends: Vec<u32>,
    /// Stack ids, found by their bytes.
    index: HashTable<u32>,
    hasher: Hasher,
}

impl std::fmt::Debug for StackTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackTable")
            .field("stacks", &self.ends.len())
            .field("bytes", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

/// The id [`StackTable::intern`] gives a stack that no longer fits: it names no stack, so
/// the rows that would hold it are left out of every output.
pub(crate) const NONE: u32 = u32::MAX;

/// Appends `id` as LEB128.
fn push_id(bytes: &mut Vec<u8>, mut id: u32) {
    while id >= 0x80 {
        // (the low 7 bits, with the bit that says more follows)
        bytes.push((id & 0x7f) as u8 | 0x80);
        id >>= 7;
    }
    bytes.push(id as u8);
}

impl StackTable {
    /// How many distinct stacks the table holds.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Empties the table, keeping its capacity.
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.index.clear();
    }

    /// The bytes of stack `id`.
    fn span<'b>(bytes: &'b [u8], ends: &[u32], id: u32) -> &'b [u8] {
        let i = id as usize;
        let start = match i.checked_sub(1) {
            Some(before) => ends.get(before).copied().unwrap_or(0),
            None => 0,
        };
        let end = ends.get(i).copied().unwrap_or(start);
        bytes.get(start as usize..end as usize).unwrap_or(&[])
    }

    /// The ids of stack `id`, leaf first; `None` when there is no such stack.
    pub(crate) fn get(&self, id: u32) -> Option<Ids<'_>> {
        ((id as usize) < self.ends.len()).then(|| Ids {
            bytes: Self::span(&self.bytes, &self.ends, id),
        })
    }

    /// Every stack, by id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Ids<'_>> + '_ {
        (0..self.ends.len()).map(|id| Ids {
            bytes: Self::span(&self.bytes, &self.ends, id as u32),
        })
    }

    /// The id of the stack made of `ids` (leaf first), adding it when it is new.
    pub(crate) fn intern(&mut self, ids: impl IntoIterator<Item = u32>) -> u32 {
        let Self {
            bytes,
            ends,
            index,
            hasher,
        } = self;
        // Written where a new stack would go, then looked up; taken back if it was there.
        let start = bytes.len();
        for id in ids {
            push_id(bytes, id);
        }
        let Ok(end) = u32::try_from(bytes.len()) else {
            bytes.truncate(start);
            return NONE;
        };
        let hash = hasher.hash_one(&bytes[start..]);
        let found = index.find(hash, |&id| Self::span(bytes, ends, id) == &bytes[start..]);
        if let Some(&id) = found {
            bytes.truncate(start);
            return id;
        }
        let id = super::id(ends.len());
        ends.push(end);
        index.insert_unique(hash, id, |&id| hasher.hash_one(Self::span(bytes, ends, id)));
        id
    }
}

/// One stack's frame ids, leaf first, decoded as they are read, from either end.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ids<'a> {
    bytes: &'a [u8],
}

impl Ids<'_> {
    /// How many ids (each ends with a byte below 0x80).
    pub fn len(&self) -> usize {
        self.bytes.iter().filter(|&&b| b < 0x80).count()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Decodes one LEB128 number (its last byte below 0x80); an id too long to be ours reads as
/// `u32::MAX`, which names no frame.
fn decode(bytes: &[u8]) -> u32 {
    let mut id: u64 = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if i >= 5 {
            return u32::MAX;
        }
        id |= u64::from(b & 0x7f) << (7 * i);
    }
    u32::try_from(id).unwrap_or(u32::MAX)
}

impl Iterator for Ids<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let end = self.bytes.iter().position(|&b| b < 0x80)?;
        let (number, rest) = self.bytes.split_at(end + 1);
        self.bytes = rest;
        Some(decode(number))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.bytes.len().div_ceil(5), Some(self.bytes.len()))
    }
}

impl DoubleEndedIterator for Ids<'_> {
    fn next_back(&mut self) -> Option<u32> {
        let (_, before) = self.bytes.split_last()?;
        let start = before.iter().rposition(|&b| b < 0x80).map_or(0, |i| i + 1);
        let (rest, number) = self.bytes.split_at(start);
        self.bytes = rest;
        Some(decode(number))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_read_back_from_either_end_and_equal_stacks_share_an_id() {
        // Given stacks with ids of one to five bytes, an empty stack and a repeat
        let stacks: [&[u32]; 5] = [
            &[0, 1, 2],
            &[127, 128, 16_383, 16_384, u32::MAX],
            &[],
            &[5],
            &[0, 1, 2],
        ];
        let mut table = StackTable::default();
        let ids: Vec<u32> = stacks
            .iter()
            .map(|s| table.intern(s.iter().copied()))
            .collect();
        // Then each distinct stack has its own dense id and the repeat the first one's
        assert_eq!(ids, [0, 1, 2, 3, 0]);
        assert_eq!(table.len(), 4);
        for (stack, &id) in stacks.iter().zip(&ids) {
            let read = table.get(id).expect("stack");
            assert_eq!(read.collect::<Vec<_>>(), *stack);
            assert_eq!(read.rev().collect::<Vec<_>>(), {
                let mut r = stack.to_vec();
                r.reverse();
                r
            });
            assert_eq!(read.len(), stack.len());
        }
        // And a mixed walk from both ends meets in the middle
        let mut both = table.get(1).expect("stack");
        assert_eq!(both.next(), Some(127));
        assert_eq!(both.next_back(), Some(u32::MAX));
        assert_eq!(both.next_back(), Some(16_384));
        assert_eq!(both.next(), Some(128));
        assert_eq!(both.next(), Some(16_383));
        assert_eq!(both.next(), None);
        assert!(table.get(4).is_none());
        // And clearing forgets them all
        table.clear();
        assert_eq!(table.intern([5]), 0);
    }
}
