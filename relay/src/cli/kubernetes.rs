//! The Kubernetes flags of `run` (flattened into it) and their resolution with the config
//! file's `kubernetes:` section into what the provider runs with
//! ([`crate::labels::kubernetes::resolve`]).

use std::path::{Path, PathBuf};

use crate::{
    config::RelayConfig,
    labels::kubernetes::{self, KubernetesFlags, KubernetesSettings},
};

/// Kubernetes labels: flags of `run`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct KubernetesArgs {
    /// Add the k8s.* labels of this node's pods (namespace, pod, container, owner, pod labels)
    /// to the processes in their containers, from a watch on the API server. On by default
    /// when KUBERNETES_SERVICE_HOST is set (in a pod), unless the config file says
    /// `kubernetes: { enabled: false }`; with this flag, a provider that cannot start is an
    /// error. Needs the node's name (--node-name) and read access to pods (list, watch).
    #[arg(long)]
    pub kubernetes: bool,
    /// This node's name: only its pods are watched (field selector spec.nodeName). In a
    /// DaemonSet, set NODE_NAME from the downward API (fieldRef spec.nodeName).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The kubeconfig file to reach the API server with. Default: KUBECONFIG or ~/.kube/config
    /// when there is one, else the pod's service account (in a pod).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Talk to the API server at this URL without credentials (tests, `kubectl proxy`); the
    /// only way plain http is accepted.
    #[arg(long, value_name = "URL", requires = "kubernetes")]
    pub kubernetes_api_url: Option<String>,
}

impl KubernetesArgs {
    /// Resolves the flags with the config file at `config` (if any) and the environment.
    pub fn resolve(&self, config: Option<&Path>) -> anyhow::Result<Option<KubernetesSettings>> {
        let file = match config {
            Some(path) => crate::config::load(path)?,
            None => RelayConfig::default(),
        };
        let flags = KubernetesFlags {
            enabled: self.kubernetes,
            node_name: self.node_name.clone(),
            kubeconfig: self.kubeconfig.clone(),
            api_url: self.kubernetes_api_url.clone(),
        };
        kubernetes::resolve(&flags, &file.kubernetes, &|name| std::env::var(name).ok())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::labels::kubernetes::ApiSource;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        kubernetes: KubernetesArgs,
    }

    #[test]
    fn flags_become_settings() {
        // Given the test flags
        let cli = Cli::try_parse_from([
            "relay",
            "--kubernetes",
            "--node-name",
            "node-a",
            "--kubernetes-api-url",
            "http://127.0.0.1:8001",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        // When resolved without a config file
        let settings = cli
            .kubernetes
            .resolve(None)
            .unwrap_or_else(|e| panic!("{e:#}"));
        // Then the provider is asked for, on that node, at that URL
        assert_eq!(
            settings,
            Some(KubernetesSettings {
                node_name: "node-a".into(),
                api: ApiSource::Url("http://127.0.0.1:8001".into()),
                explicit: true,
            })
        );
        // And the test URL alone does not turn the provider on
        let err = Cli::try_parse_from(["relay", "--kubernetes-api-url", "http://x"])
            .expect_err("needs --kubernetes");
        assert!(err.to_string().contains("--kubernetes"), "{err}");
    }
}
