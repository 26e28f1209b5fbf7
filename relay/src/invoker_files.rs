//! Files named on the command line, read with the rights of the user who ran `sudo`.
//!
//! `record` starts as root, and a sudo rule for it must not turn into a way to read root's
//! files: a config file that does not parse is quoted in the error, and a TLS key or CA file
//! would be sent to an endpoint the user chose. So while root runs on behalf of a `sudo` user
//! (`SUDO_UID`/`SUDO_GID`, not 0), each such file is opened with that user's filesystem ids
//! (`setfsuid`/`setfsgid`, which change only this thread's file access checks, and only for the
//! open), and an open that user could not make fails as it would for them. The supplementary
//! groups stay root's (under sudo, usually group 0 alone): changing them would change every
//! thread's.

use std::{fs, io, path::Path};

use nix::unistd::{setfsgid, setfsuid, Gid, Uid};

use crate::sink::files::writer::Owner;

/// The `sudo` user whose rights apply to files named on the command line: set only when this
/// process runs as root for someone else.
pub(crate) fn invoker() -> Option<Owner> {
    Owner::from_sudo(&|name| std::env::var(name).ok()).filter(|owner| !owner.uid.is_root())
}

/// Reads the file at `path` as `invoker` would (see the module header); as ourselves when
/// `None`.
pub(crate) fn read(path: &Path, invoker: Option<Owner>) -> io::Result<Vec<u8>> {
    let Some(owner) = invoker else {
        return fs::read(path);
    };
    let _ids = FsIds::become_(owner)?;
    fs::read(path).map_err(|err| match err.kind() {
        io::ErrorKind::PermissionDenied => io::Error::new(
            err.kind(),
            format!(
                "uid {}, who ran sudo, may not read it (files named on the command line are \
                 read with the rights of the user who ran sudo)",
                owner.uid
            ),
        ),
        _ => err,
    })
}

/// [`read`] as UTF-8 text.
pub(crate) fn read_to_string(path: &Path, invoker: Option<Owner>) -> io::Result<String> {
    String::from_utf8(read(path, invoker)?)
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err.utf8_error()))
}

/// This thread's filesystem ids switched to another user's until dropped.
struct FsIds {
    uid: Uid,
    gid: Gid,
}

/// Asks for no change: `setfsuid`/`setfsgid` with -1 only return the current id.
const QUERY: u32 = u32::MAX;

impl FsIds {
    fn become_(owner: Owner) -> io::Result<Self> {
        // The group, then the user; undone in the reverse order.
        let gid = setfsgid(owner.gid);
        let uid = setfsuid(owner.uid);
        let saved = Self { uid, gid };
        // setfsuid(2) reports no error: read the ids back.
        let now_uid = setfsuid(Uid::from_raw(QUERY));
        let now_gid = setfsgid(Gid::from_raw(QUERY));
        if now_uid != owner.uid || now_gid != owner.gid {
            return Err(io::Error::other(format!(
                "could not take uid {} gid {} to read a file named on the command line",
                owner.uid, owner.gid
            )));
        }
        Ok(saved)
    }
}

impl Drop for FsIds {
    fn drop(&mut self) {
        setfsuid(self.uid);
        setfsgid(self.gid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_file_the_invoking_user_cannot_read_is_not_read() {
        if !Uid::effective().is_root() {
            return; // only root can read as someone else
        }
        // Given a root-only file and a world-readable one
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let secret = tmp.path().join("secret");
        fs::write(&secret, "root:hash").unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
        let public = tmp.path().join("public");
        fs::write(&public, "exporters: {}").unwrap();
        fs::set_permissions(&public, fs::Permissions::from_mode(0o644)).unwrap();
        let user = Some(Owner {
            uid: Uid::from_raw(1000),
            gid: Gid::from_raw(1000),
        });
        // Then the user reads the public one only, and root both
        let denied = read(&secret, user).unwrap_err();
        assert_eq!(denied.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(read_to_string(&public, user).unwrap(), "exporters: {}");
        assert_eq!(read(&secret, None).unwrap(), b"root:hash");
        // And this thread is root for files again afterwards
        assert_eq!(setfsuid(Uid::from_raw(QUERY)), Uid::from_raw(0));
        assert_eq!(setfsgid(Gid::from_raw(QUERY)), Gid::from_raw(0));
    }
}
