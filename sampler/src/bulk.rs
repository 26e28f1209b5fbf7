//! Reads and clears a whole BPF hash map in a few system calls: `BPF_MAP_LOOKUP_AND_DELETE_BATCH`
//! (Linux 5.6) takes up to a chunk of entries per call, where a key-by-key drain makes three
//! calls per entry (next key, lookup, delete). Under process churn nearly every sample has a
//! stack no earlier sample had, so the drain's calls grew with the samples; now they grow with
//! the samples divided by the chunk.
//!
//! aya (0.14) has no batch call, so this is a raw `bpf(2)` with the kernel's `batch` attribute,
//! on a map aya opened and checked (its key and value sizes are the types' sizes). It is used
//! only on a generation nothing writes to any more ([`crate::drain`]), so the map cannot change
//! under it. A kernel or filter that refuses the command makes the caller fall back to the
//! key-by-key drain (what was taken before the refusal is kept: it is already deleted).

use std::{
    mem::size_of,
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{maps::MapData, Pod};

/// `BPF_MAP_LOOKUP_AND_DELETE_BATCH` (include/uapi/linux/bpf.h); the seccomp filter allows it.
pub const BPF_MAP_LOOKUP_AND_DELETE_BATCH: u64 = 25;

/// `union bpf_attr`'s `batch` member, as the kernel lays it out: the size passed to `bpf(2)` is
/// this struct's, and the kernel reads the rest of the union as zero.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    /// Where to resume (a hash map's bucket index, a `u32`); null for the first call.
    in_batch: u64,
    /// Where the kernel writes the position to resume from.
    out_batch: u64,
    keys: u64,
    values: u64,
    /// In: room for entries in `keys` and `values`. Out: entries written.
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of `map`, removed from it, in calls of at most `chunk` entries. The error is the
/// one that stopped the reading (the entries taken before it are returned with it); the map is
/// then read no further here.
pub fn take_all<K: Pod, V: Pod>(
    map: &MapData,
    chunk: usize,
) -> (Vec<(K, V)>, Result<(), std::io::Error>) {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    let (key_size, value_size) = (size_of::<K>(), size_of::<V>());
    let mut keys = vec![0u8; chunk * key_size];
    let mut values = vec![0u8; chunk * value_size];
    let Ok(count) = u32::try_from(chunk) else {
        return (out, Err(std::io::Error::from_raw_os_error(libc::EINVAL)));
    };
    let map_fd = map.fd().as_fd().as_raw_fd();
    let Ok(map_fd) = u32::try_from(map_fd) else {
        return (out, Err(std::io::Error::from_raw_os_error(libc::EBADF)));
    };
    // A hash map's position is a bucket index, a u32; u64 leaves room for other map types'.
    let (mut resume, mut next) = (0u64, 0u64);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::from_ref(&resume) as u64
            },
            out_batch: std::ptr::from_mut(&mut next) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count,
            map_fd,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is the kernel's `batch` layout and its size is passed; the kernel
        // writes at most `count` keys and values into `keys` and `values`, which hold `chunk`
        // entries of the map's key and value sizes (aya checked them against K and V when it
        // opened the map), the position into `next` (8 bytes, of which it uses 4) and the
        // entries written into `attr.count`. It reads `resume` only when `in_batch` is set.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_AND_DELETE_BATCH,
                std::ptr::from_mut(&mut attr),
                size_of::<BatchAttr>(),
            )
        };
        // ENOENT: the last bucket was read; the entries it had are written all the same.
        let done = if ret < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENOENT) {
                // Nothing is written (nor deleted) by a call that fails otherwise.
                return (out, Err(err));
            }
            true
        } else {
            false
        };
        let got = (attr.count as usize).min(chunk);
        out.reserve(got);
        for i in 0..got {
            // SAFETY: entry `i < got <= chunk` lies in the buffers; K and V are Pod (any bytes
            // are a value) and read unaligned from the byte buffers.
            let entry = unsafe {
                (
                    keys.as_ptr().add(i * key_size).cast::<K>().read_unaligned(),
                    values
                        .as_ptr()
                        .add(i * value_size)
                        .cast::<V>()
                        .read_unaligned(),
                )
            };
            out.push(entry);
        }
        if done {
            return (out, Ok(()));
        }
        resume = next;
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd as _, OwnedFd};

    use aya::maps::{HashMap, Map};

    use super::*;

    /// `union bpf_attr`'s map-create member, as far as this test sets it.
    #[repr(C)]
    #[derive(Default)]
    struct CreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }

    /// A new hash map of u64 keys to `[u64; 4]` values, or `None` without the privilege (a
    /// non-root run).
    fn hash_map(max_entries: u32) -> Option<HashMap<MapData, u64, [u64; 4]>> {
        let mut attr = CreateAttr {
            map_type: 1, // BPF_MAP_TYPE_HASH
            key_size: 8,
            value_size: 32,
            max_entries,
            map_flags: 0,
        };
        // SAFETY: BPF_MAP_CREATE with its attribute and size; a descriptor is returned or -1.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                0,
                std::ptr::from_mut(&mut attr),
                size_of::<CreateAttr>(),
            )
        };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            assert!(
                std::env::var_os("CI").is_none(),
                "cannot create a BPF map in CI: {err}"
            );
            eprintln!("skipped: cannot create a BPF map ({err}); run as root");
            return None;
        }
        // SAFETY: a new descriptor, owned here once.
        let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).expect("fd")) };
        let data = MapData::from_fd(fd).expect("map data");
        Some(HashMap::try_from(Map::HashMap(data)).expect("a hash map"))
    }

    #[test]
    fn a_whole_map_is_taken_once_each_with_its_value_and_left_empty() {
        // Given a hash map holding 3,000 entries (more than one chunk, not a multiple of it)
        let Some(mut map) = hash_map(4096) else {
            return;
        };
        for key in 0..3000u64 {
            map.insert(key, [key, key * 2, key * 3, !key], 0)
                .expect("insert");
        }
        // When it is taken in chunks of 256
        let (taken, result) = take_all::<u64, [u64; 4]>(aya::maps::IterableMap::map(&map), 256);
        // Then every entry came once, with its value, and the map is empty
        result.expect("the batch command works on this kernel");
        assert_eq!(taken.len(), 3000, "every entry, once");
        let mut keys: Vec<u64> = taken.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys, (0..3000).collect::<Vec<_>>());
        for (key, value) in &taken {
            assert_eq!(*value, [*key, key * 2, key * 3, !key]);
        }
        assert_eq!(map.keys().count(), 0, "the map is left empty");
        // And an empty map gives nothing, without error
        let (taken, result) = take_all::<u64, [u64; 4]>(aya::maps::IterableMap::map(&map), 256);
        result.expect("empty map");
        assert!(taken.is_empty());
    }
}
