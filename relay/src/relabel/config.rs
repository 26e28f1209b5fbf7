//! The `relabel_configs:` schema (Prometheus' fields and defaults) and its validation into
//! compiled [`Rule`]s. Every error names the rule's index and the reason, so `ember-relay
//! validate` can report all bad rules of a file at once.
//!
//! ```yaml
//! relabel_configs:
//!   - source_labels: [systemd.unit]
//!     regex: (.+)\.service
//!     target_label: service.name
//!   - source_labels: [process.executable.name]
//!     regex: (sshd|cron)
//!     action: drop
//! ```
//!
//! Validation follows Prometheus' own checks (its documented field rules per action); where a
//! label name is checked, ours are attribute names (dots, dashes and `/` allowed, see
//! [`crate::labels::tags::is_attribute_name`]) rather than Prometheus' `[a-zA-Z_][a-zA-Z0-9_]*`.
//!
//! Regex dialect: the `regex` crate's syntax is RE2's, with one difference users may meet: `\w`,
//! `\d`, `\s` and `\b` are Unicode-aware here and ASCII-only in Go, so `\w+` also matches `café`
//! whole. Write `[A-Za-z0-9_]` or `(?-u:\w)` where that matters.

use regex::Regex;
use serde::Deserialize;

use crate::labels::tags::is_attribute_name;

/// One rule as written in the config file. Absent fields take Prometheus' defaults.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RelabelConfig {
    /// Labels whose values are joined with `separator` and matched against `regex`.
    pub source_labels: Option<Vec<String>>,
    /// Joins the source labels' values. Default `;`.
    pub separator: Option<String>,
    /// RE2 syntax, fully anchored (`^(?:regex)$`). Default `(.*)`.
    pub regex: Option<String>,
    /// The label written by replace, hashmod, lowercase, uppercase; compared by keepequal and
    /// dropequal. May use `$1` / `${name}` in replace.
    pub target_label: Option<String>,
    /// What replace and labelmap write; `$1`, `${1}`, `$name` refer to the regex's groups.
    /// Default `$1`.
    pub replacement: Option<String>,
    /// The hash modulus of hashmod.
    pub modulus: Option<u64>,
    /// replace (default), keep, drop, keepequal, dropequal, hashmod, labelmap, labeldrop,
    /// labelkeep, lowercase, uppercase; case does not matter.
    pub action: Option<String>,
}

pub const DEFAULT_SEPARATOR: &str = ";";
pub const DEFAULT_REGEX: &str = "(.*)";
pub const DEFAULT_REPLACEMENT: &str = "$1";

/// A relabel action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    Replace,
    Keep,
    Drop,
    KeepEqual,
    DropEqual,
    HashMod,
    LabelMap,
    LabelDrop,
    LabelKeep,
    Lowercase,
    Uppercase,
}

impl Action {
    pub const ALL: [Action; 11] = [
        Self::Replace,
        Self::Keep,
        Self::Drop,
        Self::KeepEqual,
        Self::DropEqual,
        Self::HashMod,
        Self::LabelMap,
        Self::LabelDrop,
        Self::LabelKeep,
        Self::Lowercase,
        Self::Uppercase,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replace => "replace",
            Self::Keep => "keep",
            Self::Drop => "drop",
            Self::KeepEqual => "keepequal",
            Self::DropEqual => "dropequal",
            Self::HashMod => "hashmod",
            Self::LabelMap => "labelmap",
            Self::LabelDrop => "labeldrop",
            Self::LabelKeep => "labelkeep",
            Self::Lowercase => "lowercase",
            Self::Uppercase => "uppercase",
        }
    }

    /// The action named `text`, in any case.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.to_ascii_lowercase();
        Self::ALL.into_iter().find(|a| a.as_str() == text)
    }
}

/// A rule ready to apply.
#[derive(Clone, Debug)]
pub struct Rule {
    pub(super) action: Action,
    pub(super) source_labels: Vec<String>,
    pub(super) separator: String,
    /// The anchored expression.
    pub(super) regex: Regex,
    pub(super) target_label: String,
    pub(super) replacement: String,
    pub(super) modulus: u64,
}

impl Rule {
    /// The label this rule writes or compares (empty when its action takes none).
    pub fn target_label(&self) -> &str {
        &self.target_label
    }

    #[cfg(test)]
    pub fn action(&self) -> Action {
        self.action
    }
}

/// A bad rule: its index in `relabel_configs` (from 0) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("relabel_configs[{index}]: {reason}")]
pub struct RuleError {
    pub index: usize,
    pub reason: String,
}

/// Every bad rule of a list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} bad relabel rule(s): {}", .0.len(), join(.0))]
pub struct RulesError(pub Vec<RuleError>);

fn join(errors: &[RuleError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Compiles `configs` in order, reporting every bad rule.
pub fn compile(configs: &[RelabelConfig]) -> Result<Vec<Rule>, RulesError> {
    let mut rules = Vec::with_capacity(configs.len());
    let mut errors = Vec::new();
    for (index, config) in configs.iter().enumerate() {
        match compile_one(config) {
            Ok(rule) => rules.push(rule),
            Err(reason) => errors.push(RuleError { index, reason }),
        }
    }
    if errors.is_empty() {
        Ok(rules)
    } else {
        Err(RulesError(errors))
    }
}

/// Wraps `regex` so that it must match the whole value, `.` matching newlines too (Prometheus
/// compiles `^(?s:regex)$`).
pub fn anchored(regex: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?s:{regex})$"))
}

fn compile_one(config: &RelabelConfig) -> Result<Rule, String> {
    let action = match config.action.as_deref() {
        None => Action::Replace,
        Some("") => return Err("relabel action cannot be empty".into()),
        Some(text) => Action::parse(text).ok_or_else(|| {
            let names: Vec<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
            format!(
                "unknown relabel action {text:?} (one of {})",
                names.join(", ")
            )
        })?,
    };
    let regex_text = config.regex.as_deref().unwrap_or(DEFAULT_REGEX);
    let regex =
        anchored(regex_text).map_err(|err| format!("invalid regex {regex_text:?}: {err}"))?;
    let rule = Rule {
        action,
        source_labels: config.source_labels.clone().unwrap_or_default(),
        separator: config
            .separator
            .clone()
            .unwrap_or_else(|| DEFAULT_SEPARATOR.into()),
        regex,
        target_label: config.target_label.clone().unwrap_or_default(),
        replacement: config
            .replacement
            .clone()
            .unwrap_or_else(|| DEFAULT_REPLACEMENT.into()),
        modulus: config.modulus.unwrap_or(0),
    };
    check_fields(config, &rule)?;
    Ok(rule)
}

/// Prometheus' per-action field rules.
fn check_fields(config: &RelabelConfig, rule: &Rule) -> Result<(), String> {
    use Action as A;
    let action = rule.action.as_str();
    if let Some(bad) = rule.source_labels.iter().find(|l| !is_attribute_name(l)) {
        return Err(format!(
            "{bad:?} in source_labels is not a valid label name"
        ));
    }
    if rule.action == A::HashMod && rule.modulus == 0 {
        return Err("hashmod requires a non-zero modulus".into());
    }
    check_target(rule)?;
    let default_replacement = rule.replacement == DEFAULT_REPLACEMENT;
    if matches!(rule.action, A::Lowercase | A::Uppercase) && !default_replacement {
        return Err(format!("replacement cannot be set for {action}"));
    }
    if rule.action == A::LabelMap && !is_template(&rule.replacement) {
        return Err(format!(
            "{:?} is not a valid replacement for labelmap (a label name, with $1 / ${{name}} references)",
            rule.replacement
        ));
    }
    check_only_fields(config, rule)
}

/// The actions that write or compare `target_label` need a valid one (replace: a template).
fn check_target(rule: &Rule) -> Result<(), String> {
    use Action as A;
    let action = rule.action.as_str();
    let needs_target = matches!(
        rule.action,
        A::Replace | A::HashMod | A::Lowercase | A::Uppercase | A::KeepEqual | A::DropEqual
    );
    if !needs_target {
        return Ok(());
    }
    let target = &rule.target_label;
    if target.is_empty() {
        return Err(format!("{action} requires a target_label"));
    }
    if rule.action == A::Replace && target.contains('$') {
        if !is_template(target) {
            return Err(format!("{target:?} is not a valid target_label template"));
        }
    } else if !is_attribute_name(target) {
        return Err(format!(
            "{target:?} is not a valid target_label for {action}"
        ));
    }
    Ok(())
}

/// keepequal/dropequal take only `source_labels` and `target_label`; labeldrop/labelkeep only
/// `regex`. A field written with its default value counts as not set.
fn check_only_fields(config: &RelabelConfig, rule: &Rule) -> Result<(), String> {
    use Action as A;
    let separator_set = rule.separator != DEFAULT_SEPARATOR;
    let replacement_set = rule.replacement != DEFAULT_REPLACEMENT;
    let modulus_set = config.modulus.is_some();
    let (allowed, extra) = match rule.action {
        A::KeepEqual | A::DropEqual => (
            "source_labels and target_label",
            set_fields(&[
                (
                    "regex",
                    config.regex.as_deref().is_some_and(|r| r != DEFAULT_REGEX),
                ),
                ("separator", separator_set),
                ("replacement", replacement_set),
                ("modulus", modulus_set),
            ]),
        ),
        A::LabelDrop | A::LabelKeep => (
            "regex",
            set_fields(&[
                ("source_labels", config.source_labels.is_some()),
                ("target_label", !rule.target_label.is_empty()),
                ("separator", separator_set),
                ("replacement", replacement_set),
                ("modulus", modulus_set),
            ]),
        ),
        _ => return Ok(()),
    };
    if extra.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} takes only {allowed}; remove {}",
            rule.action.as_str(),
            extra.join(", ")
        ))
    }
}

/// The names of the fields that are set.
fn set_fields(fields: &[(&'static str, bool)]) -> Vec<&'static str> {
    fields
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect()
}

/// A label name in which `$name`, `${name}` references may stand for parts.
fn is_template(text: &str) -> bool {
    let mut plain = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        plain.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let name_len = if let Some(braced) = after.strip_prefix('{') {
            let Some(end) = braced.find('}') else {
                return false;
            };
            let name = &braced[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return false;
            }
            end + 2
        } else {
            let n = after
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                .count();
            if n == 0 {
                return false;
            }
            n
        };
        // A reference stands for a valid part: `x`.
        plain.push('x');
        rest = &after[name_len..];
    }
    plain.push_str(rest);
    is_attribute_name(&plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        relabel_configs: Vec<RelabelConfig>,
    }

    fn parse(yaml: &str) -> Vec<RelabelConfig> {
        serde_saphyr::from_str::<File>(yaml)
            .unwrap()
            .relabel_configs
    }

    fn errors(yaml: &str) -> Vec<(usize, String)> {
        compile(&parse(yaml))
            .unwrap_err()
            .0
            .into_iter()
            .map(|e| (e.index, e.reason))
            .collect()
    }

    #[test]
    fn yaml_rules_compile_with_defaults() {
        let rules = compile(&parse(
            r"
relabel_configs:
  - source_labels: [systemd.unit]
    regex: (.+)\.service
    target_label: service.name
  - source_labels: [process.executable.name]
    regex: sshd|cron
    action: DROP
  - action: labelmap
    regex: __meta_k8s_pod_annotation_(.+)
    replacement: k8s.pod.annotation.$1
  - action: hashmod
    source_labels: [container.id]
    modulus: 4
    target_label: __shard
",
        ))
        .unwrap();
        let actions: Vec<&str> = rules.iter().map(|r| r.action().as_str()).collect();
        assert_eq!(actions, ["replace", "drop", "labelmap", "hashmod"]);
        assert_eq!(rules[0].separator, ";");
        assert_eq!(rules[0].replacement, "$1");
        assert_eq!(rules[1].regex.as_str(), "^(?s:sshd|cron)$");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_saphyr::from_str::<File>("relabel_configs:\n  - sourcelabels: [a]\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("sourcelabels"), "{err}");
    }

    #[test]
    fn bad_rules_reported_with_index_and_reason() {
        let found = errors(
            r#"
relabel_configs:
  - target_label: ok
  - action: shuffle
  - regex: "(unclosed"
    target_label: x
  - action: hashmod
    source_labels: [a]
    target_label: h
  - action: replace
  - action: lowercase
    source_labels: [a]
    target_label: b
    replacement: c
  - action: keepequal
    source_labels: [a]
    target_label: b
    regex: x
  - action: labeldrop
    source_labels: [a]
    regex: tmp_.*
  - action: labelmap
    replacement: "bad name"
  - action: replace
    target_label: "${1"
  - action: ""
  - source_labels: ["a b"]
    target_label: c
  - action: uppercase
    target_label: "x y"
"#,
        );
        let expect = [
            (1, "unknown relabel action \"shuffle\""),
            (2, "invalid regex \"(unclosed\""),
            (3, "hashmod requires a non-zero modulus"),
            (4, "replace requires a target_label"),
            (5, "replacement cannot be set for lowercase"),
            (
                6,
                "keepequal takes only source_labels and target_label; remove regex",
            ),
            (7, "labeldrop takes only regex; remove source_labels"),
            (8, "\"bad name\" is not a valid replacement for labelmap"),
            (9, "\"${1\" is not a valid target_label template"),
            (10, "relabel action cannot be empty"),
            (11, "\"a b\" in source_labels is not a valid label name"),
            (12, "\"x y\" is not a valid target_label for uppercase"),
        ];
        assert_eq!(found.len(), expect.len(), "{found:#?}");
        for ((index, reason), (want_index, want)) in found.iter().zip(expect) {
            assert_eq!(*index, want_index);
            assert!(
                reason.starts_with(want),
                "rule {index}: {reason:?} vs {want:?}"
            );
        }
        let message = compile(&parse(
            "relabel_configs:\n  - action: drop\n  - action: nope\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            message.starts_with(
                "1 bad relabel rule(s): relabel_configs[1]: unknown relabel action \"nope\""
            ),
            "{message}"
        );
    }

    #[test]
    fn explicit_defaults_are_not_extra_fields() {
        let rules = compile(&parse(
            r#"
relabel_configs:
  - action: dropequal
    source_labels: [a]
    target_label: b
    regex: "(.*)"
    separator: ";"
    replacement: "$1"
  - action: labelkeep
    regex: "service\\..*"
    separator: ";"
"#,
        ));
        assert!(rules.is_ok(), "{rules:?}");
    }

    #[test]
    fn regex_dialect_as_documented() {
        assert!(anchored(r"\w+").unwrap().is_match("café"));
        assert!(!anchored(r"(?-u:\w)+").unwrap().is_match("café"));
        assert!(anchored("a.b").unwrap().is_match("a\nb"));
        assert!(!anchored("b").unwrap().is_match("abc"));
    }

    #[test]
    fn templates() {
        for good in ["$1", "${1}", "k8s.$1", "${name}_x", "a.${1}.b", "plain"] {
            assert!(is_template(good), "{good}");
        }
        for bad in ["", "$", "${}", "${1", "a b", "$-", "1$1"] {
            assert!(!is_template(bad), "{bad}");
        }
    }
}
