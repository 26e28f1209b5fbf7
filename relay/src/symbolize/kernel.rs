//! Kernel symbols from a /proc/kallsyms descriptor the privileged sampler opened (an fd opened by
//! root shows real addresses to whoever holds it). Parsed here, in the unprivileged relay.
//!
//! The descriptor comes from the peer and may be anything (`/dev/zero`, a pipe): it is read in
//! chunks, line by line, at most [`MAX_KALLSYMS_BYTES`] in total, and an overlong line is skipped,
//! so memory stays bounded by the symbols kept.

use std::{
    fs::File,
    io::{Read as _, Seek as _, SeekFrom},
    os::fd::OwnedFd,
    sync::Arc,
};

/// Most bytes read from the passed kallsyms (a real one is a few MiB to about 20 MiB).
pub const MAX_KALLSYMS_BYTES: u64 = 64 << 20;
/// Longest kallsyms line kept; longer ones are skipped (real lines are under 200 bytes).
const MAX_LINE_BYTES: usize = 4096;

/// Sorted kernel text symbols.
#[derive(Debug, Default)]
pub struct KernelSymbols {
    /// (address, name), sorted by address.
    symbols: Vec<(u64, Arc<str>)>,
}

/// Why the kernel symbols are unusable.
#[derive(Debug, thiserror::Error)]
pub enum KallsymsError {
    #[error("reading the passed /proc/kallsyms descriptor: {0}")]
    Read(#[from] std::io::Error),
    #[error(
        "the passed /proc/kallsyms descriptor holds more than {cap} bytes (the relay's cap); \
         it is not a real kallsyms, kernel frames stay unnamed"
    )]
    TooLarge { cap: u64 },
    #[error(
        "/proc/kallsyms shows only zero addresses: it was not opened with privileges \
         (kptr_restrict); kernel frames stay unnamed. Run ember-sampler as root"
    )]
    Restricted,
}

impl KernelSymbols {
    /// Reads the file from its start (the descriptor may have been read before), at most
    /// [`MAX_KALLSYMS_BYTES`].
    pub fn from_fd(fd: OwnedFd) -> Result<Self, KallsymsError> {
        Self::from_fd_capped(fd, MAX_KALLSYMS_BYTES)
    }

    fn from_fd_capped(fd: OwnedFd, cap: u64) -> Result<Self, KallsymsError> {
        let mut file = File::from(fd);
        file.seek(SeekFrom::Start(0))?;
        let mut symbols: Vec<(u64, Arc<str>)> = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        // The unfinished line carried over between chunks; `skipping` while an overlong line ends.
        let mut line: Vec<u8> = Vec::with_capacity(MAX_LINE_BYTES);
        let mut skipping = false;
        let mut total: u64 = 0;
        loop {
            let n = match file.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err.into()),
            };
            total = total.saturating_add(n as u64);
            if total > cap {
                return Err(KallsymsError::TooLarge { cap });
            }
            for piece in chunk[..n].split_inclusive(|&b| b == b'\n') {
                let ends = piece.last() == Some(&b'\n');
                if !skipping {
                    if line.len() + piece.len() > MAX_LINE_BYTES {
                        line.clear();
                        skipping = true;
                    } else {
                        line.extend_from_slice(piece);
                    }
                }
                if ends {
                    if !skipping {
                        parse_line(&String::from_utf8_lossy(&line), &mut symbols);
                    }
                    line.clear();
                    skipping = false;
                }
            }
        }
        if !skipping {
            parse_line(&String::from_utf8_lossy(&line), &mut symbols);
        }
        let symbols = Self::sorted(symbols);
        if symbols.symbols.is_empty() {
            return Err(KallsymsError::Restricted);
        }
        Ok(symbols)
    }

    /// Parses kallsyms text: `address type name [module]`; keeps text symbols with an address.
    #[cfg(test)]
    pub fn parse(text: &str) -> Self {
        let mut symbols: Vec<(u64, Arc<str>)> = Vec::new();
        for line in text.lines() {
            parse_line(line, &mut symbols);
        }
        Self::sorted(symbols)
    }

    fn sorted(mut symbols: Vec<(u64, Arc<str>)>) -> Self {
        symbols.sort_by_key(|(addr, _)| *addr);
        symbols.dedup_by_key(|(addr, _)| *addr);
        symbols.shrink_to_fit();
        Self { symbols }
    }

    /// The function containing `addr`: the nearest symbol at or below it.
    pub fn lookup(&self, addr: u64) -> Option<&Arc<str>> {
        let i = self.symbols.partition_point(|(start, _)| *start <= addr);
        if i == 0 {
            return None;
        }
        Some(&self.symbols[i - 1].1)
    }

    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
}

/// Keeps the text symbol of one kallsyms line, if it is one with an address.
fn parse_line(line: &str, symbols: &mut Vec<(u64, Arc<str>)>) {
    let mut fields = line.split_ascii_whitespace();
    let (Some(addr), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next()) else {
        return;
    };
    if !matches!(kind, "t" | "T" | "w" | "W") {
        return;
    }
    let Ok(addr) = u64::from_str_radix(addr, 16) else {
        return;
    };
    if addr == 0 {
        return;
    }
    symbols.push((addr, Arc::from(name)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_symbol_below() {
        let text = "\
ffffffff81000000 T _stext
ffffffff81000100 t do_one\t[ext4]
0000000000000000 A fixed_percpu_data
ffffffff81000200 D some_data
ffffffff81000300 T __x64_sys_write
";
        let syms = KernelSymbols::parse(text);
        assert_eq!(syms.len(), 3);
        assert_eq!(
            syms.lookup(0xffffffff81000150).map(|s| &**s),
            Some("do_one")
        );
        assert_eq!(
            syms.lookup(0xffffffff81000310).map(|s| &**s),
            Some("__x64_sys_write")
        );
        assert_eq!(syms.lookup(0x1000), None);
    }

    #[test]
    fn restricted_kallsyms_is_empty() {
        let syms = KernelSymbols::parse("0000000000000000 T _stext\n0000000000000000 T foo\n");
        assert!(syms.is_empty());
    }

    #[test]
    fn dev_zero_hits_the_cap_instead_of_exhausting_memory() {
        // Given a peer that passes /dev/zero as its kallsyms
        let fd = OwnedFd::from(File::open("/dev/zero").expect("open /dev/zero"));
        // When it is read
        let err = KernelSymbols::from_fd(fd).expect_err("endless input");
        // Then reading stops at the cap with an error naming it
        assert!(matches!(err, KallsymsError::TooLarge { cap } if cap == MAX_KALLSYMS_BYTES));
        assert!(
            err.to_string().contains(&MAX_KALLSYMS_BYTES.to_string()),
            "{err}"
        );
    }

    #[test]
    fn streamed_reading_matches_parsing_and_skips_overlong_lines() {
        // Given a file with real lines around a line longer than any real one
        use std::io::Write as _;
        let mut file = tempfile::tempfile().expect("temp file");
        write!(
            file,
            "ffffffff81000000 T _stext\n{}\nffffffff81000300 T __x64_sys_write",
            "f".repeat(3 * MAX_LINE_BYTES)
        )
        .expect("write");
        // When it is read through its descriptor with a cap above its size
        let syms = KernelSymbols::from_fd_capped(OwnedFd::from(file), 1 << 20).expect("symbols");
        // Then both real symbols are there, the last one without a trailing newline too
        assert_eq!(syms.len(), 2);
        assert_eq!(
            syms.lookup(0xffffffff81000310).map(|s| &**s),
            Some("__x64_sys_write")
        );
    }

    #[test]
    fn a_pipe_is_refused_without_blocking_memory() {
        // Given a pipe (cannot seek) as the kallsyms descriptor
        let (read, _write) = nix::unistd::pipe().expect("pipe");
        // Then it is an error, not a hang or an allocation
        assert!(matches!(
            KernelSymbols::from_fd(read),
            Err(KallsymsError::Read(_))
        ));
    }
}
