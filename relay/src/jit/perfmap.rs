//! Reads a perf map (`/tmp/perf-<pid>.map`) incrementally: the text a JIT runtime appends about
//! its code, one `START SIZE name` line per piece of code, START and SIZE in hex, with or
//! without `0x` (the JVM's `Compiler.perfmap` writes it; Node, CPython and .NET do not).
//!
//! The file is the process's own (hostile) text: reads are positional and bounded by the
//! caller; a line longer than [`MAX_LINE_BYTES`] is skipped whole (counted), a line that is not
//! `START SIZE name` is skipped (counted), a name is cut to [`MAX_NAME_BYTES`]. A partial last
//! line is left for the next call (the runtime is still writing it).

use std::{fs::File, os::unix::fs::FileExt as _};

use super::{JitEntry, JitReadError, JitSource};

/// Longest line read; a longer one is skipped whole and counted. JVM signatures of deeply
/// generic code run to a few hundred bytes; V8's names carry a script path.
pub const MAX_LINE_BYTES: usize = 4 << 10;

/// Longest name kept; a longer (but not over-long) line's name is cut at a char boundary.
pub const MAX_NAME_BYTES: usize = 1 << 10;

/// Bytes read per `pread`.
const CHUNK_BYTES: usize = 64 << 10;

/// What a perf map reader skipped, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfMapStats {
    /// Lines that are not `START SIZE name` (or have a zero size, or wrap the address space).
    pub garbage_lines: u64,
    /// Lines longer than [`MAX_LINE_BYTES`], skipped whole.
    pub long_lines: u64,
}

/// An incremental reader of one perf map; its position is the bytes of whole lines consumed.
#[derive(Debug, Default)]
pub struct PerfMapReader {
    /// File offset of the first byte not yet consumed.
    offset: u64,
    /// Inside a line longer than [`MAX_LINE_BYTES`]: its rest is skipped up to its newline.
    skipping: bool,
    pub stats: PerfMapStats,
}

impl PerfMapReader {
    /// The file offset up to which the map was read.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl JitSource for PerfMapReader {
    fn read_new(
        &mut self,
        file: &File,
        max_bytes: u64,
        out: &mut dyn FnMut(JitEntry),
    ) -> Result<u64, JitReadError> {
        let mut consumed = 0u64;
        // Bytes read but not consumed: the start of a line whose newline was not read yet.
        let mut pending: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; CHUNK_BYTES];
        let mut read = 0u64;
        while read < max_bytes {
            let want = usize::try_from(max_bytes - read)
                .unwrap_or(CHUNK_BYTES)
                .min(CHUNK_BYTES);
            let at = self.offset + consumed + pending.len() as u64;
            let n = match file.read_at(&mut chunk[..want], at) {
                Ok(0) => break,
                Ok(n) => n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    self.offset += consumed;
                    return Err(JitReadError::Io(err));
                }
            };
            read += n as u64;
            let mut rest = &chunk[..n];
            while let Some(newline) = rest.iter().position(|&b| b == b'\n') {
                let (head, tail) = rest.split_at(newline);
                rest = &tail[1..];
                let line_len = pending.len() + head.len() + 1;
                consumed += line_len as u64;
                if std::mem::take(&mut self.skipping) {
                    pending.clear();
                    continue;
                }
                if pending.len() + head.len() > MAX_LINE_BYTES {
                    self.stats.long_lines += 1;
                    pending.clear();
                    continue;
                }
                let entry = if pending.is_empty() {
                    parse_line(head)
                } else {
                    pending.extend_from_slice(head);
                    let entry = parse_line(&pending);
                    pending.clear();
                    entry
                };
                match entry {
                    Some(entry) => out(entry),
                    None => self.stats.garbage_lines += 1,
                }
            }
            if self.skipping {
                // The rest of an over-long line: consumed, never kept.
                consumed += rest.len() as u64;
            } else if pending.len() + rest.len() > MAX_LINE_BYTES {
                self.stats.long_lines += 1;
                self.skipping = true;
                consumed += (pending.len() + rest.len()) as u64;
                pending.clear();
            } else {
                pending.extend_from_slice(rest);
            }
        }
        self.offset += consumed;
        Ok(consumed)
    }
}

/// One `START SIZE name` line (without its newline), if it is one.
fn parse_line(line: &[u8]) -> Option<JitEntry> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields = line.splitn(3, |&b| b == b' ');
    let start = hex(fields.next()?)?;
    let size = hex(fields.next()?)?;
    let name = fields.next()?;
    if size == 0 || start.checked_add(size).is_none() || name.is_empty() {
        return None;
    }
    Some(JitEntry {
        start,
        size,
        name: bounded_name(name),
        source: None,
    })
}

fn hex(field: &[u8]) -> Option<u64> {
    let field = field
        .strip_prefix(b"0x")
        .or_else(|| field.strip_prefix(b"0X"))
        .unwrap_or(field);
    if field.is_empty() || field.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(field).ok()?, 16).ok()
}

/// `name` as text (bytes that are not UTF-8 replaced), cut to [`MAX_NAME_BYTES`] at a char
/// boundary with `…` marking the cut.
pub(crate) fn bounded_name(name: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(name).into_owned();
    if text.len() > MAX_NAME_BYTES {
        let mut end = MAX_NAME_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn temp(name: &str) -> (std::path::PathBuf, File) {
        let path =
            std::env::temp_dir().join(format!("ember-perfmap-{}-{name}", std::process::id()));
        let file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("create the map");
        (path, file)
    }

    fn read(reader: &mut PerfMapReader, file: &File, max: u64) -> (Vec<JitEntry>, u64) {
        let mut entries = Vec::new();
        let consumed = reader
            .read_new(file, max, &mut |e| entries.push(e))
            .expect("reads");
        (entries, consumed)
    }

    #[test]
    fn lines_are_read_as_they_are_appended_a_partial_one_waits() {
        // Given a map with two lines (Node's and the JVM's styles) and half of a third
        let (path, mut file) = temp("append");
        file.write_all(b"3ef4b8c0 1a LazyCompile:~hot /app/x.js:3\n0x00007f0000001000 0x0000000000000100 void Main.spin(int)\n7f00 2")
            .expect("write");
        let mut reader = PerfMapReader::default();
        // When read
        let (entries, consumed) = read(&mut reader, &file, 1 << 20);
        // Then both whole lines are entries and the partial one is not consumed
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0],
            JitEntry {
                start: 0x3ef4_b8c0,
                size: 0x1a,
                name: "LazyCompile:~hot /app/x.js:3".into(),
                source: None
            }
        );
        assert_eq!(entries[1].start, 0x7f00_0000_1000);
        assert_eq!(entries[1].name, "void Main.spin(int)");
        assert_eq!(consumed, reader.offset());
        // When the runtime finishes the line, Then the next read hands it over
        file.write_all(b"0 py::alpha:/w.py\n").expect("write");
        let (entries, _) = read(&mut reader, &file, 1 << 20);
        assert_eq!(entries.len(), 1);
        assert_eq!((entries[0].start, entries[0].size), (0x7f00, 0x20));
        assert_eq!(entries[0].name, "py::alpha:/w.py");
        // And nothing is read twice
        assert!(read(&mut reader, &file, 1 << 20).0.is_empty());
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn garbage_and_over_long_lines_are_skipped_and_counted() {
        // Given garbage, an over-long line (split over reads), a zero size, a wrapping range
        let (path, mut file) = temp("garbage");
        let long = format!("1000 10 {}\n", "x".repeat(MAX_LINE_BYTES * 40));
        let text = format!(
            "not a line\n\n1000 zz f\n{long}2000 0 empty\nffffffffffffffff 2 wraps\n\u{0}\u{1}\n3000 10 ok\n"
        );
        file.write_all(text.as_bytes()).expect("write");
        let mut reader = PerfMapReader::default();
        // When read in small steps
        let mut entries = Vec::new();
        for _ in 0..100 {
            entries.extend(read(&mut reader, &file, 5_000).0);
        }
        // Then only the good line is an entry, the others are counted
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].name, "ok");
        assert_eq!(reader.stats.long_lines, 1);
        assert_eq!(reader.stats.garbage_lines, 6);
        assert_eq!(reader.offset(), text.len() as u64);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_read_stops_at_its_bound_and_names_are_cut() {
        // Given 1,000 lines with a 2 KiB name each
        let (path, mut file) = temp("bound");
        let name = "é".repeat(1_000);
        for i in 0..1_000u64 {
            writeln!(file, "{:x} 10 {name}", 0x1000 + i * 0x10).expect("write");
        }
        let mut reader = PerfMapReader::default();
        // When read with a 100 KB bound, Then at most that is read
        let (entries, consumed) = read(&mut reader, &file, 100_000);
        assert!(consumed <= 100_000 && !entries.is_empty());
        // And each name is cut to the bound at a char boundary, marked
        assert!(entries
            .iter()
            .all(|e| e.name.len() <= MAX_NAME_BYTES + 3 && e.name.ends_with('…')));
        let _ = std::fs::remove_file(path);
    }
}
