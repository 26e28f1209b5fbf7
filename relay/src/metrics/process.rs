//! The relay process's own resources, read from /proc/self at scrape time (on the metrics
//! server's thread, never the driver's) under the names every Prometheus client library uses
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, ...), so
//! the usual dashboards and alerts work, and a soak's RSS and descriptor curves can be scraped.
//!
//! /proc/self stays readable to the process itself when it is non-dumpable and under systemd's
//! `ProtectProc=invisible` / `ProcSubset=pid`; anything that cannot be read is left out.

use std::fs;

/// What one scrape read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

/// Reads this process's figures; `None` when /proc/self/stat cannot be read or parsed.
pub(crate) fn read() -> Option<ProcessStats> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let mut stats = parse_stat(&stat, u64::try_from(ticks).ok()?, u64::try_from(page).ok()?)?;
    // Bounded by the descriptor limit itself; counting is a directory walk, no file is opened.
    stats.open_fds = fs::read_dir("/proc/self/fd")
        .ok()
        .map(|dir| dir.count().saturating_sub(1) as u64);
    stats.max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft);
    Some(stats)
}

/// Parses /proc/self/stat (proc(5)): the fields after the command name, which is in
/// parentheses and may hold spaces or parentheses itself, hence the split at the last `)`.
fn parse_stat(text: &str, ticks_per_second: u64, page_bytes: u64) -> Option<ProcessStats> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field n of proc(5) (1-based, `pid` is 1 and `comm` 2) is fields[n - 3].
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let (utime, stime) = (field(14)?, field(15)?);
    Some(ProcessStats {
        cpu_seconds: (utime + stime) as f64 / ticks_per_second.max(1) as f64,
        threads: field(20)?,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)?.saturating_mul(page_bytes),
        open_fds: None,
        max_fds: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis, as a process may choose.
        let stat = "4242 (ember (x) relay) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 \
                    7 0 123456 104857600 2560 18446744073709551615";
        let stats = parse_stat(stat, 100, 4096).expect("parses");
        assert_eq!(stats.cpu_seconds, 3.0);
        assert_eq!(stats.threads, 7);
        assert_eq!(stats.virtual_bytes, 104_857_600);
        assert_eq!(stats.resident_bytes, 2560 * 4096);
        assert!(parse_stat("4242 (short) S 1", 100, 4096).is_none());
    }

    #[test]
    fn this_process_reads_as_alive() {
        let stats = read().expect("/proc/self/stat");
        assert!(stats.resident_bytes > 0 && stats.threads >= 1, "{stats:?}");
        assert!(stats.open_fds.is_some_and(|n| n >= 3), "{stats:?}");
        assert!(stats
            .max_fds
            .is_some_and(|n| n >= stats.open_fds.unwrap_or(0)));
    }
}
