//! The relay's `interpreterProcess` messages, checked and kept in the program's `INTERP_PROCS`
//! map, whose entries tell the program where a process's interpreter keeps its threads and
//! frames (docs/design/interpreters.md).
//!
//! Nothing the relay claims is trusted, and nothing is parsed: an entry is taken only when its
//! pid is a live process this sampler described on the connection with the claimed start time,
//! that maps the claimed file under a CPython's name (`python*`, `libpython*`, as the kernel
//! reported the mapping's path), whose `root` and `codeType` lie in that file's image (from its
//! lowest mapping's start minus that mapping's file offset, 1 GiB long), whose runtime is one the
//! program knows, and whose offsets are all below 4096 (or absent where the program can do
//! without them). The program only ever reads the sampled process's own memory with them: a
//! wrong entry costs bounded time and gives wrong frames, and what a compromised relay could
//! still read back is bounded as SECURITY.md says (copies of at most 768 bytes per pointer it
//! reaches, in processes that map a file named like CPython).
//!
//! An entry is forgotten when its process exits, when new facts of its pid show another start
//! time or the file's image elsewhere (pid reuse, exec), on `forget`, and when the relay
//! disconnects (a new relay sends its own). Every refusal is counted (`Losses.interpRefused`).

use std::collections::HashMap;

use ember_protocol::{InterpreterProcess, Mapping};
use ember_sampler_ebpf::{
    interp_field as field, InterpProc, INTERP_ABSENT, INTERP_MAX_HEAD_OFFSET, INTERP_MAX_OFFSET,
    INTERP_RUNTIME_CPYTHON,
};

// The relay checks layouts against the protocol's copy of these bounds before it sends them.
const _: () = assert!(
    INTERP_MAX_OFFSET == ember_protocol::INTERP_MAX_OFFSET
        && INTERP_MAX_HEAD_OFFSET == ember_protocol::INTERP_MAX_HEAD_OFFSET
        && INTERP_ABSENT == ember_protocol::INTERP_LAYOUT_ABSENT
        && field::LEN == ember_protocol::INTERP_LAYOUT_LEN
);

use crate::ignore::Described;

/// How far past the start of the interpreter file's image `root` and `codeType` may lie.
const IMAGE_SPAN: u64 = 1 << 30;
/// Largest code pointer tag mask.
const MAX_TAG_MASK: u16 = 15;

/// The program's `INTERP_PROCS` map, as this module uses it (a seam for the tests).
pub trait InterpMap {
    fn insert(&mut self, pid: u32, value: &InterpProc) -> Result<(), String>;
    fn remove(&mut self, pid: u32);
}

impl InterpMap for aya::maps::HashMap<aya::maps::MapData, u32, InterpProc> {
    fn insert(&mut self, pid: u32, value: &InterpProc) -> Result<(), String> {
        aya::maps::HashMap::insert(self, pid, value, 0).map_err(|err| err.to_string())
    }

    fn remove(&mut self, pid: u32) {
        // Absent is fine: nothing to forget.
        let _ = aya::maps::HashMap::remove(self, &pid);
    }
}

/// What an accepted entry was checked against, to check it again when its process changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Accepted {
    start_time_unix_ns: u64,
    file_id: u64,
    /// Where the file's image starts in the process.
    image: u64,
}

/// The interpreters the program walks, and what became of the relay's messages.
#[derive(Debug, Default)]
pub struct Interps {
    entries: HashMap<u32, Accepted>,
    /// Messages refused since start.
    pub refused: u64,
    /// Entries taken since start.
    pub accepted: u64,
}

/// Where `file_id`'s image starts in a process with `mappings`: its lowest mapping's start
/// minus that mapping's file offset. `None` when it maps no such file (or the offset is past
/// the start, which no real mapping has).
/// Whether a mapped file's name is a CPython's (`python3.11`, `libpython3.12.so.1.0`, ...), as
/// the kernel reported the mapping's path: a compromised relay can point the walk only into
/// processes that map such a file, never into any process at all.
fn named_like_an_interpreter(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("python") || name.starts_with("libpython")
}

fn image_start(mappings: &[Mapping], file_id: u64) -> Option<u64> {
    let lowest = mappings
        .iter()
        .filter(|m| file_id != 0 && m.file_id == file_id)
        .min_by_key(|m| m.start)?;
    lowest.start.checked_sub(lowest.file_offset)
}

/// Why a message's layout is refused, if it is: every offset at most [`INTERP_MAX_OFFSET`]
/// (the interpreter's thread list at most [`INTERP_MAX_HEAD_OFFSET`]), absent only where the
/// program can do without it, and a tag mask of at most 15.
fn check_layout(layout: &[u16; field::LEN]) -> Result<(), &'static str> {
    let native = layout[field::THREAD_NATIVE_ID] != INTERP_ABSENT;
    for (i, &offset) in layout.iter().enumerate() {
        let may_be_absent = matches!(
            i,
            field::THREAD_NATIVE_ID | field::CFRAME_CURRENT_FRAME | field::FRAME_MARKER
        ) || (i == field::PTHREAD_TID && native);
        if offset == INTERP_ABSENT && may_be_absent {
            continue;
        }
        if offset == INTERP_ABSENT {
            return Err("a required offset is absent");
        }
        let max = if i == field::INTERP_THREADS_HEAD {
            INTERP_MAX_HEAD_OFFSET
        } else {
            INTERP_MAX_OFFSET
        };
        if offset > max {
            return Err("an offset is over its bound (4095; 16383 for the thread list)");
        }
    }
    if layout[field::CODE_TAG_MASK] > MAX_TAG_MASK {
        return Err("the code tag mask is over 15");
    }
    Ok(())
}

impl Interps {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Takes one message if it checks out, else counts it refused and says why. `described` is
    /// what the sampler told the relay about the live process under the message's pid, and
    /// `mappings` that process's executable mappings.
    pub fn take(
        &mut self,
        message: &InterpreterProcess,
        described: Option<Described>,
        mappings: Option<&[Mapping]>,
        map: &mut impl InterpMap,
    ) -> Result<(), &'static str> {
        let result = self.check_and_store(message, described, mappings, map);
        match result {
            Ok(()) if !message.forget => self.accepted += 1,
            Ok(()) => {}
            Err(_) => self.refused += 1,
        }
        result
    }

    fn check_and_store(
        &mut self,
        message: &InterpreterProcess,
        described: Option<Described>,
        mappings: Option<&[Mapping]>,
        map: &mut impl InterpMap,
    ) -> Result<(), &'static str> {
        let pid = message.pid;
        if message.forget {
            let ours = self.entries.get(&pid).map(|a| a.start_time_unix_ns);
            if ours != Some(message.start_time_unix_ns) {
                return Err("forget of a process not walked");
            }
            self.entries.remove(&pid);
            map.remove(pid);
            return Ok(());
        }
        let described = described.ok_or("not a live process described on this connection")?;
        if message.start_time_unix_ns == 0
            || described.start_time_unix_ns != message.start_time_unix_ns
        {
            return Err("another start time than the process described");
        }
        if message.runtime != INTERP_RUNTIME_CPYTHON {
            return Err("an unknown runtime");
        }
        check_layout(&message.layout)?;
        let mappings = mappings.unwrap_or_default();
        let image =
            image_start(mappings, message.file_id).ok_or("the process does not map the file")?;
        if !mappings
            .iter()
            .filter(|m| m.file_id == message.file_id)
            .all(|m| named_like_an_interpreter(&m.path))
        {
            return Err("the file is not named like an interpreter (python*, libpython*)");
        }
        let inside = |addr: u64| addr.checked_sub(image).is_some_and(|d| d < IMAGE_SPAN);
        if !inside(message.root) || !inside(message.code_type) {
            return Err("root or code type outside the file's image");
        }
        let value = InterpProc {
            root: message.root,
            code_type: message.code_type,
            runtime: message.runtime,
            _pad: 0,
            layout: message.layout,
            _pad2: [0; 3],
        };
        map.insert(pid, &value).map_err(|err| {
            tracing::debug!(pid, %err, "the INTERP_PROCS map refused an entry");
            "the map refused it (full)"
        })?;
        self.entries.insert(
            pid,
            Accepted {
                start_time_unix_ns: message.start_time_unix_ns,
                file_id: message.file_id,
                image,
            },
        );
        Ok(())
    }

    /// Forgets the entries of processes that are gone, and of changed ones whose new facts
    /// show another start time or the interpreter file's image elsewhere (or not at all).
    /// `facts(pid)` is what the tracker knows of the live process now.
    pub fn recheck<'a>(
        &mut self,
        changed: &[u32],
        gone: &[u32],
        facts: impl Fn(u32) -> Option<(Described, &'a [Mapping])>,
        map: &mut impl InterpMap,
    ) {
        for &pid in gone {
            if self.entries.remove(&pid).is_some() {
                map.remove(pid);
            }
        }
        for &pid in changed {
            let Some(accepted) = self.entries.get(&pid) else {
                continue;
            };
            let still = facts(pid).is_some_and(|(described, mappings)| {
                described.start_time_unix_ns == accepted.start_time_unix_ns
                    && image_start(mappings, accepted.file_id) == Some(accepted.image)
            });
            if !still {
                self.entries.remove(&pid);
                map.remove(pid);
            }
        }
    }

    /// Forgets every entry (the relay went away).
    pub fn clear(&mut self, map: &mut impl InterpMap) {
        for (pid, _) in self.entries.drain() {
            map.remove(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use ember_protocol::{INTERP_LAYOUT_ABSENT, INTERP_LAYOUT_LEN};

    use super::*;

    #[derive(Default)]
    struct FakeMap(HashMap<u32, InterpProc>);

    impl InterpMap for FakeMap {
        fn insert(&mut self, pid: u32, value: &InterpProc) -> Result<(), String> {
            self.0.insert(pid, *value);
            Ok(())
        }

        fn remove(&mut self, pid: u32) {
            self.0.remove(&pid);
        }
    }

    const START: u64 = 1_700_000_000_000_000_000;
    const FILE: u64 = 9;
    const LIBPYTHON: &str = "/usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0";
    /// libpython mapped at 0x7f00_0000_0000 (its read-only first segment), text at offset
    /// 0x1000.
    fn mappings() -> Vec<Mapping> {
        vec![
            Mapping {
                start: 0x7f00_0000_5000,
                end: 0x7f00_0040_0000,
                file_offset: 0x5000,
                file_id: FILE,
                path: LIBPYTHON.into(),
                ..Mapping::default()
            },
            Mapping {
                start: 0x7f00_0000_1000,
                end: 0x7f00_0000_5000,
                file_offset: 0x1000,
                file_id: FILE,
                path: LIBPYTHON.into(),
                ..Mapping::default()
            },
            Mapping {
                start: 0x5555_0000_0000,
                end: 0x5555_0001_0000,
                file_offset: 0,
                file_id: 3,
                path: "/usr/bin/app".into(),
                ..Mapping::default()
            },
        ]
    }

    fn described(start: u64) -> Option<Described> {
        Some(Described {
            start_time_unix_ns: start,
            executable_path: "/usr/bin/python3".into(),
        })
    }

    /// A 3.12-like layout.
    fn message() -> InterpreterProcess {
        let mut layout = [INTERP_LAYOUT_ABSENT; INTERP_LAYOUT_LEN];
        let values = [
            (field::INTERP_THREADS_HEAD, 72),
            (field::THREAD_NEXT, 8),
            (field::THREAD_NATIVE_ID, 144),
            (field::THREAD_PTHREAD, 136),
            (field::THREAD_FRAME, 56),
            (field::CFRAME_CURRENT_FRAME, 0),
            (field::FRAME_PREVIOUS, 8),
            (field::FRAME_CODE, 0),
            (field::FRAME_INSTRUCTION, 56),
            (field::FRAME_MARKER, 70),
            (field::CODE_TAG_MASK, 0),
            (field::CODE_NAME, 112),
            (field::CODE_FILENAME, 104),
            (field::CODE_FIRSTLINENO, 68),
            (field::CODE_LINETABLE, 128),
            (field::OBJECT_TYPE, 8),
        ];
        for (i, v) in values {
            layout[i] = v;
        }
        InterpreterProcess {
            pid: 42,
            start_time_unix_ns: START,
            file_id: FILE,
            runtime: 1,
            root: 0x7f00_0030_0000,
            code_type: 0x7f00_0031_0000,
            layout,
            forget: false,
        }
    }

    fn take(
        interps: &mut Interps,
        map: &mut FakeMap,
        message: &InterpreterProcess,
    ) -> Result<(), &'static str> {
        let maps = mappings();
        interps.take(message, described(START), Some(&maps), map)
    }

    #[test]
    fn a_message_that_checks_out_is_stored_as_sent() {
        let (mut interps, mut map) = (Interps::default(), FakeMap::default());
        // Given a message for a described process, inside libpython's image
        take(&mut interps, &mut map, &message()).expect("accepted");
        // Then the program's entry is the message's root, type and layout
        let entry = map.0[&42];
        assert_eq!(
            (entry.root, entry.code_type, entry.layout),
            (0x7f00_0030_0000, 0x7f00_0031_0000, message().layout)
        );
        assert_eq!((interps.accepted, interps.refused), (1, 0));
    }

    #[test]
    fn a_file_not_named_like_an_interpreter_is_refused() {
        // Given a claim that is right in every way but the mapped file's name (a relay pointing
        // the walk into a process that runs no CPython)
        let renamed: Vec<Mapping> = mappings()
            .into_iter()
            .map(|m| Mapping {
                path: if m.file_id == FILE {
                    "/usr/lib/x86_64-linux-gnu/libssl.so.3".into()
                } else {
                    m.path
                },
                ..m
            })
            .collect();
        let (mut interps, mut map) = (Interps::default(), FakeMap::default());
        // Then it is refused and counted, and nothing is stored
        let refused = interps.take(&message(), described(START), Some(&renamed), &mut map);
        assert_eq!(
            refused,
            Err("the file is not named like an interpreter (python*, libpython*)")
        );
        assert_eq!((interps.refused, map.0.len()), (1, 0));
        // And the names CPython's binaries have pass
        for name in [
            "/usr/bin/python3.11",
            "/opt/x/lib/libpython3.12.so.1.0",
            "python3",
        ] {
            assert!(named_like_an_interpreter(name), "{name}");
        }
        for name in ["/usr/bin/pytruth", "/usr/bin/app-python3", ""] {
            assert!(!named_like_an_interpreter(name), "{name}");
        }
    }

    #[test]
    fn each_broken_claim_is_refused_and_counted() {
        let mut cases: Vec<(&str, InterpreterProcess)> = Vec::new();
        let with = |f: &dyn Fn(&mut InterpreterProcess)| {
            let mut m = message();
            f(&mut m);
            m
        };
        cases.push(("another start time", with(&|m| m.start_time_unix_ns += 1)));
        cases.push(("a file not mapped", with(&|m| m.file_id = 77)));
        cases.push(("the executable's file", with(&|m| m.file_id = 3)));
        // The image starts at 0x7f00_0000_0000 (lowest start minus its offset): one below
        // it, and 1 GiB past it, are outside.
        cases.push(("root below", with(&|m| m.root = 0x7eff_ffff_ffff)));
        cases.push(("root past 1 GiB", with(&|m| m.root = 0x7f00_4000_0000)));
        cases.push(("code type outside", with(&|m| m.code_type = 0x1000)));
        cases.push(("runtime", with(&|m| m.runtime = 2)));
        cases.push(("offset 4096", with(&|m| m.layout[field::FRAME_CODE] = 4096)));
        cases.push((
            "thread list at 16384",
            with(&|m| m.layout[field::INTERP_THREADS_HEAD] = 16384),
        ));
        cases.push((
            "frame absent",
            with(&|m| m.layout[field::FRAME_PREVIOUS] = INTERP_ABSENT),
        ));
        cases.push(("mask 16", with(&|m| m.layout[field::CODE_TAG_MASK] = 16)));
        cases.push((
            "no native id and no pthread tid",
            with(&|m| m.layout[field::THREAD_NATIVE_ID] = INTERP_ABSENT),
        ));
        for (what, bad) in &cases {
            let (mut interps, mut map) = (Interps::default(), FakeMap::default());
            assert!(take(&mut interps, &mut map, bad).is_err(), "{what}");
            assert!(map.0.is_empty(), "{what}");
            assert_eq!(interps.refused, 1, "{what}");
        }
        // Given a pid the tracker does not know (or knows exited): refused
        let (mut interps, mut map) = (Interps::default(), FakeMap::default());
        let maps = mappings();
        assert!(interps
            .take(&message(), None, Some(&maps), &mut map)
            .is_err());
        assert_eq!((interps.refused, map.0.len()), (1, 0));
        // Given the pthread path (3.6-3.10): no native id, a pthread tid: accepted; and the
        // edge of the image (its first byte, its last) is inside
        // Given 3.13's thread list 7,344 bytes into the interpreter state: accepted
        let (mut interps, mut map) = (Interps::default(), FakeMap::default());
        take(
            &mut interps,
            &mut map,
            &with(&|m| m.layout[field::INTERP_THREADS_HEAD] = 7344),
        )
        .expect("3.13's thread list offset is accepted");
        let pthread = with(&|m| {
            m.layout[field::THREAD_NATIVE_ID] = INTERP_ABSENT;
            m.layout[field::PTHREAD_TID] = 0x2d0;
            m.layout[field::CFRAME_CURRENT_FRAME] = INTERP_ABSENT;
            m.layout[field::FRAME_MARKER] = INTERP_ABSENT;
            m.root = 0x7f00_0000_0000;
            m.code_type = 0x7f00_3fff_ffff;
        });
        let (mut interps, mut map) = (Interps::default(), FakeMap::default());
        take(&mut interps, &mut map, &pthread).expect("the pthread path is accepted");
    }

    #[test]
    fn exit_reuse_exec_elsewhere_forget_and_disconnect_end_the_walking() {
        let (mut interps, mut map) = (Interps::default(), FakeMap::default());
        let mut second = message();
        second.pid = 43;
        let maps = mappings();
        for m in [message(), second] {
            interps
                .take(&m, described(START), Some(&maps), &mut map)
                .expect("accepted");
        }
        // Given new facts of pid 42 with the same start time and image: kept
        interps.recheck(
            &[42],
            &[],
            |_| Some((described(START)?, &maps[..])),
            &mut map,
        );
        assert!(map.0.contains_key(&42));
        // Given libpython mapped elsewhere (an exec, ASLR): forgotten
        let moved: Vec<Mapping> = maps
            .iter()
            .map(|m| Mapping {
                start: m.start + 0x10_0000,
                end: m.end + 0x10_0000,
                ..m.clone()
            })
            .collect();
        interps.recheck(
            &[42],
            &[],
            |_| Some((described(START)?, &moved[..])),
            &mut map,
        );
        assert!(!map.0.contains_key(&42));
        // Given pid 43 reused (another start time): forgotten, as an exited one is
        interps
            .take(&message(), described(START), Some(&maps), &mut map)
            .expect("accepted");
        interps.recheck(
            &[43],
            &[42],
            |_| Some((described(START + 1)?, &maps[..])),
            &mut map,
        );
        assert!(map.0.is_empty() && interps.len() == 0);
        // Given a forget of a walked process: forgotten; of another start time: refused
        interps
            .take(&message(), described(START), Some(&maps), &mut map)
            .expect("accepted");
        let stale = InterpreterProcess {
            forget: true,
            start_time_unix_ns: START + 1,
            ..message()
        };
        assert!(interps.take(&stale, None, None, &mut map).is_err());
        assert!(map.0.contains_key(&42));
        let forget = InterpreterProcess {
            forget: true,
            ..message()
        };
        interps.take(&forget, None, None, &mut map).expect("forgot");
        assert!(map.0.is_empty());
        // Given a disconnect: every entry goes
        interps
            .take(&message(), described(START), Some(&maps), &mut map)
            .expect("accepted");
        interps.clear(&mut map);
        assert!(map.0.is_empty() && interps.len() == 0);
    }
}
