//! `aisb export k8s`: the sandbox a project describes, as Kubernetes manifests. Every built-in
//! kind validates against Kubernetes' own OpenAPI schemas (PyPI `kubernetes-validate`, strict:
//! no unknown field), the agent-sandbox kinds against the CRDs' `openAPIV3Schema`s in
//! `tests/k8s/agent-sandbox/`; the example's output is a golden file; no value of a secret ever
//! reaches the YAML.

mod support;

use serde::Deserialize;
use std::path::Path;
use std::process::{Command, Output};

use support::Fixture;

const DIGEST: &str =
    "registry.example/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const COMMIT: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

const KDL: &str = r#"
rootfs from="docker.io/library/debian:12"
network "allow" {
    allow "github.com"
    allow "*.npmjs.org"
}
env {
    set "MODE" "ci"
    pass "DEPLOY_KEY"
    from-file ".env" "DATABASE_PASSWORD"
}
process {
    user uid=1000 gid=1000 name="dev"
    command "npm" "test"
}
mount "~/tool-cache" "/cache"
tmpfs "/scratch" size="64M"
limits {
    memory "2G"
    cpus 1.5
}
profile "offline" {
    network "none"
}
"#;

fn v(x: impl Into<serde_yaml::Value>) -> serde_yaml::Value {
    x.into()
}

fn fixture() -> Fixture {
    let f = Fixture::new();
    f.write("sandbox.kdl", KDL);
    f.write(".env", "DATABASE_PASSWORD=hunter2-secret-value\nOTHER=1\n");
    f.write("src/main.js", "console.log(1)\n");
    std::fs::create_dir_all(f.home().join("tool-cache")).unwrap();
    f.write("config/credentials.json", "{\"token\": \"t\"}\n");
    f
}

fn export(f: &Fixture, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aisb"))
        .arg("-C")
        .arg(f.project())
        // The fixture loosens the defaults (its network allowlist): export asks like run.
        .arg("--trust")
        .args([
            "export",
            "k8s",
            "--repo",
            "https://github.com/example/app.git",
            "--commit",
            COMMIT,
        ])
        .args(args)
        .env("HOME", f.home())
        .env("XDG_CACHE_HOME", f.root().join("cache"))
        .env("XDG_CONFIG_HOME", f.root().join("config"))
        .env("DEPLOY_KEY", "deploy-key-value-from-the-host")
        .env("GITHUB_TOKEN", "ghp_host_token_value")
        .output()
        .unwrap()
}

fn yaml(f: &Fixture, args: &[&str]) -> String {
    let out = export(f, args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn validate(f: &Fixture, name: &str, text: &str) {
    let file = f.root().join(name);
    std::fs::write(&file, text).unwrap();
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "-k", "1.34.0"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} does not validate:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/k8s/agent-sandbox");
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/k8s/validate_crd.py"))
        .arg(&crds)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} does not validate against the agent-sandbox CRDs:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn validators_or_skip() -> bool {
    support::tool_or_skip("kubernetes-validate", "the Kubernetes schema validation")
        && support::tool_or_skip("python3", "the CRD schema validation")
}

#[test]
fn every_flavor_validates_against_the_kubernetes_and_crd_schemas() {
    if !validators_or_skip() {
        return;
    }
    let f = fixture();
    for flavor in ["pod", "job", "agent-sandbox"] {
        let text = yaml(
            &f,
            &[
                "--flavor",
                flavor,
                "--image",
                DIGEST,
                "--runtime-class",
                "gvisor",
            ],
        );
        validate(&f, &format!("{flavor}.yaml"), &text);
    }
    let text = yaml(
        &f,
        &[
            "--profile",
            "offline",
            "--image",
            DIGEST,
            "--seccomp-localhost",
            "profiles/aisb.json",
        ],
    );
    validate(&f, "offline.yaml", &text);
    assert!(
        text.contains("localhostProfile: profiles/aisb.json"),
        "{text}"
    );
    // No network: no proxy at all, and the workload may reach nothing.
    assert!(!text.contains("kind: Deployment"), "{text}");
    assert!(text.contains("egress: []"), "{text}");
}

#[test]
fn validators_reject_a_misspelt_field() {
    // The validation above can fail: the same output with one field misspelt is refused.
    if !validators_or_skip() {
        return;
    }
    let f = fixture();
    let pod =
        yaml(&f, &["--image", DIGEST]).replace("readOnlyRootFilesystem", "readOnlyRootFilesytem");
    let file = f.root().join("bad.yaml");
    std::fs::write(&file, pod).unwrap();
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "-k", "1.34.0"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let sandbox = yaml(&f, &["--flavor", "agent-sandbox", "--image", DIGEST])
        .replace("networkPolicyManagement", "networkPolicyManagment");
    std::fs::write(&file, sandbox).unwrap();
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/k8s/validate_crd.py"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/k8s/agent-sandbox"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn the_example_matches_its_golden_file() {
    let f = fixture();
    let text = yaml(&f, &["--image", DIGEST]);
    let project = f.project().to_string_lossy().into_owned();
    let root = f.root().to_string_lossy().into_owned();
    let stable = |t: &str| t.replace(&project, "/PROJECT").replace(&root, "/ROOT");
    let text = stable(&text);
    insta::assert_snapshot!("k8s_pod", text);
    // Deterministic: the same plan gives the same bytes.
    assert_eq!(stable(&yaml(&f, &["--image", DIGEST])), text);
}

#[test]
fn secrets_are_references_never_values() {
    let f = fixture();
    for flavor in ["pod", "job", "agent-sandbox"] {
        let text = yaml(&f, &["--flavor", flavor, "--image", DIGEST]);
        for value in [
            "hunter2-secret-value",
            "deploy-key-value-from-the-host",
            "ghp_host_token_value",
        ] {
            assert!(!text.contains(value), "{flavor}: {value} leaked:\n{text}");
        }
        for key in ["DATABASE_PASSWORD", "DEPLOY_KEY"] {
            assert!(
                text.contains(&format!("key: {key}")),
                "{flavor}: {key} is not a secretKeyRef:\n{text}"
            );
        }
        // A secret the configuration never passes is not referenced either.
        assert!(!text.contains("GITHUB_TOKEN"), "{flavor}:\n{text}");
        assert!(
            text.contains("kubectl create secret generic aisb-"),
            "{text}"
        );
    }
}

#[test]
fn the_workload_is_locked_down_and_masked_files_are_removed_before_it_starts() {
    let f = fixture();
    let text = yaml(&f, &["--image", DIGEST]);
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let pod = docs.iter().find(|d| d["kind"] == "Pod").expect("a Pod");
    let spec = &pod["spec"];
    assert_eq!(spec["automountServiceAccountToken"], v(false));
    assert_eq!(spec["securityContext"]["runAsUser"], v(1000));
    assert_eq!(spec["securityContext"]["runAsNonRoot"], v(true));
    let c = &spec["containers"][0];
    assert_eq!(c["image"], v(DIGEST));
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], v(false));
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], v(true));
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], v("ALL"));
    assert_eq!(c["resources"]["limits"]["cpu"], v("1500m"));
    assert_eq!(c["command"][0], v("npm"));
    // The workload reaches only the proxy; the proxy only the workload's pods reach.
    let policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "NetworkPolicy"
                && d["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .ends_with("-workload")
        })
        .unwrap();
    assert_eq!(policy["spec"]["egress"].as_sequence().unwrap().len(), 1);
    assert_eq!(policy["spec"]["egress"][0]["ports"][0]["port"], v(3128));
    let proxy_env = c["env"].as_sequence().unwrap();
    assert!(proxy_env
        .iter()
        .any(|e| e["name"] == "HTTPS_PROXY"
            && e["value"].as_str().unwrap().starts_with("http://aisb-")));
    // The clone removes what the sandbox masks (.env, credentials) before the workload runs.
    let clone = spec["initContainers"][0]["command"][2].as_str().unwrap();
    assert!(clone.contains(COMMIT), "{clone}");
    assert!(clone.contains("'.env'"), "{clone}");
    assert!(clone.contains("'config/credentials.json'"), "{clone}");
    // The host path mount is not exported, and the YAML says so.
    assert!(
        text.contains("/cache") && text.contains("not exported"),
        "{text}"
    );
}

#[test]
fn errors_name_the_cause_and_the_fix() {
    let f = fixture();
    let out = export(&f, &["--image", "registry.example/app:latest"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("by digest") && err.contains("--image REF@sha256"),
        "{err}"
    );
    f.write("sandbox.kdl", "network \"none\"\n");
    let out = export(&f, &["--image", DIGEST]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("host's own system directories") && err.contains("aisb build --push"),
        "{err}"
    );
}

/// The proxy's Deployment scales as docs/scale.md works out (`--proxy-replicas`), and the
/// value is bounded.
#[test]
fn the_proxy_deployment_takes_its_replicas() {
    let f = fixture();
    let text = yaml(&f, &["--image", DIGEST, "--proxy-replicas", "10"]);
    let proxy = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == v("Deployment"))
        .expect("a proxy Deployment");
    assert_eq!(proxy["spec"]["replicas"], v(10), "{text}");
    let out = export(&f, &["--image", DIGEST, "--proxy-replicas", "0"]);
    assert_eq!(out.status.code(), Some(2));
}
