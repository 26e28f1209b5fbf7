//! Host labels: `host.name`, `host.id` (the machine id), `os.type`, `host.arch`.
//!
//! The relay runs on the sampled machine (the sampler talks to it over a Unix socket), so the
//! relay's own architecture and machine id are the host's. The host name comes from the sampler's
//! hello when known. [`read_machine_id`] is the only I/O: a bounded read of `/etc/machine-id`
//! (then the D-Bus copy), done once before privileges are dropped.

use std::path::Path;

use super::{keys, read_bounded, Labels};

/// Where systemd and D-Bus keep the machine id, in the order tried.
pub const MACHINE_ID_PATHS: [&str; 2] = ["/etc/machine-id", "/var/lib/dbus/machine-id"];

/// The host facts the labels are made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostFacts {
    pub hostname: String,
    /// `/etc/machine-id`'s text, if it could be read.
    pub machine_id: Option<String>,
    /// Rust's name of the architecture (`std::env::consts::ARCH`).
    pub arch: String,
}

/// The host labels of `facts`.
pub fn labels(facts: &HostFacts) -> Labels {
    let mut labels = Labels::new();
    labels.set(keys::HOST_NAME, facts.hostname.trim());
    if let Some(id) = facts.machine_id.as_deref().and_then(machine_id) {
        labels.set(keys::HOST_ID, id);
    }
    labels.set(keys::OS_TYPE, "linux");
    labels.set(keys::HOST_ARCH, host_arch(&facts.arch));
    labels
}

/// A machine id file's text checked: 32 lowercase hex digits and a newline (machine-id(5)); an
/// empty or "uninitialized" file is no id.
pub fn machine_id(text: &str) -> Option<&str> {
    let id = text.trim();
    (id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(id)
}

/// The first machine id file of `paths` that reads, at most 64 bytes of it.
pub fn read_machine_id(paths: &[&Path]) -> Option<String> {
    paths.iter().find_map(|path| {
        let (text, _) = read_bounded(path, 64).ok()?;
        machine_id(&text).map(str::to_owned)
    })
}

/// The `host.arch` value (semantic conventions) of a Rust architecture name; unknown ones pass as
/// they are.
pub fn host_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm32",
        "x86" => "x86",
        "powerpc" => "ppc32",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "loongarch64" => "loong64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4c4c4544004d3510804bb4c04f4e3732";

    #[test]
    fn host_labels() {
        let labels = labels(&HostFacts {
            hostname: "node-1\n".into(),
            machine_id: Some(format!("{ID}\n")),
            arch: "x86_64".into(),
        });
        assert_eq!(
            labels.to_string(),
            format!(
                r#"{{host.arch="amd64", host.id="{ID}", host.name="node-1", os.type="linux"}}"#
            )
        );
        let labels = super::labels(&HostFacts {
            hostname: String::new(),
            machine_id: Some("uninitialized\n".into()),
            arch: "aarch64".into(),
        });
        assert_eq!(labels.get(keys::HOST_ID), None);
        assert_eq!(labels.get(keys::HOST_NAME), None);
        assert_eq!(labels.get(keys::HOST_ARCH), Some("arm64"));
    }

    #[test]
    fn machine_id_files_checked_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (empty, huge, good) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        std::fs::write(&empty, "").unwrap();
        // A huge file is never read whole, and what is read is not an id.
        std::fs::write(&huge, "a".repeat(1 << 20)).unwrap();
        std::fs::write(&good, format!("{ID}\n")).unwrap();
        let missing = dir.path().join("missing");
        assert_eq!(
            read_machine_id(&[&missing, &empty, &huge, &good]),
            Some(ID.to_owned())
        );
        assert_eq!(read_machine_id(&[&missing, &huge]), None);
        assert_eq!(machine_id(&ID.to_uppercase()), None);
    }
}
