//! The `--unwind` flag both binaries take, in one copy: the two sides must agree on it (`record`
//! passes the relay's value on to the sampler it starts).

/// How user stacks are walked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindMode {
    /// Frame pointers only (`bpf_get_stackid`): the relay compiles and sends no unwind tables,
    /// the sampler refuses any.
    Fp,
    /// Unwind tables the relay compiles from each passed binary's CFI (.eh_frame and
    /// .debug_frame), checked and kept by the sampler (the default).
    #[default]
    Dwarf,
}

impl UnwindMode {
    /// The flag's value, as the other side's `--unwind` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fp => "fp",
            Self::Dwarf => "dwarf",
        }
    }
}
