//! Static tags: `--tags "k1=v1;k2=v2"` (the OpenTelemetry eBPF profiler's flag, with `key=value`
//! entries) added to every profile.
//!
//! The flag is the user's own input, so a bad entry is an error naming it (the relay refuses to
//! start) rather than a silent skip. Keys are attribute names: a letter or `_` first, then letters,
//! digits, `_`, `.`, `-`, `/`; the `__` prefix is reserved for meta labels. Pure: no I/O.

use super::{is_meta, Labels};

/// A `--tags` entry that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TagsError {
    #[error("--tags entry {entry:?}: expected key=value")]
    NoEquals { entry: String },
    #[error("--tags entry {entry:?}: {key:?} is not a valid attribute name (a letter or '_' first, then letters, digits, '_', '.', '-', '/')")]
    BadKey { entry: String, key: String },
    #[error("--tags entry {entry:?}: names starting with \"__\" are reserved for meta labels")]
    MetaKey { entry: String },
    #[error("--tags entry {entry:?}: empty value")]
    EmptyValue { entry: String },
}

/// Parses `--tags`: entries separated by `;`, whitespace around keys and values trimmed, empty
/// entries ignored, a later key replacing an earlier one.
pub fn parse(text: &str) -> Result<Labels, TagsError> {
    let mut labels = Labels::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let error_entry = || entry.to_owned();
        let (key, value) = entry.split_once('=').ok_or_else(|| TagsError::NoEquals {
            entry: error_entry(),
        })?;
        let (key, value) = (key.trim(), value.trim());
        if is_meta(key) {
            return Err(TagsError::MetaKey {
                entry: error_entry(),
            });
        }
        if !is_attribute_name(key) {
            return Err(TagsError::BadKey {
                entry: error_entry(),
                key: key.to_owned(),
            });
        }
        if value.is_empty() {
            return Err(TagsError::EmptyValue {
                entry: error_entry(),
            });
        }
        labels.set(key, value);
    }
    Ok(labels)
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
                entry: "env".into()
            }
        );
        assert_eq!(
            err("ok=1;9lives=x"),
            TagsError::BadKey {
                entry: "9lives=x".into(),
                key: "9lives".into()
            }
        );
        assert!(matches!(err("a b=c"), TagsError::BadKey { .. }));
        assert!(matches!(err("=c"), TagsError::BadKey { .. }));
        assert_eq!(
            err("__meta_x=1"),
            TagsError::MetaKey {
                entry: "__meta_x=1".into()
            }
        );
        assert_eq!(
            err("env= "),
            TagsError::EmptyValue {
                entry: "env=".into()
            }
        );
        assert!(err("env")
            .to_string()
            .contains("\"env\": expected key=value"));
    }
}
