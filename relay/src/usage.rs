//! The error of a command line that cannot work, shared by the command-line parser (`cli`) and
//! the commands that find the fault only when they start (`record`): both refuse it alike, with
//! clap's exit status for usage errors. Its own module so the commands need nothing of `cli`.

use std::fmt;

/// A command line that cannot work (a process that does not exist, an output directory that
/// cannot be written): refused before anything starts, with exit status [`USAGE_EXIT`] as clap's
/// own usage errors. The message names the flag and the fix.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Exit status of a refused command line (clap uses the same for its own usage errors).
pub(crate) const USAGE_EXIT: u8 = 2;
