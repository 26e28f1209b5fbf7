//! Which ember-sampler `record` may start as root: a file that only root can change.
//!
//! `record` runs as root and starts the sampler as root, so whoever can change the sampler's
//! file, or any directory on its path, can run code as root; a `sudo` rule for
//! `ember-relay record` would hand that to anyone able to name a file (`--sampler PATH`). The
//! binary is therefore started only when the file and every directory above it (after symlinks
//! are resolved) are owned by root and writable by no one else: group write is allowed for
//! group 0 only, and a directory others may write into only with the sticky bit (as /tmp has),
//! where nobody else can rename or remove what root put there. The resolved path is the one
//! executed, so no symlink is followed between the check and the start.

use std::{
    fs,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// Write permission for the file's group, and for others.
const GROUP_WRITE: u32 = 0o020;
const OTHER_WRITE: u32 = 0o002;
/// The sticky bit of a directory: only an entry's owner (or root) may rename or remove it.
const STICKY: u32 = 0o1000;

/// Why a sampler binary is not started.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Untrusted {
    #[error("{path}: {why}")]
    Unusable { path: PathBuf, why: String },
    #[error("{path} is owned by uid {uid}, not root")]
    NotRoots { path: PathBuf, uid: u32 },
    #[error("{path} is writable by {who} (mode {mode:o})")]
    Writable {
        path: PathBuf,
        who: &'static str,
        mode: u32,
    },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
}

/// Resolves `path` (a bare name is looked up in `search_path`, as `execvp` would) and returns
/// the resolved path when only root can change what it runs.
pub(crate) fn trusted(path: &Path, search_path: &str) -> Result<PathBuf, Untrusted> {
    let named = if path.components().count() == 1 && !path.is_absolute() {
        search_path
            .split(':')
            .filter(|dir| !dir.is_empty())
            .map(|dir| Path::new(dir).join(path))
            .find(|candidate| candidate.is_file())
            .ok_or_else(|| Untrusted::Unusable {
                path: path.to_path_buf(),
                why: "not found on $PATH".to_owned(),
            })?
    } else {
        path.to_path_buf()
    };
    let resolved = fs::canonicalize(&named).map_err(|err| Untrusted::Unusable {
        path: named.clone(),
        why: err.to_string(),
    })?;
    let meta = metadata(&resolved)?;
    if !meta.is_file() {
        return Err(Untrusted::NotAFile { path: resolved });
    }
    only_root_writes(&resolved, &meta, false)?;
    for dir in resolved.ancestors().skip(1) {
        only_root_writes(dir, &metadata(dir)?, true)?;
    }
    Ok(resolved)
}

fn metadata(path: &Path) -> Result<fs::Metadata, Untrusted> {
    fs::symlink_metadata(path).map_err(|err| Untrusted::Unusable {
        path: path.to_path_buf(),
        why: err.to_string(),
    })
}

/// Whether only root can change `path` (owner root; no group write but group 0's; no write for
/// others, except into a sticky directory).
fn only_root_writes(path: &Path, meta: &fs::Metadata, directory: bool) -> Result<(), Untrusted> {
    let mode = meta.permissions().mode();
    if meta.uid() != 0 {
        return Err(Untrusted::NotRoots {
            path: path.to_path_buf(),
            uid: meta.uid(),
        });
    }
    let writable = |who| Untrusted::Writable {
        path: path.to_path_buf(),
        who,
        mode: mode & 0o7777,
    };
    if mode & GROUP_WRITE != 0 && meta.gid() != 0 {
        return Err(writable("its group"));
    }
    if mode & OTHER_WRITE != 0 && !(directory && mode & STICKY != 0) {
        return Err(writable("everyone"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{chown, symlink};

    fn executable(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn is_root() -> bool {
        nix::unistd::Uid::effective().is_root()
    }

    #[test]
    fn system_binaries_are_trusted_and_found_on_path() {
        // Given /bin/sh (root's, in root's directories)
        let sh = trusted(Path::new("/bin/sh"), "").expect("/bin/sh");
        // Then it is trusted as its resolved path, and the bare name is found on $PATH
        assert!(sh.is_absolute());
        assert_eq!(trusted(Path::new("sh"), "/nonexistent:/bin"), Ok(sh));
        assert!(matches!(
            trusted(Path::new("sh"), "/nonexistent"),
            Err(Untrusted::Unusable { .. })
        ));
    }

    #[test]
    fn a_file_another_user_owns_or_can_write_is_refused() {
        if !is_root() {
            return; // only root can make root-owned files to compare with
        }
        // Given a root-owned 0700 directory (not writable by others) in /tmp (sticky)
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let good = executable(tmp.path(), "good", 0o755);
        let everyones = executable(tmp.path(), "everyones", 0o757);
        let groups = executable(tmp.path(), "groups", 0o775);
        chown(&groups, None, Some(100)).unwrap();
        let users = executable(tmp.path(), "users", 0o755);
        chown(&users, Some(1000), None).unwrap();
        let link = tmp.path().join("link");
        symlink(&users, &link).unwrap();
        // Then root's own file is trusted, and every other one refused with its reason
        assert_eq!(trusted(&good, ""), Ok(fs::canonicalize(&good).unwrap()));
        assert!(matches!(
            trusted(&everyones, ""),
            Err(Untrusted::Writable {
                who: "everyone",
                ..
            })
        ));
        assert!(matches!(
            trusted(&groups, ""),
            Err(Untrusted::Writable {
                who: "its group",
                ..
            })
        ));
        assert!(matches!(
            trusted(&users, ""),
            Err(Untrusted::NotRoots { uid: 1000, .. })
        ));
        assert!(matches!(
            trusted(&link, ""),
            Err(Untrusted::NotRoots { uid: 1000, .. })
        ));
        assert!(matches!(
            trusted(tmp.path(), ""),
            Err(Untrusted::NotAFile { .. })
        ));
        // And a root-owned file in a directory everyone can write (not sticky) is refused
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            trusted(&good, ""),
            Err(Untrusted::Writable {
                who: "everyone",
                ..
            })
        ));
        // ... and in a directory another user owns
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        chown(tmp.path(), Some(1000), None).unwrap();
        assert!(matches!(
            trusted(&good, ""),
            Err(Untrusted::NotRoots { uid: 1000, .. })
        ));
    }
}
