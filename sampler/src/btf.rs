//! Finds where two `task_struct` fields lie in the running kernel, from its own BTF
//! (`/sys/kernel/btf/vmlinux`), so that the eBPF program can read a process's start time at its
//! first sample (`group_leader`, then the leader's `start_boottime`) and the sampler need not
//! open `/proc/PID/stat` for it. aya-ebpf has no CO-RE relocations, and aya-obj keeps its BTF
//! type lookup private, so this is a small reader of its own.
//!
//! Read once at load, while privileged, from a file the kernel writes: nothing here parses
//! input a process could shape. It is still bounded (sizes checked before any read, at most
//! [`MAX_BTF_BYTES`], anonymous members followed at most [`MAX_DEPTH`] deep) and streamed (one
//! pass over the strings, one over the types), so the sampler's peak memory does not hold the
//! whole 5 MiB file. Any surprise is an error; the caller then leaves the offsets unknown and
//! the start time is read from /proc as before. Whatever the offsets, the drain loop checks the
//! start times they give against /proc's before trusting them ([`crate::tracker`]).

use std::{
    collections::HashMap,
    fs::File,
    io::{BufRead as _, BufReader, Read, Seek, SeekFrom},
    path::Path,
};

/// Byte offsets of the two `task_struct` fields the program reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskOffsets {
    pub group_leader: u32,
    pub start_boottime: u32,
}

/// Where the kernel publishes its BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Largest BTF read (vmlinux's is about 5 MiB).
const MAX_BTF_BYTES: u32 = 64 << 20;
/// Nesting of anonymous structs and unions followed inside `task_struct`.
const MAX_DEPTH: usize = 4;
/// Members of anonymous structs and unions kept while scanning (vmlinux has some tens of
/// thousands).
const MAX_KEPT_MEMBERS: usize = 1 << 20;
/// Longest name compared (ours are short; longer strings are skipped).
const MAX_NAME: usize = 64;

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BtfError {
    #[error("reading the kernel's BTF failed")]
    Io(#[from] std::io::Error),
    #[error("not BTF of this machine's byte order (magic {0:#x})")]
    Magic(u16),
    #[error("BTF header out of bounds")]
    Header,
    #[error("BTF type of unknown kind {0}")]
    Kind(u32),
    #[error("`task_struct` has no byte-aligned `{0}`")]
    Missing(&'static str),
}

/// The offsets in the running kernel's BTF.
pub fn task_offsets() -> Result<TaskOffsets, BtfError> {
    task_offsets_in(File::open(Path::new(KERNEL_BTF))?)
}

/// One struct or union member: name (string offset), type id, bit offset.
#[derive(Clone, Copy)]
struct Member {
    name: u32,
    type_id: u32,
    bits: u32,
}

/// The offsets in a BTF blob.
pub fn task_offsets_in<R: Read + Seek>(mut source: R) -> Result<TaskOffsets, BtfError> {
    let mut header = [0u8; 24];
    source.read_exact(&mut header)?;
    let u32_at = |at: usize| {
        u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let magic = u16::from_ne_bytes([header[0], header[1]]);
    if magic != MAGIC {
        return Err(BtfError::Magic(magic));
    }
    let (hdr_len, type_off, type_len, str_off, str_len) =
        (u32_at(4), u32_at(8), u32_at(12), u32_at(16), u32_at(20));
    let in_bounds = |off: u32, len: u32| {
        u64::from(hdr_len) + u64::from(off) + u64::from(len) <= u64::from(MAX_BTF_BYTES)
    };
    if !(24..=256).contains(&hdr_len)
        || !in_bounds(type_off, type_len)
        || !in_bounds(str_off, str_len)
    {
        return Err(BtfError::Header);
    }
    let names = find_names(
        &mut source,
        u64::from(hdr_len) + u64::from(str_off),
        str_len,
        &["task_struct", "group_leader", "start_boottime"],
    )?;
    source.seek(SeekFrom::Start(u64::from(hdr_len) + u64::from(type_off)))?;
    let mut types = BufReader::with_capacity(64 << 10, source.take(u64::from(type_len)));
    let mut task: Option<Vec<Member>> = None;
    let mut anonymous: HashMap<u32, Vec<Member>> = HashMap::new();
    let mut kept = 0usize;
    let mut id = 0u32;
    let mut word = [0u8; 4];
    let mut next = |r: &mut BufReader<_>| -> std::io::Result<u32> {
        r.read_exact(&mut word)?;
        Ok(u32::from_ne_bytes(word))
    };
    while !types.fill_buf()?.is_empty() {
        id += 1;
        let (name, info, _size) = (next(&mut types)?, next(&mut types)?, next(&mut types)?);
        let kind = (info >> 24) & 0x1f;
        let vlen = info & 0xffff;
        let kind_flag = info >> 31 == 1;
        let extra = match kind {
            2 | 7..=12 | 16 | 18 => 0,
            1 | 14 | 17 => 4,
            3 => 12,
            4 | 5 | 15 | 19 => 12 * vlen,
            6 | 13 => 8 * vlen,
            other => return Err(BtfError::Kind(other)),
        };
        let aggregate = kind == KIND_STRUCT || kind == KIND_UNION;
        let wanted = aggregate
            && ((kind == KIND_STRUCT && names[0].contains(&name) && task.is_none())
                || (name == 0 && kept < MAX_KEPT_MEMBERS));
        if !wanted {
            std::io::copy(
                &mut (&mut types).take(u64::from(extra)),
                &mut std::io::sink(),
            )?;
            continue;
        }
        let mut members = Vec::with_capacity(vlen as usize);
        for _ in 0..vlen {
            let (name, type_id, offset) = (next(&mut types)?, next(&mut types)?, next(&mut types)?);
            // With kind_flag, the top byte is a bitfield's size and the rest its bit offset.
            let bits = if kind_flag {
                if offset >> 24 != 0 {
                    continue;
                }
                offset & 0x00ff_ffff
            } else {
                offset
            };
            members.push(Member {
                name,
                type_id,
                bits,
            });
        }
        if name == 0 {
            kept += members.len();
            anonymous.insert(id, members);
        } else {
            task = Some(members);
        }
    }
    let task = task.ok_or(BtfError::Missing("task_struct"))?;
    let find = |which: usize, what: &'static str| {
        member_bits(&task, &names[which], &anonymous, 0)
            .filter(|bits| bits % 8 == 0)
            .and_then(|bits| u32::try_from(bits / 8).ok())
            .filter(|&at| at != 0)
            .ok_or(BtfError::Missing(what))
    };
    Ok(TaskOffsets {
        group_leader: find(1, "group_leader")?,
        start_boottime: find(2, "start_boottime")?,
    })
}

/// Bit offset of a member named one of `names` in `members`, looking into anonymous struct and
/// union members (whose own offset adds).
fn member_bits(
    members: &[Member],
    names: &[u32],
    anonymous: &HashMap<u32, Vec<Member>>,
    depth: usize,
) -> Option<u64> {
    if let Some(m) = members.iter().find(|m| names.contains(&m.name)) {
        return Some(u64::from(m.bits));
    }
    if depth >= MAX_DEPTH {
        return None;
    }
    members.iter().filter(|m| m.name == 0).find_map(|m| {
        let inner = anonymous.get(&m.type_id)?;
        Some(u64::from(m.bits) + member_bits(inner, names, anonymous, depth + 1)?)
    })
}

/// The offsets (in the string section) of each of `wanted`, read in one streamed pass.
fn find_names<R: Read + Seek>(
    source: &mut R,
    start: u64,
    len: u32,
    wanted: &[&str; 3],
) -> Result<[Vec<u32>; 3], BtfError> {
    source.seek(SeekFrom::Start(start))?;
    let mut strings = BufReader::with_capacity(64 << 10, source.take(u64::from(len)));
    let mut found: [Vec<u32>; 3] = Default::default();
    let mut current = Vec::with_capacity(MAX_NAME);
    let mut too_long = false;
    let mut at = 0u32;
    let mut begin = 0u32;
    loop {
        let buf = strings.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let n = buf.len();
        for &b in buf {
            if b == 0 {
                if !too_long {
                    for (slot, name) in found.iter_mut().zip(wanted) {
                        if current == name.as_bytes() {
                            slot.push(begin);
                        }
                    }
                }
                current.clear();
                too_long = false;
                begin = at + 1;
            } else if current.len() < MAX_NAME {
                current.push(b);
            } else {
                too_long = true;
            }
            at += 1;
        }
        strings.consume(n);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A type to write: name, kind, kind_flag, members as (name, type, offset).
    type Spec<'a> = (&'a str, u32, bool, &'a [(&'a str, u32, u32)]);

    /// A BTF blob of `types`, every name interned in the string section.
    fn blob(types: &[Spec<'_>]) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut intern = |name: &str| -> u32 {
            if name.is_empty() {
                return 0;
            }
            let at = strings.len() as u32;
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            at
        };
        let mut section = Vec::new();
        let word = |section: &mut Vec<u8>, v: u32| section.extend_from_slice(&v.to_ne_bytes());
        // Type 1: an int of 8 bytes, to show kinds with extra data are skipped.
        word(&mut section, intern("long long unsigned int"));
        word(&mut section, 1 << 24);
        word(&mut section, 8);
        word(&mut section, 64);
        for &(name, kind, flag, members) in types {
            let info = (kind << 24) | members.len() as u32 | (u32::from(flag) << 31);
            let name = intern(name);
            word(&mut section, name);
            word(&mut section, info);
            word(&mut section, 0);
            for &(m, ty, off) in members {
                let m = intern(m);
                word(&mut section, m);
                word(&mut section, ty);
                word(&mut section, off);
            }
        }
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_ne_bytes());
        out.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            section.len() as u32,
            section.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        out.extend_from_slice(&section);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn the_fields_are_found_directly_and_inside_anonymous_members() {
        // Given task_struct (type 3) with group_leader at byte 1000 and start_boottime inside an
        // anonymous union (type 2) that sits at byte 2000, in a blob with kind_flag offsets
        let bytes = blob(&[
            (
                "",
                KIND_UNION,
                false,
                &[("start_boottime", 1, 64), ("other", 1, 0)],
            ),
            (
                "task_struct",
                KIND_STRUCT,
                true,
                &[
                    ("flags", 1, (3 << 24) | 8),
                    ("group_leader", 1, 8000),
                    ("", 2, 16000),
                ],
            ),
        ]);
        // When read, Then both offsets are in bytes, the union's added
        assert_eq!(
            task_offsets_in(Cursor::new(bytes)).expect("offsets"),
            TaskOffsets {
                group_leader: 1000,
                start_boottime: 2008
            }
        );
    }

    #[test]
    fn a_missing_field_a_bitfield_or_a_bad_header_is_an_error() {
        let no_start = blob(&[(
            "task_struct",
            KIND_STRUCT,
            false,
            &[("group_leader", 1, 64)],
        )]);
        assert!(matches!(
            task_offsets_in(Cursor::new(no_start)),
            Err(BtfError::Missing("start_boottime"))
        ));
        let bitfield = blob(&[(
            "task_struct",
            KIND_STRUCT,
            true,
            &[
                ("group_leader", 1, 64),
                ("start_boottime", 1, (1 << 24) | 128),
            ],
        )]);
        assert!(task_offsets_in(Cursor::new(bitfield)).is_err());
        let mut bad = blob(&[]);
        bad[0] ^= 0xff;
        assert!(matches!(
            task_offsets_in(Cursor::new(bad)),
            Err(BtfError::Magic(_))
        ));
        let mut huge = blob(&[]);
        huge[12..16].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(matches!(
            task_offsets_in(Cursor::new(huge)),
            Err(BtfError::Header)
        ));
        let truncated = blob(&[(
            "task_struct",
            KIND_STRUCT,
            false,
            &[("group_leader", 1, 64)],
        )]);
        assert!(task_offsets_in(Cursor::new(&truncated[..40])).is_err());
    }

    #[test]
    fn the_running_kernels_task_struct_has_both() {
        // Where the kernel has BTF (CONFIG_DEBUG_INFO_BTF, every CI machine of ours).
        if !Path::new(KERNEL_BTF).exists() {
            eprintln!("skipped: no {KERNEL_BTF}");
            return;
        }
        let offsets = task_offsets().expect("offsets in the kernel's BTF");
        assert_ne!(offsets.group_leader, offsets.start_boottime);
    }
}
