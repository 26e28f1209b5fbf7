//! Kernel symbols from a /proc/kallsyms descriptor the privileged sampler opened (an fd opened by
//! root shows real addresses to whoever holds it). Parsed here, in the unprivileged relay.

use std::{
    fs::File,
    io::{Read as _, Seek as _, SeekFrom},
    os::fd::OwnedFd,
    sync::Arc,
};

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
        "/proc/kallsyms shows only zero addresses: it was not opened with privileges \
         (kptr_restrict); kernel frames stay unnamed. Run ember-sampler as root"
    )]
    Restricted,
}

impl KernelSymbols {
    /// Reads the whole file from its start (the descriptor may have been read before).
    pub fn from_fd(fd: OwnedFd) -> Result<Self, KallsymsError> {
        let mut file = File::from(fd);
        file.seek(SeekFrom::Start(0))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let symbols = Self::parse(&text);
        if symbols.symbols.is_empty() {
            return Err(KallsymsError::Restricted);
        }
        Ok(symbols)
    }

    /// Parses kallsyms text: `address type name [module]`; keeps text symbols with an address.
    pub fn parse(text: &str) -> Self {
        let mut symbols: Vec<(u64, Arc<str>)> = Vec::new();
        for line in text.lines() {
            let mut fields = line.split_ascii_whitespace();
            let (Some(addr), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if addr == 0 {
                continue;
            }
            symbols.push((addr, Arc::from(name)));
        }
        symbols.sort_by_key(|(addr, _)| *addr);
        symbols.dedup_by_key(|(addr, _)| *addr);
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

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
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
}
