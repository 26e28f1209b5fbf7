//! A process's own OpenTelemetry resource settings: `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES`, as strings the sampler forwards (its allowlist takes only these
//! two variables from `/proc/PID/environ`; nothing else of the environment reaches the relay).
//!
//! `OTEL_RESOURCE_ATTRIBUTES` follows the OpenTelemetry SDK specification: `key1=value1,key2=value2`
//! in the W3C Baggage format without properties, optional whitespace around keys and values
//! trimmed, keys and values percent-decoded (`+` stays `+`), invalid UTF-8 after decoding replaced
//! by U+FFFD. An entry without `=`, with an empty key, or with a bad `%` escape is skipped and
//! counted; the rest of the variable is kept (as the Go SDK does), since one bad entry should not
//! cost a process its `service.name`. Pure: no I/O.

use super::{keys, Labels};

/// A parsed `OTEL_RESOURCE_ATTRIBUTES` value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    /// The attributes in the order written; a key written twice keeps its last value in
    /// [`ResourceAttributes::labels`].
    pub attributes: Vec<(String, String)>,
    /// Entries skipped as malformed.
    pub skipped: usize,
}

impl ResourceAttributes {
    /// Parses the variable's value.
    pub fn parse(text: &str) -> Self {
        let mut parsed = Self::default();
        for entry in text.split(',') {
            if entry.trim().is_empty() {
                continue;
            }
            match parse_entry(entry) {
                Some(attribute) => parsed.attributes.push(attribute),
                None => parsed.skipped += 1,
            }
        }
        parsed
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
    /// [`super::service::service_name`]'s precedence instead), and meta names (`__...`) too: a
    /// process must not hand relabel rules a fact the relay did not observe.
    pub fn labels(&self) -> Labels {
        self.attributes
            .iter()
            .filter(|(k, _)| k != keys::SERVICE_NAME && !super::is_meta(k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

fn parse_entry(entry: &str) -> Option<(String, String)> {
    let (key, value) = entry.split_once('=')?;
    let key = percent_decode(key.trim())?;
    if key.is_empty() {
        return None;
    }
    Some((key, percent_decode(value.trim())?))
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

    fn pairs(parsed: &ResourceAttributes) -> Vec<(&str, &str)> {
        parsed
            .attributes
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn plain_list_with_whitespace() {
        let parsed = ResourceAttributes::parse(
            " service.name = checkout , deployment.environment.name=prod,team=payments ",
        );
        assert_eq!(
            pairs(&parsed),
            [
                ("service.name", "checkout"),
                ("deployment.environment.name", "prod"),
                ("team", "payments")
            ]
        );
        assert_eq!(parsed.skipped, 0);
        assert_eq!(parsed.service_name(), Some("checkout"));
        assert_eq!(
            parsed.labels().to_string(),
            r#"{deployment.environment.name="prod", team="payments"}"#
        );
    }

    #[test]
    fn percent_decoding_of_keys_and_values() {
        let parsed = ResourceAttributes::parse(
            "note=a%2Cb%3Dc%20d,plus=1+1,utf8=caf%C3%A9,bad.utf8=%FF,my%2Ekey=v,eq=a=b",
        );
        assert_eq!(
            pairs(&parsed),
            [
                ("note", "a,b=c d"),
                ("plus", "1+1"),
                ("utf8", "café"),
                ("bad.utf8", "\u{fffd}"),
                ("my.key", "v"),
                // Only the first `=` separates; the W3C value grammar forbids a raw one, but
                // refusing it would drop a value every SDK keeps.
                ("eq", "a=b"),
            ]
        );
        assert_eq!(parsed.skipped, 0);
    }

    #[test]
    fn bad_entries_skipped_and_counted() {
        let parsed = ResourceAttributes::parse(
            "novalue,=nokey, =x,good=1,,esc=%zz,short=%4,trailing=%,sign=%+1,also.good=2",
        );
        assert_eq!(pairs(&parsed), [("good", "1"), ("also.good", "2")]);
        assert_eq!(parsed.skipped, 7);
        assert_eq!(parsed.service_name(), None);
        assert_eq!(ResourceAttributes::parse(""), ResourceAttributes::default());
    }

    #[test]
    fn last_service_name_wins_and_empty_is_none() {
        assert_eq!(
            ResourceAttributes::parse("service.name=a,service.name=b").service_name(),
            Some("b")
        );
        assert_eq!(
            ResourceAttributes::parse("service.name=").service_name(),
            None
        );
        assert_eq!(service_name_variable("  api \n"), Some("api"));
        assert_eq!(service_name_variable("  "), None);
    }
}
