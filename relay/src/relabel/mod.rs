//! Relabeling with Prometheus semantics: `fn(rules, labels) -> Option<labels>`, no I/O.
//!
//! Each rule joins its `source_labels`' values (a missing label is `""`) with `separator` and
//! then, by action:
//! - `replace`: if the anchored `regex` matches, `target_label` (expanded) is set to
//!   `replacement` (expanded: `$1`, `${1}`, `$name`, `$$`); an empty result removes the label;
//!   no match changes nothing.
//! - `keep` / `drop`: the process is dropped unless / if the regex matches.
//! - `keepequal` / `dropequal`: dropped unless / if the joined value equals `target_label`'s value.
//! - `hashmod`: `target_label` = MD5 of the joined value, its last 8 bytes as a big-endian u64,
//!   modulo `modulus`.
//! - `labelmap`: every label whose *name* matches is copied under the expanded `replacement`.
//! - `labeldrop` / `labelkeep`: labels whose name matches are removed / are the only ones kept.
//! - `lowercase` / `uppercase`: `target_label` = the joined value in lower / upper case.
//!
//! Rules run in order, each seeing the previous one's result; the first drop ends the run. An
//! empty value is the same as no label ([`Labels::set`]). [`process`] then removes the meta
//! labels (`__...`). Results are cached per process by [`cache::RelabelCache`].

pub mod cache;
pub mod config;

use md5::{Digest, Md5};

pub use self::config::{compile, Action, RelabelConfig, Rule};
use crate::labels::{tags::is_attribute_name, Labels};

/// Applies `rules` to `labels`, then strips the meta labels; `None` = the process is dropped.
pub fn process(rules: &[Rule], labels: Labels) -> Option<Labels> {
    let mut labels = apply(rules, labels)?;
    labels.strip_meta();
    Some(labels)
}

/// Applies `rules` to `labels` in order, keeping meta labels; `None` = dropped.
pub fn apply(rules: &[Rule], mut labels: Labels) -> Option<Labels> {
    for rule in rules {
        if !apply_rule(rule, &mut labels) {
            return None;
        }
    }
    Some(labels)
}

/// One rule; `false` = drop.
fn apply_rule(rule: &Rule, labels: &mut Labels) -> bool {
    let value = joined_sources(rule, labels);
    match rule.action {
        Action::Drop => return !rule.regex.is_match(&value),
        Action::Keep => return rule.regex.is_match(&value),
        Action::DropEqual => return labels.get(&rule.target_label).unwrap_or("") != value,
        Action::KeepEqual => return labels.get(&rule.target_label).unwrap_or("") == value,
        Action::Replace => replace(rule, &value, labels),
        Action::Lowercase => labels.set(rule.target_label.as_str(), value.to_lowercase()),
        Action::Uppercase => labels.set(rule.target_label.as_str(), value.to_uppercase()),
        Action::HashMod => {
            let bucket = hash_mod(&value, rule.modulus);
            labels.set(rule.target_label.as_str(), bucket.to_string());
        }
        Action::LabelMap => label_map(rule, labels),
        Action::LabelDrop => labels.retain(|name, _| !rule.regex.is_match(name)),
        Action::LabelKeep => labels.retain(|name, _| rule.regex.is_match(name)),
    }
    true
}

fn joined_sources(rule: &Rule, labels: &Labels) -> String {
    let mut joined = String::new();
    for (i, name) in rule.source_labels.iter().enumerate() {
        if i > 0 {
            joined.push_str(&rule.separator);
        }
        joined.push_str(labels.get(name).unwrap_or(""));
    }
    joined
}

fn replace(rule: &Rule, value: &str, labels: &mut Labels) {
    let Some(captures) = rule.regex.captures(value) else {
        return;
    };
    let mut target = String::new();
    captures.expand(&rule.target_label, &mut target);
    // A template that expands to no valid name writes nothing (as Prometheus).
    if !is_attribute_name(&target) {
        return;
    }
    let mut replacement = String::new();
    captures.expand(&rule.replacement, &mut replacement);
    labels.set(target, replacement);
}

fn label_map(rule: &Rule, labels: &mut Labels) {
    // Matches are taken from the labels as the rule found them, then written.
    let mut mapped = Vec::new();
    for (name, value) in labels.iter() {
        if let Some(captures) = rule.regex.captures(name) {
            let mut new_name = String::new();
            captures.expand(&rule.replacement, &mut new_name);
            if is_attribute_name(&new_name) {
                mapped.push((new_name, value.to_owned()));
            }
        }
    }
    for (name, value) in mapped {
        labels.set(name, value);
    }
}

/// Prometheus' hashmod: MD5, the digest's last 8 bytes as a big-endian integer, modulo `modulus`.
pub fn hash_mod(value: &str, modulus: u64) -> u64 {
    let digest = Md5::digest(value.as_bytes());
    let mut tail = [0u8; 8];
    tail.copy_from_slice(&digest[8..]);
    u64::from_be_bytes(tail).checked_rem(modulus).unwrap_or(0)
}

#[cfg(test)]
mod tests;
