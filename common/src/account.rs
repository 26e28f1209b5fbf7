//! The value of a user flag (an account name or a number) as the identity a process becomes or
//! checks: both binaries take such flags (`ember-sampler --user` and `--relay-uid`,
//! `ember-relay record --user`) and read them the same way. Looks accounts up through NSS
//! (passwd), so call it before a seccomp filter is installed.

use anyhow::Context as _;
use nix::unistd::{Uid, User};

/// The account a user flag named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The account name, or the number for a uid without one.
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Resolves `user`, given to `flag`: an account name, or a uid with or without a passwd entry
/// (without one its gid is the same number, e.g. a relay run with a dedicated numeric uid in a
/// container).
pub fn resolve_account(flag: &str, user: &str) -> anyhow::Result<Account> {
    if let Ok(uid) = user.parse::<u32>() {
        let account = User::from_uid(Uid::from_raw(uid))
            .with_context(|| format!("looking up uid {uid} for {flag}"))?;
        return Ok(match account {
            Some(account) => Account {
                name: account.name,
                uid,
                gid: account.gid.as_raw(),
            },
            None => Account {
                name: uid.to_string(),
                uid,
                gid: uid,
            },
        });
    }
    let account = User::from_name(user)
        .with_context(|| format!("looking up user {user} for {flag}"))?
        .with_context(|| {
            format!(
                "{flag} {user}: no such user; create it, or pass a numeric uid (its gid is the \
                 same number)"
            )
        })?;
    Ok(Account {
        name: account.name,
        uid: account.uid.as_raw(),
        gid: account.gid.as_raw(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_numeric_user_without_passwd_entry_gets_the_same_gid() {
        let numeric = resolve_account("--user", "4000123").expect("resolves");
        assert_eq!((numeric.uid, numeric.gid), (4_000_123, 4_000_123));
        assert_eq!(numeric.name, "4000123");
        let root = resolve_account("--user", "root").expect("root");
        assert_eq!((root.name.as_str(), root.uid, root.gid), ("root", 0, 0));
        assert_eq!(resolve_account("--user", "0").expect("uid 0").name, "root");
        let err = resolve_account("--user", "no-such-user-ember").expect_err("no such user");
        assert!(format!("{err:#}").contains("no such user"), "{err:#}");
    }
}
