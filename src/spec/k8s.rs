//! Plan -> Kubernetes manifests (`aisb export k8s`): the sandbox a project describes, run on a
//! cluster with the same policy. A pure function of the plan and the options (no I/O): the
//! caller gathers the repository and commit, and writes the YAML.
//!
//! What one export holds, in order (names from the project and profile, so two exports of the
//! same plan are identical):
//!
//! | Kind | Name | What for |
//! |---|---|---|
//! | ConfigMap | `BASE-proxy-policy` | the plan's allowlist as `aisb proxy serve` reads it |
//! | Deployment, Service | `BASE-proxy` | the egress proxy: the only way out of the workload |
//! | NetworkPolicy | `BASE-proxy` | the proxy: reached only from the workload, out on the web ports and DNS |
//! | NetworkPolicy | `BASE-workload` | the workload: no ingress, egress only to the proxy (not with `agent-sandbox`: the template's managed policy says it) |
//! | ConfigMap | `BASE-files-N` | files aisb generates for the sandbox (agents' managed settings) |
//! | Pod / Job / SandboxTemplate + SandboxWarmPool + SandboxClaim | `BASE` | the workload |
//!
//! NetworkPolicy is per pod, so the proxy runs in its own pod: a sidecar in the workload's pod
//! would share its network and could not be kept apart from it.
//!
//! The workload: the image by digest; `runAsUser`/`runAsGroup` the plan's user (`runAsNonRoot`
//! unless that is root); no privilege escalation, every capability dropped, a read-only root
//! (writable places are `emptyDir`s: the plan's tmpfs mounts and state directories); seccomp
//! `RuntimeDefault`, or `Localhost` with aisb's own filter (`aisb export seccomp`); no service
//! account token; memory and CPU limits from `limits` (the pids limit is the kubelet's
//! `podPidsLimit`: a note says so). The environment is the plan's, filtered as it is locally,
//! with host values never copied: a variable the plan passes from the caller's environment that
//! looks like a secret (or is listed in `pass`) becomes a `secretKeyRef` into `BASE-env`; other
//! caller values (TERM, LANG, …) are left to the image; values the configuration sets are
//! written. The project comes from an init container that clones the repository at the commit
//! and deletes the tracked files the plan masks before the workload starts.
//!
//! Not exported (listed in the output's header): host paths the plan binds or copies (the
//! caller's files are not on the cluster), `localhost-port` (no host loopback there), the live
//! mask layer (nothing writes into the pod's workspace from outside).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::eval::plan::{MountKind, NetMode, Plan};

/// The port `aisb proxy serve` listens on in the exported Deployment.
pub const PROXY_PORT: u16 = 3128;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavor {
    /// A bare Pod
    Pod,
    /// A Job (one run, no restarts): the orchestrator's agent on a ticket
    Job,
    /// kubernetes-sigs/agent-sandbox: SandboxTemplate, SandboxWarmPool, SandboxClaim
    AgentSandbox,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub flavor: Flavor,
    /// The workload's image, by digest (`REF@sha256:…`).
    pub image: String,
    /// The image that runs `aisb proxy serve` (default: the workload's image).
    pub proxy_image: String,
    /// The image that clones the repository (needs git and sh; default: the workload's image).
    pub clone_image: String,
    pub namespace: String,
    pub runtime_class: Option<String>,
    /// `Localhost` profile path on the node (relative to the kubelet's seccomp directory);
    /// `None`: `RuntimeDefault`.
    pub seccomp_localhost: Option<String>,
    /// The repository to clone and the commit to check out; `None`: the workspace is an
    /// empty volume (the caller provides the project another way).
    pub repo: Option<Repo>,
    /// Names the configuration `set` or read `from-file` (their values were written by the
    /// project, not taken from the caller's environment), and names listed in `pass`.
    pub env_origin: EnvOrigin,
    /// Warm pool size for `agent-sandbox`.
    pub replicas: u32,
    /// Replicas of the proxy's Deployment (docs/scale.md: one per ~N agents).
    pub proxy_replicas: u32,
}

#[derive(Debug, Clone)]
pub struct Repo {
    pub url: String,
    pub commit: String,
}

#[derive(Debug, Clone, Default)]
pub struct EnvOrigin {
    /// Set by the configuration (`set`): written as values unless the name looks secret.
    pub set: Vec<String>,
    /// Read from a dotenv file (`from-file`) or passed from the caller (`pass`): always a
    /// `secretKeyRef`.
    pub secret: Vec<String>,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum K8sError {
    #[error("the workload image must be named by digest for Kubernetes: `{0}`")]
    #[diagnostic(
        code(aisb::export::k8s::image),
        help("pass `--image REF@sha256:…` (`aisb build --push REF` pushes the sandbox's image and prints its digest)")
    )]
    ImageNotByDigest(String),
    #[error("no repository to clone: this project has no `origin` remote")]
    #[diagnostic(
        code(aisb::export::k8s::repo),
        help("pass --repo URL (and --commit SHA), or --no-clone to start with an empty workspace")
    )]
    NoRepo,
    #[error("no commit to check out: this project has no HEAD commit")]
    #[diagnostic(
        code(aisb::export::k8s::commit),
        help("pass --commit SHA, or --no-clone")
    )]
    NoCommit,
    #[error(
        "this sandbox's root is the host's own system directories, which a cluster does not have"
    )]
    #[diagnostic(
        code(aisb::export::k8s::rootfs),
        help("give it an image (`rootfs \"Dockerfile\"`, an `image` block, or `rootfs from=…`), push it with `aisb build --push REF`, and pass `--image REF@sha256:…`")
    )]
    HostRoot,
}

/// What the export left out and why, for the YAML's header.
#[derive(Debug, Default)]
pub struct Export {
    pub documents: Vec<Value>,
    pub notes: Vec<String>,
    /// Secret keys the workload reads from `BASE-env`.
    pub secret_keys: Vec<String>,
    pub secret_name: String,
}

/// A DNS-1123 label from `s`: lowercase letters, digits and `-`, at most `max` long.
fn label(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.truncate(max);
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        "sandbox".into()
    } else {
        out
    }
}

/// The name every object of this export starts with: `aisb-PROJECT-PROFILE` (at most 40
/// characters, so suffixes stay within the 63 of a label).
pub fn base_name(plan: &Plan) -> String {
    let project = plan
        .project
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    label(
        &format!("aisb-{}-{}", label(&project, 24), plan.profile),
        40,
    )
}

fn meta(name: &str, o: &Options, labels: &Value) -> Value {
    json!({"name": name, "namespace": o.namespace, "labels": labels})
}

/// The container-level security context every container of the export gets.
fn container_security(uid: u32, gid: u32) -> Value {
    let mut v = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "privileged": false,
        "readOnlyRootFilesystem": true,
        "runAsUser": uid,
        "runAsGroup": gid,
    });
    if uid != 0 {
        v["runAsNonRoot"] = json!(true);
    }
    v
}

fn seccomp(o: &Options) -> Value {
    match &o.seccomp_localhost {
        Some(path) => json!({"type": "Localhost", "localhostProfile": path}),
        None => json!({"type": "RuntimeDefault"}),
    }
}

fn is_digest_ref(image: &str) -> bool {
    image.rsplit_once("@sha256:").is_some_and(|(name, hex)| {
        !name.is_empty() && hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// Single quotes for `sh`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The manifests for `plan`.
pub fn export(plan: &Plan, o: &Options) -> Result<Export, K8sError> {
    if plan.rootfs == crate::eval::plan::Rootfs::Host {
        return Err(K8sError::HostRoot);
    }
    for image in [&o.image, &o.proxy_image, &o.clone_image] {
        if !is_digest_ref(image) {
            return Err(K8sError::ImageNotByDigest(image.clone()));
        }
    }
    let base = base_name(plan);
    let mut out = Export {
        secret_name: format!("{base}-env"),
        ..Default::default()
    };
    let uid = plan.identity.uid;
    let gid = plan.identity.gid;
    let app = |component: &str| {
        json!({
            "app.kubernetes.io/name": "aisb",
            "app.kubernetes.io/instance": base,
            "app.kubernetes.io/component": component,
        })
    };
    let workload_labels = app("workload");
    let proxy_labels = app("proxy");
    let proxy_host = format!("{base}-proxy.{}.svc", o.namespace);
    let allow_mode = plan.network.mode == NetMode::Allow;

    // The egress proxy: its policy, its pod, its service, and the policies that keep it apart.
    if allow_mode {
        let policy = json!({
            "allow": plan.network.allow,
            "deny": plan.network.deny,
            "localhost_ports": [],
            "resolve": [],
            "pins": [],
        });
        out.documents.push(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(&format!("{base}-proxy-policy"), o, &proxy_labels),
            "data": {"policy.json": serde_json::to_string_pretty(&policy).expect("json")},
        }));
        out.documents.push(json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(&format!("{base}-proxy"), o, &proxy_labels),
            "spec": {
                "replicas": o.proxy_replicas,
                "selector": {"matchLabels": proxy_labels},
                "template": {
                    "metadata": {"labels": proxy_labels},
                    "spec": {
                        "automountServiceAccountToken": false,
                        "securityContext": {
                            "runAsNonRoot": true,
                            "runAsUser": 65534,
                            "runAsGroup": 65534,
                            "seccompProfile": seccomp(o),
                        },
                        "containers": [{
                            "name": "proxy",
                            "image": o.proxy_image,
                            "command": ["aisb", "proxy", "serve",
                                "--listen", format!("0.0.0.0:{PROXY_PORT}"),
                                "--policy", "/etc/aisb/policy.json"],
                            "ports": [{"name": "proxy", "containerPort": PROXY_PORT, "protocol": "TCP"}],
                            "readinessProbe": {"httpGet": {"path": "/healthz", "port": PROXY_PORT}},
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": PROXY_PORT}},
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "64Mi"},
                                "limits": {"memory": "256Mi"},
                            },
                            "securityContext": container_security(65534, 65534),
                            "volumeMounts": [{"name": "policy", "mountPath": "/etc/aisb", "readOnly": true}],
                        }],
                        "volumes": [{"name": "policy", "configMap": {"name": format!("{base}-proxy-policy")}}],
                    },
                },
            },
        }));
        out.documents.push(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(&format!("{base}-proxy"), o, &proxy_labels),
            "spec": {
                "selector": proxy_labels,
                "ports": [{"name": "proxy", "port": PROXY_PORT, "targetPort": PROXY_PORT, "protocol": "TCP"}],
            },
        }));
        out.documents.push(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta(&format!("{base}-proxy"), o, &proxy_labels),
            "spec": {
                "podSelector": {"matchLabels": proxy_labels},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{
                    "from": [{"podSelector": {"matchLabels": workload_labels}}],
                    "ports": [{"protocol": "TCP", "port": PROXY_PORT}],
                }],
                "egress": [
                    // The proxy resolves names itself: the cluster's DNS.
                    {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                    // The allowlist is decided on names by the proxy; on the wire, public
                    // addresses only (the proxy refuses internal answers, and so does this).
                    {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                        "169.254.0.0/16", "100.64.0.0/10", "127.0.0.0/8"]}},
                        {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "::1/128"]}}]},
                ],
            },
        }));
    }
    let workload_egress: Value = if allow_mode {
        json!([{
            "to": [{"podSelector": {"matchLabels": proxy_labels}}],
            "ports": [{"protocol": "TCP", "port": PROXY_PORT}],
        }])
    } else {
        if plan.network.mode == NetMode::Host {
            out.notes.push("network \"host\": exported as no egress at all — a cluster has no host network to give a sandbox".into());
        }
        json!([])
    };
    if o.flavor != Flavor::AgentSandbox {
        out.documents.push(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta(&format!("{base}-workload"), o, &workload_labels),
            "spec": {
                "podSelector": {"matchLabels": workload_labels},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": workload_egress,
            },
        }));
    }
    if !plan.tools.agents.is_empty() {
        out.notes.push(format!(
            "agents {}: their managed settings are mounted, but aisb's pre-tool hook (the sandbox init's `agent-event`) is not in the pod: tool calls are not logged, and the tools policy holds only as far as each agent's own settings enforce it",
            plan.tools.agents.join(", ")
        ));
    }
    if !plan.network.transparent_ports.is_empty() {
        out.notes.push("transparent egress: not exported — in the pod only tools that honour HTTP(S)_PROXY/ALL_PROXY reach the proxy Service; the rest fail closed".into());
    }
    if !plan.network.localhost_ports.is_empty() {
        out.notes.push(format!(
            "localhost-port {:?}: not exported (a pod has no host loopback to reach)",
            plan.network.localhost_ports
        ));
    }

    // Volumes: the workspace, tmpfs and state as emptyDirs, generated files as ConfigMaps.
    let mut volumes: Vec<Value> = vec![json!({"name": "workspace", "emptyDir": {}})];
    let mut mounts: Vec<Value> = vec![json!({"name": "workspace", "mountPath": plan.project})];
    let mut files = 0;
    for m in &plan.mounts {
        if m.target == plan.project {
            continue;
        }
        // Transparent egress (the init's DNS stub and relays) is not carried to a pod: its
        // tools reach the proxy Service through the proxy variables only (noted below).
        if m.target == Path::new(crate::vocab::RESOLV_DIR) {
            continue;
        }
        let name = format!("v{}", volumes.len());
        match &m.kind {
            MountKind::Tmpfs { size, .. } => {
                let mut dir = json!({"medium": "Memory"});
                // aisb's default size (the private /tmp's, the home's, an unsized tmpfs's) is
                // sized from this host, not the node: only a size the configuration gave.
                let default = crate::eval::plan::Limits::default_tmp_size();
                if let Some(size) = size.filter(|&s| s != default) {
                    dir["sizeLimit"] = json!(size.to_string());
                }
                volumes.push(json!({"name": name, "emptyDir": dir}));
                mounts.push(json!({"name": name, "mountPath": m.target}));
            }
            MountKind::State { .. } => {
                volumes.push(json!({"name": name, "emptyDir": {}}));
                mounts.push(json!({"name": name, "mountPath": m.target}));
            }
            MountKind::Generated { files: list, .. } => {
                let cm = format!("{base}-files-{files}");
                files += 1;
                let data: BTreeMap<&str, &str> = list
                    .iter()
                    .map(|f| (f.name.as_str(), f.content.as_str()))
                    .collect();
                out.documents.push(json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": meta(&cm, o, &workload_labels),
                    "data": data,
                }));
                volumes.push(json!({"name": name, "configMap": {"name": cm}}));
                mounts.push(json!({"name": name, "mountPath": m.target, "readOnly": true}));
            }
            MountKind::Git { .. } => {}
            MountKind::Bind { source, .. }
                if is_under(&m.target, &plan.project) && source.starts_with(&plan.project) => {}
            MountKind::Bind { .. } | MountKind::Overlay { .. } | MountKind::Copy { .. } => {
                out.notes.push(format!(
                    "{} ({}): not exported — a host path; the cluster has none of the caller's files",
                    m.target.display(),
                    m.why
                ));
            }
        }
    }
    // A read-only root still needs a writable /tmp.
    let tmp_volume = match mounts.iter().find(|m| m["mountPath"] == json!("/tmp")) {
        Some(m) => m["name"].as_str().unwrap_or("tmp").to_string(),
        None => {
            volumes.push(json!({"name": "tmp", "emptyDir": {}}));
            mounts.push(json!({"name": "tmp", "mountPath": "/tmp"}));
            "tmp".to_string()
        }
    };
    // Parents before children (a later mount of /tmp would hide a workspace under it).
    mounts.sort_by_key(|m| {
        m["mountPath"]
            .as_str()
            .map_or(0, |p| Path::new(p).components().count())
    });

    // The environment: values the project wrote, references for secrets, nothing of the host.
    let mut env: Vec<Value> = Vec::new();
    let identity =
        |n: &str| ["HOME", "USER", "LOGNAME", "SHELL"].contains(&n) || n.starts_with("XDG_");
    for (name, value) in &plan.env.vars {
        let secret = o.env_origin.secret.contains(name) || crate::eval::env::looks_secret(name);
        if secret {
            env.push(json!({"name": name, "valueFrom": {"secretKeyRef": {
                "name": out.secret_name, "key": name}}}));
            out.secret_keys.push(name.clone());
        } else if o.env_origin.set.contains(name) || identity(name) {
            env.push(json!({"name": name, "value": value}));
        }
    }
    // Secrets the configuration passes that this caller's environment lacks: the cluster's
    // Secret provides them.
    for name in &o.env_origin.secret {
        if !plan.env.vars.iter().any(|(n, _)| n == name)
            && !plan
                .env
                .dropped
                .iter()
                .any(|d| &d.name == name && d.reason.starts_with("denied"))
        {
            env.push(json!({"name": name, "valueFrom": {"secretKeyRef": {
                "name": out.secret_name, "key": name}}}));
            out.secret_keys.push(name.clone());
        }
    }
    if allow_mode {
        let url = format!("http://{proxy_host}:{PROXY_PORT}");
        for (name, value) in crate::vocab::sandbox_env() {
            if value.starts_with("http://127.0.0.1:") {
                env.push(json!({"name": name, "value": url}));
            } else if name.eq_ignore_ascii_case("NO_PROXY") || name == "NODE_USE_ENV_PROXY" {
                env.push(json!({"name": name, "value": value}));
            }
        }
    }
    env.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    env.dedup_by(|a, b| a["name"] == b["name"]);

    let mut resources = Map::new();
    // The configuration's own (aisb's default is sized from this host, not the cluster's).
    if let Some(bytes) = plan
        .limits
        .memory
        .filter(|_| plan.limits.configured("memory"))
    {
        resources.insert("memory".into(), json!(bytes.to_string()));
    }
    if let Some(milli) = plan.limits.cpus_milli {
        resources.insert("cpu".into(), json!(format!("{milli}m")));
    }
    out.notes.push(format!(
        "pids {}: Kubernetes limits processes per pod only through the kubelet's podPidsLimit; set it on the nodes that run these pods",
        plan.limits.pids
    ));

    let mut workload = json!({
        "name": "sandbox",
        "image": o.image,
        "command": plan.process.args,
        "workingDir": plan.process.cwd,
        "env": env,
        "securityContext": container_security(uid, gid),
        "volumeMounts": mounts,
    });
    if !resources.is_empty() {
        workload["resources"] = json!({"limits": resources, "requests": resources});
    }

    let mut init_containers = Vec::new();
    if let Some(repo) = &o.repo {
        let masked: Vec<String> = plan
            .masks
            .iter()
            .filter_map(|m| m.path.strip_prefix(&plan.project).ok())
            .filter(|rel| !rel.as_os_str().is_empty())
            .map(|rel| sh_quote(&rel.to_string_lossy()))
            .collect();
        let ws = sh_quote(&plan.project.to_string_lossy());
        let mut script = format!(
            "set -eu\ngit clone --no-checkout -- {} {ws}\ncd {ws}\ngit checkout -q --detach {}\n",
            sh_quote(&repo.url),
            sh_quote(&repo.commit)
        );
        if !masked.is_empty() {
            script.push_str("# what the sandbox masks never reaches the workload\nrm -rf --");
            for m in &masked {
                script.push(' ');
                script.push_str(m);
            }
            script.push('\n');
        }
        let mut clone_env = vec![json!({"name": "HOME", "value": "/tmp"})];
        if allow_mode {
            let url = format!("http://{proxy_host}:{PROXY_PORT}");
            clone_env.push(json!({"name": "HTTPS_PROXY", "value": url}));
            clone_env.push(json!({"name": "HTTP_PROXY", "value": url}));
        } else {
            out.notes.push("the repository is cloned with no network (network is not `allow`): the clone container cannot reach it; give the workspace another way or allow the repository's host".into());
        }
        let mut clone_mounts = vec![
            json!({"name": "tmp", "mountPath": "/tmp"}),
            json!({"name": "workspace", "mountPath": plan.project}),
        ];
        clone_mounts[0]["name"] = json!(tmp_volume);
        init_containers.push(json!({
            "name": "clone",
            "image": o.clone_image,
            "command": ["/bin/sh", "-c", script],
            "env": clone_env,
            "securityContext": container_security(uid, gid),
            "volumeMounts": clone_mounts,
        }));
    } else {
        out.notes.push("no repository given: the workspace starts empty (pass --repo URL --commit SHA, or mount a volume at the project path)".into());
    }

    let mut pod_security = json!({
        "runAsUser": uid,
        "runAsGroup": gid,
        "fsGroup": gid,
        "seccompProfile": seccomp(o),
    });
    if uid != 0 {
        pod_security["runAsNonRoot"] = json!(true);
    }
    let mut pod = json!({
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "hostname": label(&plan.process.hostname, 63),
        "securityContext": pod_security,
        "containers": [workload],
        "volumes": volumes,
    });
    if !init_containers.is_empty() {
        pod["initContainers"] = json!(init_containers);
    }
    if let Some(rc) = &o.runtime_class {
        pod["runtimeClassName"] = json!(rc);
    }
    match o.flavor {
        Flavor::Pod => {
            pod["restartPolicy"] = json!("Never");
            out.documents.push(json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta(&base, o, &workload_labels),
                "spec": pod,
            }));
        }
        Flavor::Job => {
            pod["restartPolicy"] = json!("Never");
            out.documents.push(json!({
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": meta(&base, o, &workload_labels),
                "spec": {
                    "backoffLimit": 0,
                    "template": {"metadata": {"labels": workload_labels}, "spec": pod},
                },
            }));
        }
        Flavor::AgentSandbox => {
            let mut policy = json!({"ingress": [], "egress": workload_egress});
            if !allow_mode {
                policy["egress"] = json!([]);
            }
            out.documents.push(json!({
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxTemplate",
                "metadata": meta(&format!("{base}-template"), o, &workload_labels),
                "spec": {
                    "networkPolicyManagement": "Managed",
                    "networkPolicy": policy,
                    "podTemplate": {"metadata": {"labels": workload_labels}, "spec": pod},
                },
            }));
            out.documents.push(json!({
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxWarmPool",
                "metadata": meta(&format!("{base}-pool"), o, &workload_labels),
                "spec": {
                    "replicas": o.replicas,
                    "sandboxTemplateRef": {"name": format!("{base}-template")},
                },
            }));
            out.documents.push(json!({
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxClaim",
                "metadata": meta(&format!("{base}-claim"), o, &workload_labels),
                "spec": {"warmPoolRef": {"name": format!("{base}-pool")}},
            }));
        }
    }
    out.secret_keys.sort();
    out.secret_keys.dedup();
    Ok(out)
}

fn is_under(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir)
}

/// Text for one YAML comment line: a path or name may hold a line break (a directory can be
/// named anything), which would end the comment and start YAML of its own.
fn comment(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{85}') {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// The export as multi-document YAML, its notes as a comment at the top.
pub fn to_yaml(plan: &Plan, e: &Export) -> String {
    let mut s = String::new();
    s.push_str(&comment(&format!(
        "# aisb export k8s: profile {} of {}",
        plan.profile,
        plan.config_file
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "the embedded default".into())
    )));
    s.push('\n');
    if !e.secret_keys.is_empty() {
        s.push_str(&comment(&format!(
            "# The workload reads {} from the Secret `{}`; create it first:",
            e.secret_keys.join(", "),
            e.secret_name,
        )));
        s.push('\n');
        s.push_str(&comment(&format!(
            "#   kubectl create secret generic {}{}",
            e.secret_name,
            e.secret_keys
                .iter()
                .map(|k| format!(" --from-literal={k}=…"))
                .collect::<String>()
        )));
        s.push('\n');
    }
    for n in &e.notes {
        s.push_str(&comment(&format!("# note: {n}")));
        s.push('\n');
    }
    for d in &e.documents {
        s.push_str("---\n");
        s.push_str(&serde_yaml::to_string(d).expect("a JSON value is always YAML"));
    }
    s
}
