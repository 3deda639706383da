use std::path::PathBuf;

use super::Global;
use crate::Error;

/// Export the sandbox for other runtimes: an OCI bundle, aisb's seccomp filter as a profile
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb export bundle /tmp/sb && runc run --bundle /tmp/sb sb1\n  aisb export bundle /tmp/sb -- make test\n  aisb export seccomp > aisb-seccomp.json     # a Kubernetes Localhost profile, linux.seccomp of a spec"
)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// A bundle directory: config.json, rootfs skeleton, masking file; overlay dirs are created
    /// under the sandbox's state dir
    Bundle {
        /// New (or empty) directory to write
        dir: PathBuf,
        #[arg(short, long)]
        profile: Option<String>,
        /// Command to run inside instead of the configured one
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Kubernetes manifests (multi-document YAML): the workload by image digest under a strict
    /// securityContext, the egress proxy as its own Deployment + Service with the plan's
    /// allowlist, NetworkPolicies that leave the workload only the proxy, the project cloned at
    /// a commit with masked files removed
    #[command(
        after_help = "Examples:\n  aisb export k8s --image registry.example/app@sha256:… > sandbox.yaml\n  aisb export k8s --flavor job --profile investigate --image … --runtime-class gvisor\n  aisb export k8s --flavor agent-sandbox --image … --seccomp-localhost profiles/aisb.json\n  aisb export seccomp > /var/lib/kubelet/seccomp/profiles/aisb.json"
    )]
    K8s(K8sArgs),
    /// The seccomp filter aisb's init applies, as an OCI seccomp profile (JSON): for runtimes
    /// where aisb's init does not run (a Kubernetes `seccompProfile: {type: Localhost}`)
    Seccomp {
        /// Write it here instead of stdout
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub struct K8sArgs {
    #[arg(short, long)]
    profile: Option<String>,
    #[arg(long, value_enum, default_value = "pod")]
    flavor: crate::spec::k8s::Flavor,
    /// The sandbox's image by digest (`REF@sha256:…`, as `aisb build --push REF` prints it)
    #[arg(long, value_name = "REF@DIGEST")]
    image: String,
    /// The image that runs `aisb proxy serve` (aisb on its PATH; default: --image)
    #[arg(long, value_name = "REF@DIGEST")]
    proxy_image: Option<String>,
    /// The image that clones the repository (git and sh; default: --image)
    #[arg(long, value_name = "REF@DIGEST")]
    clone_image: Option<String>,
    #[arg(long, default_value = "default")]
    namespace: String,
    /// RuntimeClass for the workload (gVisor `gvisor`, Kata `kata`, …)
    #[arg(long, value_name = "NAME")]
    runtime_class: Option<String>,
    /// Use aisb's own seccomp filter (`aisb export seccomp`) saved on the nodes at this path,
    /// relative to the kubelet's seccomp directory, instead of RuntimeDefault
    #[arg(long, value_name = "PATH")]
    seccomp_localhost: Option<String>,
    /// The repository the workload's init container clones (default: this repository's
    /// `origin`)
    #[arg(long, value_name = "URL")]
    repo: Option<String>,
    /// The commit it checks out (default: HEAD)
    #[arg(long, value_name = "SHA")]
    commit: Option<String>,
    /// No clone: the workspace starts empty
    #[arg(long, conflicts_with_all = ["repo", "commit"])]
    no_clone: bool,
    /// Warm sandboxes kept ready (`--flavor agent-sandbox`)
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// Replicas of the egress proxy's Deployment (docs/scale.md says how many a fleet needs)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    proxy_replicas: u32,
    /// Write the YAML here instead of stdout
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Command to run inside instead of the configured one
    #[arg(last = true)]
    command: Vec<String>,
}

/// One line of git's output for the project (aisb's hardened git: none of the repository's
/// config or hooks run).
fn git_line(project: &std::path::Path, args: &[&str]) -> Option<String> {
    let out = crate::git::for_work_tree(project)
        .args(args)
        .output()
        .ok()?;
    out.status.success().then_some(())?;
    let line = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!line.is_empty()).then_some(line)
}

fn k8s(g: &Global, a: K8sArgs) -> Result<i32, Error> {
    use crate::spec::k8s;
    let host = super::host()?;
    let loaded = g.load_for(&host, &a.command)?;
    let plan = super::evaluated(crate::eval::evaluate(
        &loaded,
        &host,
        &g.request(a.profile, a.command),
    )?);
    // What the cluster runs is what a local run would: approved like one.
    crate::trust::check(&plan, &host.config_home(), g.trust)?;
    // Where each variable's value comes from, in the profile's chain (the base settings, the
    // profile and what it extends): set by the project, or a secret from a file or the caller.
    let mut origin = k8s::EnvOrigin::default();
    let decls: Vec<&crate::config::model::ProfileDecl> =
        loaded.files.iter().flat_map(|f| &f.profiles).collect();
    let mut chain: Vec<&crate::config::model::Settings> =
        loaded.files.iter().map(|f| &f.base).collect();
    let mut next = Some(plan.profile.clone());
    while let Some(name) = next.take() {
        let Some(d) = decls.iter().find(|d| d.name.value == name) else {
            break;
        };
        if chain.iter().any(|s| std::ptr::eq(*s, &d.settings)) {
            break;
        }
        chain.push(&d.settings);
        next = d.extends.as_ref().map(|e| e.value.clone());
    }
    for settings in chain {
        let env = &settings.env;
        origin
            .set
            .extend(env.set.iter().map(|(k, _)| k.value.clone()));
        origin
            .secret
            .extend(env.pass.iter().map(|k| k.value.clone()));
        for (_, keys) in &env.from_file {
            origin.secret.extend(keys.iter().map(|k| k.value.clone()));
        }
    }
    let repo = if a.no_clone {
        None
    } else {
        let url = match a.repo {
            Some(u) => u,
            None => git_line(&plan.project, &["remote", "get-url", "origin"])
                .ok_or(k8s::K8sError::NoRepo)?,
        };
        let commit = match a.commit {
            Some(c) => c,
            None => {
                git_line(&plan.project, &["rev-parse", "HEAD"]).ok_or(k8s::K8sError::NoCommit)?
            }
        };
        Some(k8s::Repo { url, commit })
    };
    let opts = k8s::Options {
        flavor: a.flavor,
        proxy_image: a.proxy_image.unwrap_or_else(|| a.image.clone()),
        clone_image: a.clone_image.unwrap_or_else(|| a.image.clone()),
        image: a.image,
        namespace: a.namespace,
        runtime_class: a.runtime_class,
        seccomp_localhost: a.seccomp_localhost,
        repo,
        env_origin: origin,
        replicas: a.replicas,
        proxy_replicas: a.proxy_replicas,
    };
    let export = k8s::export(&plan, &opts)?;
    write_out(a.output.as_deref(), &k8s::to_yaml(&plan, &export))
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    match a.what {
        What::K8s(a) => k8s(g, a),
        What::Bundle {
            dir,
            profile,
            command,
        } => bundle(g, dir, profile, command),
        What::Seccomp { output } => {
            let profile = crate::init::seccomp::oci::profile();
            let mut text = serde_json::to_string_pretty(&profile)
                .expect("a seccomp profile always serializes");
            text.push('\n');
            write_out(output.as_deref(), &text)
        }
    }
}

/// `text` to `path` (atomically: a reader never sees half of it), or to stdout.
fn write_out(path: Option<&std::path::Path>, text: &str) -> Result<i32, Error> {
    match path {
        Some(p) => crate::atomic::write_atomic(p, text.as_bytes()).map_err(|source| Error::Io {
            path: p.to_path_buf(),
            source,
        })?,
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth a message.
            let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
        }
    }
    Ok(0)
}

fn bundle(
    g: &Global,
    dir: PathBuf,
    profile: Option<String>,
    command: Vec<String>,
) -> Result<i32, Error> {
    let host = super::host()?;
    let plan = g.plan(&host, profile, command)?;
    crate::trust::check(&plan, &host.config_home(), g.trust)?;
    if plan.rootfs != crate::eval::plan::Rootfs::Host {
        // The image's root is an overlay that aisb's runtime process mounts privately; a bundle
        // for another runtime would bind empty directories in its place.
        return Err(crate::image::graph::BuildError::Step {
            at: "rootfs".into(),
            message: "a sandbox on an image cannot be exported as a bundle yet: its root is an overlay of the image's layers that only aisb's runtime mounts".into(),
            help: "run it with `aisb run` / `aisb up`; `aisb spec` shows its spec; export a sandbox on the host's root (`rootfs \"host\"`) for other runtimes".into(),
        }
        .into());
    }
    let exe = super::current_exe()?;
    let mask_file = crate::graph::realise::realise(&plan)?;
    // A dependency directory the manifests promise but that is not there yet: its layer's
    // empty lower directory and its mount point, so that the other runtime can mount the
    // layer (an empty directory stays on the host: that runtime's runs are not aisb's to
    // clean up after).
    for dir in &plan.made_for_run {
        for m in plan.mounts.iter().filter(|m| m.target == *dir) {
            if let crate::eval::plan::MountKind::Overlay { lower, .. } = &m.kind {
                for d in [lower, dir] {
                    std::fs::create_dir_all(d).map_err(|source| Error::Io {
                        path: d.clone(),
                        source,
                    })?;
                }
            }
        }
    }
    crate::spec::bundle::write(
        &plan,
        &dir,
        &mask_file,
        Some(&crate::init::binary_beside(&exe)),
        false,
        None,
        None,
        // Another OCI runtime applies `linux.resources` itself.
        crate::spec::LimitsBy::Cgroup,
    )?;
    eprintln!(
        "wrote bundle {} (profile {}, {} masked paths)",
        dir.display(),
        plan.profile,
        plan.masks.len()
    );
    Ok(0)
}
