//! The label settings `run` and `record` start with: the label flags ([`LabelFlags`]) merged
//! over the config file's `labels:`, `process_filter:` and `relabel_configs:` into what the
//! labels stage and the files sink run with, and kept with where they came from so `run` can
//! resolve them again on a reload. Runs before privileges are dropped ([`LabelConfig::stage`]
//! reads `/etc/passwd` and the machine id).

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::{
    config::RelayConfig,
    labels::{
        stage::{process_filter, LabelSettings, LabelStage},
        tags,
    },
    sink::files::FoldedRoot,
};

/// The label flags of `run` and `record` (`--tags`, `--service-name`, `--process-filter`,
/// `--folded-root`), as the command line gave them.
#[derive(Clone, Debug, Default)]
pub struct LabelFlags {
    pub tags: Option<String>,
    pub service_name: Option<String>,
    pub process_filter: Option<String>,
    pub folded_root: FoldedRoot,
}

/// The resolved label configuration.
#[derive(Clone, Debug, Default)]
pub struct LabelConfig {
    pub settings: LabelSettings,
    pub folded_root: FoldedRoot,
    /// Where the settings came from, to resolve them again on a reload.
    pub source: LabelSource,
}

/// The label flags and the config file they are merged over: what a reload reads again.
#[derive(Clone, Debug, Default)]
pub struct LabelSource {
    pub flags: LabelFlags,
    pub config: Option<PathBuf>,
}

impl LabelSource {
    /// The settings as the file now says, with the flags merged over them (as at start).
    pub fn settings(&self) -> anyhow::Result<LabelSettings> {
        Ok(self.flags.resolve(self.config.as_deref())?.settings)
    }
}

impl LabelConfig {
    /// This machine's labels stage (reads `/etc/passwd` and the machine id, bounded).
    pub fn stage(&self) -> LabelStage {
        LabelStage::local(self.settings.clone())
    }
}

impl LabelFlags {
    /// Resolves the flags with the config file at `config` (if any): flags win.
    pub fn resolve(&self, config: Option<&Path>) -> anyhow::Result<LabelConfig> {
        let file = match config {
            Some(path) => crate::config::load(path)?,
            None => RelayConfig::default(),
        };
        let mut resolved = self.resolve_with(&file)?;
        resolved.source.config = config.map(Path::to_owned);
        Ok(resolved)
    }

    /// [`LabelFlags::resolve`] with a parsed file.
    pub fn resolve_with(&self, file: &RelayConfig) -> anyhow::Result<LabelConfig> {
        let mut settings = file_settings(file)?;
        if let Some(text) = &self.tags {
            settings.tags.merge(&tags::parse(text)?);
        }
        if let Some(pattern) = &self.process_filter {
            settings.process_filter = Some(
                process_filter(pattern).with_context(|| format!("--process-filter {pattern:?}"))?,
            );
        }
        settings.default_service_name = self
            .service_name
            .clone()
            .filter(|name| !name.trim().is_empty());
        Ok(LabelConfig {
            settings,
            folded_root: self.folded_root,
            source: LabelSource {
                flags: self.clone(),
                config: None,
            },
        })
    }
}

/// The file's label settings (see [`LabelSettings::from_file`]).
pub fn file_settings(file: &RelayConfig) -> anyhow::Result<LabelSettings> {
    LabelSettings::from_file(
        &file.labels,
        file.process_filter.as_deref(),
        &file.relabel_configs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(yaml: &str) -> RelayConfig {
        serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn flags_win_over_the_file() {
        let file = file(
            "labels: { team: a, env: prod }\nprocess_filter: 'app.*'\n\
             relabel_configs:\n  - source_labels: [service.name]\n    target_label: svc\n",
        );
        let args = LabelFlags {
            tags: Some("team=b".into()),
            process_filter: Some("worker".into()),
            service_name: Some("fallback".into()),
            folded_root: FoldedRoot::Service,
        };
        let config = args.resolve_with(&file).expect("resolves");
        let settings = &config.settings;
        assert_eq!(settings.tags.get("team"), Some("b"));
        assert_eq!(settings.tags.get("env"), Some("prod"));
        let filter = settings.process_filter.as_ref().expect("a filter");
        assert!(filter.is_match("worker") && !filter.is_match("worker2"));
        assert_eq!(settings.rules.len(), 1);
        assert_eq!(settings.default_service_name.as_deref(), Some("fallback"));
        assert_eq!(config.folded_root, FoldedRoot::Service);
    }

    #[test]
    fn bad_rules_are_reported_with_index_and_reason() {
        let file = file(
            "relabel_configs:\n  - action: keep\n  - action: hashmod\n    target_label: x\n  \
             - regex: '('\n",
        );
        let err = format!("{:#}", file_settings(&file).expect_err("bad rules"));
        assert!(
            err.contains("relabel_configs[1]") && err.contains("relabel_configs[2]"),
            "{err}"
        );
        assert!(!err.contains("relabel_configs[0]"), "{err}");
        // And the config file is refused when parsed (validate, run, record)
        let text = "relabel_configs:\n  - regex: '('\n";
        let err = crate::config::parse(text, "bad.yaml").expect_err("refused");
        assert!(err.to_string().contains("relabel_configs[0]"), "{err}");
        let err = format!(
            "{:#}",
            LabelFlags {
                tags: Some("novalue".into()),
                ..LabelFlags::default()
            }
            .resolve_with(&RelayConfig::default())
            .expect_err("bad tag")
        );
        assert!(err.contains("--tags"), "{err}");
    }
}
