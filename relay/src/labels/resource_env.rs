//! A process's own OpenTelemetry resource settings: `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES`, as strings the sampler forwards (its allowlist takes only these
//! two variables from `/proc/PID/environ`; nothing else of the environment reaches the relay).
//!
//! `OTEL_RESOURCE_ATTRIBUTES` follows the OpenTelemetry SDK specification (resource SDK,
//! "Specifying resource information via an environment variable"): `key1=value1,key2=value2`
//! in the W3C Baggage format without properties, whitespace around keys and values trimmed,
//! keys and values percent-decoded (`+` stays `+`), invalid UTF-8 after decoding replaced by
//! U+FFFD. Empty entries (`a=1,,b=2`, a trailing comma) are no entries. The specification says
//! that on any error the entire value is discarded and an error reported: an entry without `=`,
//! with an empty key, or with a `%` not followed by two hex digits makes the parse fail
//! ([`MalformedAttributes`]: the entry's position and the reason), and the process gets none of
//! its attributes (its `OTEL_SERVICE_NAME`, a separate variable, still counts). Names only the
//! relay or the cluster may set ([`super::is_reserved`]) are never labels: they come back apart,
//! as claims. Pure: no I/O; the labels stage logs and counts the error and the claims once per
//! process.

use super::{keys, Labels};

/// A parsed `OTEL_RESOURCE_ATTRIBUTES` value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    /// The attributes in the order written; a key written twice keeps its last value in
    /// [`ResourceAttributes::labels`].
    pub attributes: Vec<(String, String)>,
}

/// Why a whole `OTEL_RESOURCE_ATTRIBUTES` value was discarded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "OTEL_RESOURCE_ATTRIBUTES entry {position} ({entry:?}): {reason}; the whole value is \
     discarded (the OpenTelemetry specification's rule): write key=value pairs separated by ',', \
     with ',', '=', '%' and non-ASCII characters percent-encoded"
)]
pub struct MalformedAttributes {
    /// The entry's position, from 1, counting empty entries.
    pub position: usize,
    /// The entry as written, cut to [`ENTRY_SHOWN_BYTES`].
    pub entry: String,
    pub reason: &'static str,
}

/// Most bytes of a malformed entry shown in the error.
pub const ENTRY_SHOWN_BYTES: usize = 64;

impl ResourceAttributes {
    /// Parses the variable's value; any malformed entry fails the whole value.
    pub fn parse(text: &str) -> Result<Self, MalformedAttributes> {
        let mut parsed = Self::default();
        for (index, entry) in text.split(',').enumerate() {
            if entry.trim().is_empty() {
                continue;
            }
            let attribute = parse_entry(entry).map_err(|reason| MalformedAttributes {
                position: index + 1,
                entry: shown(entry),
                reason,
            })?;
            parsed.attributes.push(attribute);
        }
        Ok(parsed)
    }

    /// The `service.name` attribute, when set and not empty.
    pub fn service_name(&self) -> Option<&str> {
        self.attributes
            .iter()
            .rev()
            .find(|(k, _)| k == keys::SERVICE_NAME)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// The attributes as labels, `service.name` left out (it goes through
    /// [`super::service::service_name`]'s precedence instead), and the names only the relay or
    /// the cluster may set ([`super::is_reserved`]: `k8s.*`, `container.*`, `host.*`,
    /// `process.*`, meta names, ...) too: those are returned apart, sorted and once each, as
    /// the process's claims to drop and count. A process must not pass for another pod,
    /// container, host or user, nor hand relabel rules a fact the relay did not observe.
    pub fn labels(&self) -> (Labels, Vec<String>) {
        let mut claims: Vec<String> = Vec::new();
        let labels = self
            .attributes
            .iter()
            .filter(|(k, _)| k != keys::SERVICE_NAME)
            .filter(|(k, _)| {
                let reserved = super::is_reserved(k);
                if reserved {
                    claims.push(k.clone());
                }
                !reserved
            })
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        claims.sort_unstable();
        claims.dedup();
        (labels, claims)
    }
}

fn parse_entry(entry: &str) -> Result<(String, String), &'static str> {
    let (key, value) = entry
        .split_once('=')
        .ok_or("no '=' between a key and a value")?;
    let key =
        percent_decode(key.trim()).ok_or("a '%' in the key is not followed by two hex digits")?;
    if key.is_empty() {
        return Err("empty key");
    }
    let value = percent_decode(value.trim())
        .ok_or("a '%' in the value is not followed by two hex digits")?;
    Ok((key, value))
}

/// `entry` trimmed and cut to [`ENTRY_SHOWN_BYTES`] at a char boundary, for the error.
fn shown(entry: &str) -> String {
    let entry = entry.trim();
    let mut end = entry.len().min(ENTRY_SHOWN_BYTES);
    while !entry.is_char_boundary(end) {
        end -= 1;
    }
    entry.get(..end).unwrap_or_default().to_owned()
}

/// `%XX` -> the byte 0xXX; `None` for a `%` not followed by two hex digits.
fn percent_decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            // Two hex digits exactly (`from_str_radix` alone would also take "+1").
            let (high, low) = (hex_digit(*tail.first()?)?, hex_digit(*tail.get(1)?)?);
            bytes.push(high << 4 | low);
            rest = tail.get(2..)?;
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn hex_digit(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// `OTEL_SERVICE_NAME`'s value, trimmed; `None` when empty.
pub fn service_name_variable(value: &str) -> Option<&str> {
    Some(value.trim()).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        ResourceAttributes::parse(text)
            .unwrap_or_else(|e| panic!("{text:?}: {e}"))
            .attributes
    }

    fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn plain_list_with_whitespace_and_empty_entries() {
        let text = " service.name = checkout , deployment.environment.name=prod,,team=payments, ";
        assert_eq!(
            pairs(text),
            owned(&[
                ("service.name", "checkout"),
                ("deployment.environment.name", "prod"),
                ("team", "payments")
            ])
        );
        let parsed = ResourceAttributes::parse(text).expect("well formed");
        assert_eq!(parsed.service_name(), Some("checkout"));
        assert_eq!(
            parsed.labels(),
            (
                [
                    ("deployment.environment.name", "prod"),
                    ("team", "payments")
                ]
                .into_iter()
                .collect(),
                Vec::new()
            )
        );
        assert_eq!(pairs(""), Vec::new());
    }

    #[test]
    fn percent_encoding_per_the_specification() {
        // Given the characters the specification says must be percent-encoded: ',' and '=' in
        // keys and values, '%' itself, and what lies outside the baggage octets (space, '"',
        // ';', '\\', non-ASCII)
        let text = "note=a%2Cb%3Dc%20d,pct=100%25,quote=%22x%22%3B%5C,utf8=caf%C3%A9,\
                    my%2Ekey=v,lower=%c3%a9,plus=1+1";
        // When parsed, Then each decodes to the character it encodes, in keys too, in either
        // case, and '+' stays '+' (percent-encoding, not form encoding)
        assert_eq!(
            pairs(text),
            owned(&[
                ("note", "a,b=c d"),
                ("pct", "100%"),
                ("quote", "\"x\";\\"),
                ("utf8", "café"),
                ("my.key", "v"),
                ("lower", "é"),
                ("plus", "1+1"),
            ])
        );
        // Decoded bytes that are not UTF-8 are replaced, not refused
        assert_eq!(pairs("bad.utf8=%FF"), owned(&[("bad.utf8", "\u{fffd}")]));
        // Only the first '=' separates: a raw '=' in a value is a baggage octet
        assert_eq!(pairs("eq=a=b"), owned(&[("eq", "a=b")]));
    }

    #[test]
    fn one_malformed_entry_discards_the_whole_value() {
        // Given values with one bad entry among good ones, When parsed, Then the whole value
        // fails, naming the entry's position and the reason
        for (text, position, reason) in [
            ("service.name=a,novalue,team=b", 2, "no '='"),
            ("=nokey,good=1", 1, "empty key"),
            ("good=1, =x", 2, "empty key"),
            ("good=1,,esc=%zz", 3, "not followed by two hex digits"),
            ("short=%4", 1, "not followed by two hex digits"),
            ("trailing=%", 1, "not followed by two hex digits"),
            ("sign=%+1", 1, "not followed by two hex digits"),
            ("k%g1=v", 1, "in the key"),
        ] {
            let err = ResourceAttributes::parse(text).expect_err(text);
            assert_eq!(err.position, position, "{text}: {err}");
            assert!(err.to_string().contains(reason), "{text}: {err}");
            assert!(
                err.to_string().contains("percent-encoded"),
                "the fix: {err}"
            );
        }
        // And a long entry is shown cut
        let long = "x".repeat(500);
        let err = ResourceAttributes::parse(&long).expect_err("no '='");
        assert_eq!(err.entry.len(), ENTRY_SHOWN_BYTES);
    }

    #[test]
    fn reserved_names_are_claims_apart_from_the_labels() {
        // Given a value claiming another pod, container, host and owner, twice for one name,
        // among attributes of the application's own
        let parsed = ResourceAttributes::parse(
            "k8s.namespace.name=kube-system,k8s.pod.name=coredns-0,container.id=abc,\
             host_id=0000,process.owner=root,team=web,__meta_x=1,k8s.pod.name=again,\
             service.name=nginx,service.version=2",
        )
        .expect("well formed");
        // When turned into labels
        let (labels, claims) = parsed.labels();
        // Then the application's own attributes stay, the claims are listed once each
        assert_eq!(labels.to_string(), r#"{service.version="2", team="web"}"#);
        assert_eq!(
            claims,
            [
                "__meta_x",
                "container.id",
                "host_id",
                "k8s.namespace.name",
                "k8s.pod.name",
                "process.owner"
            ]
        );
        assert_eq!(parsed.service_name(), Some("nginx"));
    }

    #[test]
    fn last_service_name_wins_and_empty_is_none() {
        let parse = |text| ResourceAttributes::parse(text).expect("well formed");
        assert_eq!(
            parse("service.name=a,service.name=b").service_name(),
            Some("b")
        );
        assert_eq!(parse("service.name=").service_name(), None);
        assert_eq!(service_name_variable("  api \n"), Some("api"));
        assert_eq!(service_name_variable("  "), None);
    }
}
