//! The relay's CPython stage of one connection: takes in each interval's code copies
//! ([`Naming::take_codes`]), names the raw frames of a sample from them and splices them into
//! its native stack ([`Naming::splice_stack`]); counts what it could not name or pair.
//!
//! A frame is named from the cache ([`CodeCache`]): its code's qualified name and file name, and
//! the line of its instruction ([`instruction::offset`] then the line table), or the code's
//! first line when the line table does not tell. A code never copied is `[unknown] python`.

use std::sync::Arc;

use super::{
    codes::{self, CodeCache, NamedCode, UNKNOWN_PYTHON},
    instruction, lines,
    splice::{self, Boundary, Mismatch},
    Layout, Version,
};
use crate::{
    interp::raw::{RawCode, RawInterpFrame},
    model::{Frame, FrameKind},
};

/// Counters of the stage, for the logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Python frames named (each time a stack is spliced).
    pub frames: u64,
    /// Python frames whose code no copy named (`[unknown] python`).
    pub unknown_code: u64,
    /// Frames whose line came from the code's first line (no line table answer).
    pub first_line_only: u64,
    /// Stacks spliced.
    pub stacks: u64,
    /// Stacks whose groups and eval frames did not pair up, and how.
    pub mismatched_stacks: u64,
    pub groups_left: u64,
    pub eval_frames_left: u64,
}

/// The CPython stage (see the module's doc).
pub struct Naming {
    pub cache: CodeCache,
    pub stats: Stats,
}

impl Default for Naming {
    fn default() -> Self {
        Self {
            cache: CodeCache::with_limits(codes::Limits::default()),
            stats: Stats::default(),
        }
    }
}

/// The interpreter of one process: its version and layout.
#[derive(Clone, Copy, Debug)]
pub struct Runtime<'a> {
    pub version: Version,
    pub layout: &'a Layout,
    /// The path of the interpreter's binary in the process's modules, when known.
    pub module: Option<&'a str>,
}

impl Naming {
    /// Takes in the copies of one process's code objects (pid, start time), `(address, copy)`.
    pub fn take_codes<'c>(
        &mut self,
        (pid, start): (u32, u64),
        runtime: Runtime<'_>,
        codes: impl IntoIterator<Item = (u64, &'c RawCode)>,
    ) {
        for (address, raw) in codes {
            let (named, unread) = NamedCode::decode(raw, runtime.version, runtime.layout);
            self.cache.insert(pid, start, address, named, unread);
        }
    }

    /// The Python frame of `raw` in process (pid, start time).
    pub fn frame(
        &mut self,
        process: (u32, u64),
        runtime: Runtime<'_>,
        raw: &RawInterpFrame,
    ) -> Frame {
        self.stats.frames += 1;
        let Some(code) = self.cache.get(process.0, process.1, raw.code) else {
            self.stats.unknown_code += 1;
            return python_frame(Arc::from(UNKNOWN_PYTHON), None, None);
        };
        let line = instruction::offset(runtime.version, runtime.layout, raw.code, raw.instruction)
            .and_then(|offset| {
                let table = if code.linetable_complete {
                    lines::Table::whole(&code.linetable)
                } else {
                    lines::Table::prefix(&code.linetable)
                };
                lines::line_of(runtime.version, table, code.first_line?, offset)
            });
        let line = line.or_else(|| {
            self.stats.first_line_only += 1;
            code.first_line
        });
        python_frame(Arc::clone(&code.name), code.filename.clone(), line)
    }

    /// `native` (leaf first) with the eval loop's frames replaced by the Python frames of
    /// `interp` (leaf first) of process (pid, start time).
    pub fn splice_stack(
        &mut self,
        process: (u32, u64),
        runtime: Runtime<'_>,
        native: &[Frame],
        interp: &[RawInterpFrame],
    ) -> Vec<Frame> {
        let groups: Vec<Vec<Frame>> = splice::groups(interp, Boundary::of(runtime.version))
            .into_iter()
            .map(|range| {
                interp
                    .get(range)
                    .unwrap_or(&[])
                    .iter()
                    .map(|raw| self.frame(process, runtime, raw))
                    .collect()
            })
            .collect();
        let (frames, mismatch) = splice::splice(native, &groups, runtime.module);
        self.stats.stacks += 1;
        if !mismatch.is_none() {
            self.count(process.0, mismatch, groups.len());
        }
        frames
    }

    fn count(&mut self, pid: u32, mismatch: Mismatch, groups: usize) {
        self.stats.mismatched_stacks += 1;
        self.stats.groups_left += mismatch.groups_left as u64;
        self.stats.eval_frames_left += mismatch.eval_frames_left as u64;
        tracing::debug!(
            pid,
            groups,
            groups_left = mismatch.groups_left,
            eval_frames_left = mismatch.eval_frames_left,
            "Python frames and the eval loop's native frames did not pair up (a stack cut \
             short, or a thread between calls)"
        );
    }
}

fn python_frame(function: Arc<str>, file: Option<Arc<str>>, line: Option<u32>) -> Frame {
    Frame {
        function,
        file,
        line,
        kind: FrameKind::CPython,
        inlined: false,
        address: 0,
        module: None,
    }
}

#[cfg(test)]
mod tests {
    use super::{super::table, *};

    const V: Version = Version::new(3, 12, 1);

    fn str_image(text: &str) -> Vec<u8> {
        let mut raw = vec![0u8; 40];
        raw[16..24].copy_from_slice(&(text.len() as i64).to_le_bytes());
        raw[32..36].copy_from_slice(&((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes());
        raw.extend_from_slice(text.as_bytes());
        raw
    }

    fn code(name: &str, first_line: i32) -> RawCode {
        RawCode {
            first_line,
            copied: RawCode::NAME | RawCode::FILENAME,
            name: str_image(name),
            filename: str_image("/srv/app/workload.py"),
            linetable: Vec::new(),
        }
    }

    fn frame(code: u64, marker: u8) -> RawInterpFrame {
        RawInterpFrame {
            code,
            instruction: code + 192 + 8,
            marker,
        }
    }

    #[test]
    fn a_native_stack_gets_its_python_frames_named_at_their_first_line() {
        // Given a 3.12 process whose codes `hot` and `main` were copied, and one never copied
        let layout = table::layout(V).expect("layout");
        let runtime = Runtime {
            version: V,
            layout: &layout,
            module: None,
        };
        let mut naming = Naming::default();
        let (hot, main) = (code("Worker.hot", 12), code("<module>", 1));
        naming.take_codes((7, 100), runtime, [(0x1000, &hot), (0x2000, &main)]);
        // When a sample's stack (two eval calls) is spliced with its walked frames: hot, an
        // unknown code, a shim, main, a shim
        let native = [
            Frame::bare("_PyEval_EvalFrameDefault", FrameKind::Native, 0x10),
            Frame::bare("_PyEval_EvalFrameDefault", FrameKind::Native, 0x10),
            Frame::bare("main", FrameKind::Native, 0x20),
        ];
        let interp = [
            frame(0x1000, 0),
            frame(0x3000, 0),
            frame(0, 3),
            frame(0x2000, 0),
            frame(0, 3),
        ];
        let out = naming.splice_stack((7, 100), runtime, &native, &interp);
        // Then the Python frames replace the eval frames, named at their first lines
        let names: Vec<String> = out.iter().map(Frame::text_name).collect();
        assert_eq!(
            names,
            [
                "Worker.hot (workload.py:12)",
                "[unknown] python",
                "<module> (workload.py:1)",
                "main"
            ]
        );
        assert_eq!(out[0].kind, FrameKind::CPython);
        assert_eq!(out[0].file.as_deref(), Some("/srv/app/workload.py"));
        assert_eq!(
            (
                naming.stats.frames,
                naming.stats.unknown_code,
                naming.stats.first_line_only
            ),
            (3, 1, 2)
        );
        assert_eq!(naming.stats.mismatched_stacks, 0);
        // And another process under the same pid does not see those codes
        let out = naming.splice_stack((7, 200), runtime, &native[..1], &interp[..1]);
        assert_eq!(&*out[0].function, UNKNOWN_PYTHON);
    }

    #[test]
    fn arbitrary_copies_and_frames_never_panic() {
        // Given pseudo-random copies and frames for every release line's rules
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let native = [
            Frame::bare("_PyEval_EvalFrameDefault", FrameKind::Native, 0x10),
            Frame::bare("main", FrameKind::Native, 0x20),
        ];
        for minor in 6..=12 {
            let version = Version::new(3, minor, 0);
            let layout = table::layout(version).expect("layout");
            let runtime = Runtime {
                version,
                layout: &layout,
                module: None,
            };
            let mut naming = Naming::default();
            for _ in 0..300 {
                let first_line = next() as i32;
                let copied = next() as u32;
                let mut parts = [200u64, 330, 260].map(|n| {
                    let len = next() % n;
                    (0..len).map(|_| next() as u8).collect::<Vec<u8>>()
                });
                let raw = RawCode {
                    first_line,
                    copied,
                    name: std::mem::take(&mut parts[0]),
                    filename: std::mem::take(&mut parts[1]),
                    linetable: std::mem::take(&mut parts[2]),
                };
                let code = next() % 4;
                naming.take_codes((1, 1), runtime, [(code, &raw)]);
                let frames: Vec<RawInterpFrame> = (0..next() % 8)
                    .map(|_| RawInterpFrame {
                        code: next() % 4,
                        instruction: next(),
                        marker: next() as u8 % 5,
                    })
                    .collect();
                // Then every stack splices into frames that all have a text name
                for frame in naming.splice_stack((1, 1), runtime, &native, &frames) {
                    assert!(!frame.text_name().is_empty());
                }
            }
        }
    }
}
