//! Builds the eBPF program of `sampler-ebpf/` for bpfel-unknown-none (shared/TOOLCHAIN.md).
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let ebpf_dir = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("sampler has no parent directory"))?
        .join("sampler-ebpf");
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    let package = aya_build::Package {
        name: "ember-sampler-ebpf",
        root_dir,
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}
