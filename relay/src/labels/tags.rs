//! Static tags: `--tags "k1=v1;k2=v2"` (the OpenTelemetry eBPF profiler's flag, with `key=value`
//! entries) and the config file's `labels:` map, added to every profile; both checked alike.
//!
//! Tags are the user's own input, so a bad entry is an error naming it (the relay refuses to
//! start) rather than a silent skip. Keys are attribute names: a letter or `_` first, then letters,
//! digits, `_`, `.`, `-`, `/`; the `__` prefix is reserved for meta labels. Pure: no I/O.

use super::{is_meta, Labels};

/// Where a tag was written, for errors.
pub const FLAG: &str = "--tags";
pub const CONFIG: &str = "labels:";

/// A tag that cannot be used; `origin` is [`FLAG`] or [`CONFIG`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TagsError {
    #[error("{origin} entry {entry:?}: expected key=value")]
    NoEquals { origin: &'static str, entry: String },
    #[error("{origin} entry {entry:?}: {key:?} is not a valid attribute name (a letter or '_' first, then letters, digits, '_', '.', '-', '/')")]
    BadKey {
        origin: &'static str,
        entry: String,
        key: String,
    },
    #[error("{origin} entry {entry:?}: names starting with \"__\" are reserved for meta labels")]
    MetaKey { origin: &'static str, entry: String },
    #[error("{origin} entry {entry:?}: empty value")]
    EmptyValue { origin: &'static str, entry: String },
}

/// Parses `--tags`: entries separated by `;`, whitespace around keys and values trimmed, empty
/// entries ignored, a later key replacing an earlier one.
pub fn parse(text: &str) -> Result<Labels, TagsError> {
    let mut labels = Labels::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once('=').ok_or_else(|| TagsError::NoEquals {
            origin: FLAG,
            entry: entry.to_owned(),
        })?;
        let (key, value) = checked(FLAG, entry, key, value)?;
        labels.set(key, value);
    }
    Ok(labels)
}

/// Checks the config file's `labels:` map. Merge the `--tags` labels after these: the flag wins.
pub fn from_map<'a>(
    map: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Labels, TagsError> {
    let mut labels = Labels::new();
    for (key, value) in map {
        let entry = format!("{key}: {value}");
        let (key, value) = checked(CONFIG, &entry, key, value)?;
        labels.set(key, value);
    }
    Ok(labels)
}

/// One entry's key and value, trimmed and checked.
fn checked<'a>(
    origin: &'static str,
    entry: &str,
    key: &'a str,
    value: &'a str,
) -> Result<(&'a str, &'a str), TagsError> {
    let (key, value) = (key.trim(), value.trim());
    let entry = || entry.to_owned();
    if is_meta(key) {
        return Err(TagsError::MetaKey {
            origin,
            entry: entry(),
        });
    }
    if !is_attribute_name(key) {
        return Err(TagsError::BadKey {
            origin,
            entry: entry(),
            key: key.to_owned(),
        });
    }
    if value.is_empty() {
        return Err(TagsError::EmptyValue {
            origin,
            entry: entry(),
        });
    }
    Ok((key, value))
}

/// Whether `name` is usable as an attribute name (see the module header).
pub fn is_attribute_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_parse() {
        let labels = parse(" env = prod ;team=payments;; region=eu-west-1;team=checkout;").unwrap();
        assert_eq!(
            labels.to_string(),
            r#"{env="prod", region="eu-west-1", team="checkout"}"#
        );
        assert_eq!(
            parse("k8s.cluster.name=c1;app.kubernetes.io/part-of=shop;url=http://x/?a=b")
                .unwrap()
                .to_string(),
            r#"{app.kubernetes.io/part-of="shop", k8s.cluster.name="c1", url="http://x/?a=b"}"#
        );
        assert_eq!(parse("").unwrap(), Labels::new());
    }

    #[test]
    fn bad_tags_name_the_entry() {
        let err = |text| parse(text).unwrap_err();
        assert_eq!(
            err("env"),
            TagsError::NoEquals {
                origin: FLAG,
                entry: "env".into()
            }
        );
        assert_eq!(
            err("ok=1;9lives=x"),
            TagsError::BadKey {
                origin: FLAG,
                entry: "9lives=x".into(),
                key: "9lives".into()
            }
        );
        assert!(matches!(err("a b=c"), TagsError::BadKey { .. }));
        assert!(matches!(err("=c"), TagsError::BadKey { .. }));
        assert!(matches!(err("__meta_x=1"), TagsError::MetaKey { .. }));
        assert!(matches!(err("env= "), TagsError::EmptyValue { .. }));
        assert_eq!(
            err("env").to_string(),
            "--tags entry \"env\": expected key=value"
        );
    }

    #[test]
    fn config_labels_checked_alike_and_the_flag_wins() {
        let mut labels = from_map([("team", "payments"), ("note", "a;b=c")]).unwrap();
        // A value may hold `;` and `=` in the file: only the flag's syntax splits on them.
        assert_eq!(labels.get("note"), Some("a;b=c"));
        labels.merge(&parse("team=checkout").unwrap());
        assert_eq!(labels.get("team"), Some("checkout"));
        let err = from_map([("bad key", "x")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "labels: entry \"bad key: x\": \"bad key\" is not a valid attribute name (a letter or '_' first, then letters, digits, '_', '.', '-', '/')"
        );
        assert!(matches!(
            from_map([("k", " ")]),
            Err(TagsError::EmptyValue { origin: CONFIG, .. })
        ));
    }
}
