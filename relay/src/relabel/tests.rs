//! Relabel cases for every action, written from Prometheus' documented semantics.

use super::*;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().copied().collect()
}

/// Compiles rules written as YAML (the user's form).
fn rules(yaml: &str) -> Vec<Rule> {
    #[derive(serde::Deserialize)]
    struct File {
        relabel_configs: Vec<RelabelConfig>,
    }
    let file: File = serde_saphyr::from_str(&format!("relabel_configs:\n{yaml}"))
        .unwrap_or_else(|e| panic!("yaml: {e}"));
    compile(&file.relabel_configs).unwrap_or_else(|e| panic!("rules: {e}"))
}

fn run(yaml: &str, input: &[(&str, &str)]) -> Option<String> {
    apply(&rules(yaml), labels(input)).map(|l| l.to_string())
}

const NGINX: &[(&str, &str)] = &[
    ("process.executable.name", "nginx"),
    ("systemd.unit", "nginx.service"),
    ("host.name", "web-1"),
];

#[test]
fn replace_with_groups_and_defaults() {
    // Given a systemd service, When the rule captures the unit's stem, Then it names the service.
    let out = run(
        r"  - source_labels: [systemd.unit]
    regex: (.+)\.service
    target_label: service.name",
        NGINX,
    );
    assert_eq!(
        out.as_deref(),
        Some(
            r#"{host.name="web-1", process.executable.name="nginx", service.name="nginx", systemd.unit="nginx.service"}"#
        )
    );
    // Several sources joined by the separator; ${n} and literal text in the replacement.
    let out = run(
        r"  - source_labels: [process.executable.name, host.name]
    separator: '@'
    regex: '(\w+)@(.*)'
    target_label: where
    replacement: '${2}/$1 costs $$5'",
        NGINX,
    );
    assert!(out.unwrap().contains(r#"where="web-1/nginx costs $5""#));
    // Default regex (.*) and replacement $1 copy the joined value; a missing source is "".
    let out = run(
        "  - source_labels: [host.name, missing]\n    target_label: copy",
        NGINX,
    );
    assert!(out.unwrap().contains(r#"copy="web-1;""#));
}

#[test]
fn replace_without_sources_adds_a_static_label() {
    // No source labels: the joined value is "", which (.*) matches, so the target is written;
    // a `$` that starts no reference is kept as text.
    let out = run(
        "  - target_label: cluster\n    replacement: 'eu-1 $-cost'",
        NGINX,
    );
    assert!(out.unwrap().contains(r#"cluster="eu-1 $-cost""#));
}

#[test]
fn replace_is_fully_anchored_and_no_match_changes_nothing() {
    // "ngin" matches only a prefix of "nginx": anchored, so no match, no change.
    let out = run(
        "  - source_labels: [process.executable.name]\n    regex: ngin\n    target_label: t\n    replacement: hit",
        NGINX,
    );
    assert_eq!(out, Some(labels(NGINX).to_string()));
    // `.` matches a newline too (Prometheus compiles with (?s)).
    let out = run(
        "  - source_labels: [v]\n    regex: a.b\n    target_label: t\n    replacement: hit",
        &[("v", "a\nb")],
    );
    assert!(out.unwrap().contains(r#"t="hit""#));
}

#[test]
fn replace_with_empty_result_removes_and_templated_target() {
    // An empty replacement deletes the target label.
    let out = run(
        "  - source_labels: [host.name]\n    target_label: host.name\n    replacement: ''",
        NGINX,
    );
    assert!(!out.unwrap().contains("host.name"));
    // The target may be built from groups; an invalid expanded name writes nothing.
    let out = run(
        r"  - source_labels: [kv]
    regex: '(\w+)=(.*)'
    target_label: 'tag.$1'
    replacement: '$2'",
        &[("kv", "team=payments")],
    );
    assert!(out.unwrap().contains(r#"tag.team="payments""#));
    let out = run(
        "  - source_labels: [kv]\n    regex: '(.*)'\n    target_label: '${1}'",
        &[("kv", "not a name")],
    );
    assert_eq!(out, Some(labels(&[("kv", "not a name")]).to_string()));
    // A group that does not exist expands to nothing; `$1x` is the group named "1x".
    let out = run(
        "  - source_labels: [kv]\n    regex: '(a)'\n    target_label: t\n    replacement: '[$2][$1x][${1}x]'",
        &[("kv", "a")],
    );
    assert!(out.unwrap().contains(r#"t="[][][ax]""#));
}

#[test]
fn keep_and_drop() {
    let keep_nginx =
        "  - source_labels: [process.executable.name]\n    regex: nginx|envoy\n    action: keep";
    assert!(run(keep_nginx, NGINX).is_some());
    assert!(run(keep_nginx, &[("process.executable.name", "sshd")]).is_none());
    // keep on a missing label: the value is "" and must match.
    assert!(run(keep_nginx, &[]).is_none());
    let drop_noise = "  - source_labels: [process.executable.name]\n    regex: (sshd|cron|systemd-.*)\n    action: drop";
    assert!(run(
        drop_noise,
        &[("process.executable.name", "systemd-journald")]
    )
    .is_none());
    assert!(run(drop_noise, NGINX).is_some());
    // drop with the default regex (.*) drops everything.
    assert!(run("  - action: drop", NGINX).is_none());
    // The first drop ends the run: later rules are not applied.
    let rules = rules(&format!(
        "{drop_noise}\n  - target_label: never\n    replacement: x"
    ));
    assert_eq!(
        apply(&rules, labels(&[("process.executable.name", "cron")])),
        None
    );
}

#[test]
fn keepequal_and_dropequal() {
    let pair = &[("a", "x"), ("b", "x"), ("c", "y")];
    let keepequal = |source: &str, target: &str| {
        run(
            &format!(
                "  - action: keepequal\n    source_labels: [{source}]\n    target_label: {target}"
            ),
            pair,
        )
        .is_some()
    };
    let dropequal = |source: &str, target: &str| {
        run(
            &format!(
                "  - action: dropequal\n    source_labels: [{source}]\n    target_label: {target}"
            ),
            pair,
        )
        .is_some()
    };
    assert!(keepequal("a", "b"));
    assert!(!keepequal("a", "c"));
    assert!(!dropequal("a", "b"));
    assert!(dropequal("a", "c"));
    // Missing on both sides: "" == "".
    assert!(keepequal("missing", "gone"));
}

#[test]
fn hashmod_is_prometheus_md5() {
    // Independently computed: int.from_bytes(md5(v).digest()[8:], "big") % m. "baz" % 1000 = 976
    // is also the figure Prometheus' own relabel tests expect.
    for (value, modulus, bucket) in [
        ("baz", 1000, 976),
        ("foo", 1000, 696),
        ("", 4, 2),
        ("a;b", 7, 2),
    ] {
        assert_eq!(hash_mod(value, modulus), bucket, "{value:?} % {modulus}");
    }
    let out = run(
        "  - action: hashmod\n    source_labels: [a, b]\n    modulus: 7\n    target_label: shard",
        &[("a", "a"), ("b", "b")],
    );
    assert!(out.unwrap().contains(r#"shard="2""#));
}

#[test]
fn labelmap_copies_matching_names() {
    let input = &[
        ("__meta_k8s_pod_label_app", "shop"),
        ("__meta_k8s_pod_label_tier", "web"),
        ("__meta_k8s_pod_uid", "u-1"),
        ("keep", "me"),
    ];
    let rules = rules("  - action: labelmap\n    regex: __meta_k8s_pod_label_(.+)\n    replacement: k8s.pod.label.$1");
    let out = process(&rules, labels(input)).unwrap();
    // The mapped copies stay, the meta originals go with the other meta labels.
    assert_eq!(
        out.to_string(),
        r#"{k8s.pod.label.app="shop", k8s.pod.label.tier="web", keep="me"}"#
    );
    // The default replacement $1 maps to the captured name; a match on the whole name is needed.
    let out = run(
        "  - action: labelmap\n    regex: 'x_(.*)'",
        &[("x_a", "1"), ("yx_b", "2")],
    )
    .unwrap();
    assert_eq!(out, r#"{a="1", x_a="1", yx_b="2"}"#);
}

#[test]
fn labeldrop_and_labelkeep_match_names() {
    let input = &[
        ("tmp_a", "1"),
        ("tmp_b", "2"),
        ("service.name", "s"),
        ("atmp_c", "3"),
    ];
    assert_eq!(
        run("  - action: labeldrop\n    regex: tmp_.*", input).unwrap(),
        r#"{atmp_c="3", service.name="s"}"#
    );
    assert_eq!(
        run(
            "  - action: labelkeep\n    regex: 'tmp_.*|service\\..*'",
            input
        )
        .unwrap(),
        r#"{service.name="s", tmp_a="1", tmp_b="2"}"#
    );
}

#[test]
fn lowercase_and_uppercase() {
    let input = &[("a", "MiXeD"), ("b", "Ünïcode")];
    assert!(run(
        "  - action: lowercase\n    source_labels: [a, b]\n    target_label: low",
        input
    )
    .unwrap()
    .contains(r#"low="mixed;ünïcode""#));
    assert!(run(
        "  - action: uppercase\n    source_labels: [a]\n    target_label: a",
        input
    )
    .unwrap()
    .contains(r#"a="MIXED""#));
    // Lowercasing an absent source writes "", i.e. removes the target.
    assert!(!run(
        "  - action: lowercase\n    source_labels: [nope]\n    target_label: a",
        input
    )
    .unwrap()
    .contains("a=\""));
}

#[test]
fn rules_chain_in_order_and_meta_labels_go_after() {
    // Given a container process with its cgroup as a meta label
    let input = &[
        ("__meta_process_cgroup", "/system.slice/billing.service"),
        ("process.executable.name", "java"),
        ("process.pid", "77"),
    ];
    // When rules read the meta label, rename, normalise and drop the pid
    let rules = rules(
        r"  - source_labels: [__meta_process_cgroup]
    regex: '.*/(.+)\.service'
    target_label: service.name
  - action: uppercase
    source_labels: [service.name]
    target_label: team
  - source_labels: [team]
    regex: BILL(.*)
    target_label: team
    replacement: finance$1
  - action: labeldrop
    regex: process\.pid",
    );
    // Then each rule saw the previous one's result, and the meta label is gone
    assert_eq!(
        process(&rules, labels(input)).unwrap().to_string(),
        r#"{process.executable.name="java", service.name="billing", team="financeING"}"#
    );
    // No rules: labels pass, only meta labels are removed.
    assert_eq!(process(&[], labels(input)).unwrap().len(), 2);
}

/// The rules of a platform team: name services, drop noise, normalise, shard.
const FLEET_RULES: &str = r"  - source_labels: [process.executable.name]
    regex: (sshd|cron|systemd-.*|kworker.*)
    action: drop
  - source_labels: [__meta_process_cgroup]
    regex: '/system\.slice/(.+)\.service'
    target_label: service.name
    replacement: 'host-$1'
  - source_labels: [service.name]
    regex: 'ledger'
    target_label: service.name
    replacement: 'finance-ledger'
  - action: lowercase
    source_labels: [team]
    target_label: team
  - action: labeldrop
    regex: 'process\.command_line'
";

#[test]
fn whole_chain_providers_rules_cache_pyroscope() {
    use crate::labels::{
        process::{ProcessFacts, UserNames},
        pyroscope,
        resource::{resource_labels, restore_service_name, ProcessEnv, Shared},
    };
    use cache::RelabelCache;

    let rules = rules(FLEET_RULES);
    let shared = Shared {
        host: labels(&[("host.name", "node-1")]),
        tags: labels(&[("env", "prod")]),
        default_service_name: None,
        users: UserNames::default(),
    };
    let facts_of = |pid, name: &str, cgroup: &str| ProcessFacts {
        pid,
        start_time_unix_ns: 1,
        executable_path: format!("/usr/bin/{name}"),
        executable_name: name.into(),
        uid: Some(1000),
        cgroup: cgroup.into(),
        command_line: None,
        kernel_thread: false,
    };
    let env = |attrs: &str| ProcessEnv {
        otel_service_name: None,
        otel_resource_attributes: Some(attrs.into()),
    };
    let mut cache = RelabelCache::new(1024);
    let mut label = |facts: &ProcessFacts, env: &ProcessEnv| {
        cache.get_or_insert_with(facts.pid, facts.start_time_unix_ns, || {
            let (resource, _) = resource_labels(&shared, facts, env);
            let before = resource.get("service.name").unwrap_or_default().to_owned();
            let mut out = process(&rules, resource)?;
            restore_service_name(&mut out, &before);
            Some(out)
        })
    };
    // Given four processes: a systemd service, an app naming itself, sshd, a plain binary
    let nginx = label(
        &facts_of(1, "nginx", "/system.slice/nginx.service"),
        &ProcessEnv::default(),
    );
    let ledger = label(
        &facts_of(2, "java", "/user.slice"),
        &env("service.name=ledger,team=FinOps"),
    );
    let sshd = label(
        &facts_of(3, "sshd", "/system.slice/ssh.service"),
        &ProcessEnv::default(),
    );
    let tool = label(&facts_of(4, "tool", ""), &ProcessEnv::default());
    // Then the rules renamed, normalised and dropped as written
    let name = |l: &Option<std::sync::Arc<Labels>>| {
        l.as_ref()
            .and_then(|l| l.get("service.name").map(str::to_owned))
    };
    assert_eq!(name(&nginx).as_deref(), Some("host-nginx"));
    assert_eq!(name(&ledger).as_deref(), Some("finance-ledger"));
    assert_eq!(ledger.as_ref().and_then(|l| l.get("team")), Some("finops"));
    assert_eq!(sshd, None, "dropped");
    assert_eq!(name(&tool).as_deref(), Some("tool"));
    // And no meta label leaves, the static tag is on every kept process
    for kept in [&nginx, &ledger, &tool].into_iter().flatten() {
        assert!(!kept.iter().any(|(n, _)| n.starts_with("__")), "{kept}");
        assert_eq!(kept.get("env"), Some("prod"));
        let series = pyroscope::series(kept, &["env"], &[]);
        assert!(series.labels.contains_key("service_name"));
        assert!(series.dropped.is_empty(), "{series:?}");
    }
    // And a second sample of the same processes does not run the rules again
    label(
        &facts_of(1, "nginx", "/system.slice/nginx.service"),
        &ProcessEnv::default(),
    );
    label(
        &facts_of(3, "sshd", "/system.slice/ssh.service"),
        &ProcessEnv::default(),
    );
    assert_eq!((cache.stats().misses, cache.stats().hits), (4, 2));
}

/// Label cost, printed: `cargo test -p ember-relay --lib label_cost -- --ignored --nocapture`.
/// 1,000 processes, 10 rules: cold (every process labelled and relabelled) and warm (cache hits).
#[test]
#[ignore = "a measurement, not a check: run it by name"]
fn label_cost() {
    use std::time::Instant;

    use crate::labels::{
        process::{ProcessFacts, UserNames},
        resource::{resource_labels, ProcessEnv, Shared},
    };
    use cache::RelabelCache;

    let rules = rules(&format!(
        "{FLEET_RULES}  - source_labels: [container.id]\n    action: hashmod\n    modulus: 8\n    target_label: shard
  - action: labelmap\n    regex: 'k8s\\.pod\\.label\\.(.+)'\n    replacement: 'pod.$1'
  - action: keep\n    source_labels: [os.type]\n    regex: 'linux|'
  - action: uppercase\n    source_labels: [env]\n    target_label: env_upper
  - action: dropequal\n    source_labels: [host.name]\n    target_label: service.name
"
    ));
    assert_eq!(rules.len(), 10);
    let shared = Shared {
        host: labels(&[("host.name", "node-1"), ("os.type", "linux")]),
        tags: labels(&[("env", "prod")]),
        default_service_name: None,
        users: UserNames::default(),
    };
    let processes: Vec<(ProcessFacts, ProcessEnv)> = (0..1000u32)
        .map(|pid| {
            let facts = ProcessFacts {
                pid,
                start_time_unix_ns: 1,
                executable_path: format!("/usr/bin/app{pid}"),
                executable_name: format!("app{pid}"),
                uid: Some(1000),
                cgroup: format!(
                    "/kubepods.slice/kubepods-pod{pid}.slice/cri-containerd-{:064x}.scope",
                    pid
                ),
                command_line: None,
                kernel_thread: false,
            };
            let env = ProcessEnv {
                otel_service_name: None,
                otel_resource_attributes: Some(format!(
                    "service.name=svc{},team=t{}",
                    pid % 50,
                    pid % 7
                )),
            };
            (facts, env)
        })
        .collect();
    let mut cache = RelabelCache::new(4096);
    let batch = |cache: &mut RelabelCache| {
        let start = Instant::now();
        let mut kept = 0;
        for (facts, env) in &processes {
            let outcome = cache.get_or_insert_with(facts.pid, facts.start_time_unix_ns, || {
                process(&rules, resource_labels(&shared, facts, env).0)
            });
            kept += usize::from(outcome.is_some());
        }
        (start.elapsed(), kept)
    };
    let (cold, kept) = batch(&mut cache);
    let (warm, _) = batch(&mut cache);
    println!(
        "label cost, 1,000 processes x 10 rules ({} build): cold batch {cold:?} ({:?}/process), warm batch {warm:?} ({:?}/process), {kept} kept",
        if cfg!(debug_assertions) { "debug" } else { "release" },
        cold / 1000,
        warm / 1000,
    );
    assert_eq!(kept, 1000);
}
