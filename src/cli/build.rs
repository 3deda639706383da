//! `aisb build`: realise the sandbox's image (its `rootfs`) into the store, and pin it in
//! `sandbox.lock`.

use std::collections::BTreeMap;
use std::time::Instant;

use super::Global;
use crate::image::graph::{self, Node, Outcome, Progress};
use crate::image::lock::{Lock, LockError, Locked};
use crate::image::{oci, sandbox, Source};
use crate::Error;

/// Build the sandbox's image (`rootfs dockerfile=…` / `image=…` / `from=…`) and pin it in
/// sandbox.lock
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Steps run in aisb's own sandbox (root in a user namespace, the network limited to the
`registries` and `os-packages` groups, or what `rootfs … { network … }` says); each is
cached by the hash of its inputs (`aisb plan` shows them and what RUN steps reach).
Build args USER_NAME, USER_ID, GROUP_ID (and USERNAME, UID, GID, USER_UID, USER_GID) are the
caller's, for the image's ARG lines that declare them.

Examples:
  aisb build                         build what is missing, update sandbox.lock
  aisb build --locked                CI: fail if anything differs from sandbox.lock
  aisb build --pull                  ask the registry again where tags point
  aisb build --build-arg DEBIAN=bookworm
  aisb build --push registry.example/team/app:v1     then: aisb export k8s --image REF@DIGEST
  aisb build --json | jq '.nodes[] | select(.outcome == \"built\")'")]
pub struct Args {
    #[arg(short, long)]
    pub profile: Option<String>,
    /// Fail when a base tag moved or the image's graph differs from sandbox.lock (nothing is
    /// written)
    #[arg(long, conflicts_with = "pull")]
    pub locked: bool,
    /// Resolve base tags at the registry again instead of using sandbox.lock's pins or this
    /// machine's last answer
    #[arg(long)]
    pub pull: bool,
    /// A value for an ARG (KEY=VALUE); repeatable
    #[arg(long = "build-arg", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub build_args: Vec<(String, String)>,
    /// Machine-readable summary on stdout (progress still on stderr)
    #[arg(long)]
    pub json: bool,
    /// Push the built image to this registry reference (REGISTRY/REPO:TAG) through the OCI
    /// distribution API; its digest is printed and recorded in sandbox.lock
    #[arg(long, value_name = "REF")]
    pub push: Option<String>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or("expected KEY=VALUE")?;
    if !crate::config::decode::is_env_name(k) {
        return Err(format!("`{k}` is not a valid ARG name"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Progress on stderr, and each node's outcome and time for the summary.
struct Recorder {
    bar: crate::image::progress::Bar,
    times: Vec<(Outcome, f64)>,
}

impl Progress for Recorder {
    fn start(&mut self, index: usize, node: &Node) {
        self.bar.start(index, node);
    }
    fn line(&mut self, line: &str) {
        self.bar.line(line);
    }
    fn done(&mut self, index: usize, node: &Node, outcome: Outcome, secs: f64) {
        self.times.push((outcome, secs));
        self.bar.done(index, node, outcome, secs);
    }
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let plan = g.plan(&host, a.profile, vec![])?;
    // A checked-in file that widens what its build steps reach is asked about like a run.
    crate::trust::check(&plan, &host.config_home(), g.trust)?;
    let Some(def) = sandbox::def_of(&plan)? else {
        eprintln!("aisb: nothing to build: this sandbox's root is the host's (`rootfs \"host\"`)\n  help: `rootfs dockerfile=\"Dockerfile\"` in sandbox.kdl builds one from the project's Dockerfile");
        return Ok(0);
    };
    let mut lock = Lock::read(&plan.project)?;
    let lock_path = plan.project.join(crate::image::lock::FILE);
    let extra: BTreeMap<String, String> = a.build_args.into_iter().collect();
    let locked_entry = lock.images.get(&def.name).cloned();
    if a.locked {
        let Some(l) = &locked_entry else {
            return Err(LockError::Missing {
                path: lock_path,
                image: def.name.clone(),
            }
            .into());
        };
        // Every base, asked afresh where it points now.
        for (text, pinned) in &l.bases {
            let now = match Source::parse(text, &def.context) {
                Ok(Source::Registry(r)) => {
                    oci::current_digest(&r).map_err(graph::BuildError::from)?
                }
                Ok(src) => {
                    oci::resolve(&src, None)
                        .map_err(graph::BuildError::from)?
                        .0
                        .digest
                }
                Err(_) => continue,
            };
            if &now != pinned {
                return Err(LockError::Moved {
                    path: lock_path,
                    source_ref: text.clone(),
                    pinned: pinned.clone(),
                    now,
                }
                .into());
            }
        }
    }
    // A bad reference is refused before anything is built.
    let push_to = match &a.push {
        Some(text) => Some(
            oci::reference::Reference::parse(text)
                .map_err(|e| Error::Usage(format!("--push {text}: {e}")))?,
        ),
        None => None,
    };
    let mut o = sandbox::options(&plan, &def, &lock, &extra, a.pull);
    if a.pull {
        o.pins.clear();
    }
    let graph = graph::plan(&def, &o)?;
    if let (true, Some(l)) = (a.locked, &locked_entry) {
        if l.graph != graph.hash {
            return Err(LockError::Graph {
                path: lock_path,
                image: def.name.clone(),
                pinned: l.graph.clone(),
                now: graph.hash.clone(),
            }
            .into());
        }
    }
    let t0 = Instant::now();
    let mut rec = Recorder {
        bar: crate::image::progress::Bar::new(graph.nodes.len(), false),
        times: Vec::new(),
    };
    eprintln!(
        "aisb: image {} ({} nodes, {} to build)",
        def.name,
        graph.nodes.len(),
        graph.nodes.iter().filter(|n| !n.cached).count()
    );
    let built = graph::build(&graph, &mut rec, &Runner)?;
    let secs = t0.elapsed().as_secs_f64();
    // Kept by `aisb store gc`: what this build made, and whatever the lock file pins.
    let _ = crate::graph::store::record_refs(&plan.state_dir, &graph.entries());
    let _ = std::fs::write(
        plan.state_dir.join(crate::graph::store::LOCK_REF_FILE),
        lock_path.as_os_str().as_encoded_bytes(),
    );
    let pushed = match &push_to {
        Some(target) => {
            let scratch = plan
                .store
                .join("tmp")
                .join(format!("push-{}", std::process::id()));
            let result = crate::image::push::push(&built.config, target, &scratch, &mut |line| {
                eprintln!("aisb: push: {line}")
            });
            let _ = std::fs::remove_dir_all(&scratch);
            let p = result.map_err(graph::BuildError::from)?;
            eprintln!(
                "aisb: pushed {} ({} layers, {} KiB sent, {} already there)",
                p.reference,
                p.layers,
                p.sent / 1024,
                p.skipped
            );
            Some(p)
        }
        None => None,
    };
    let mut wrote = false;
    if !a.locked {
        lock.version = 1;
        let mut pushes = locked_entry
            .as_ref()
            .filter(|l| l.graph == graph.hash)
            .map(|l| l.pushed.clone())
            .unwrap_or_default();
        if let (Some(p), Some(target)) = (&pushed, &push_to) {
            let mut name = target.clone();
            name.digest = None;
            name.tag = Some(name.tag.unwrap_or_else(|| "latest".into()));
            pushes.insert(name.to_string(), p.digest.clone());
        }
        lock.images.insert(
            def.name.clone(),
            Locked {
                graph: graph.hash.clone(),
                bases: graph.base.iter().cloned().collect(),
                pushed: pushes,
            },
        );
        wrote = lock.write(&plan.project)?;
    }
    let count = |o: Outcome| rec.times.iter().filter(|(x, _)| *x == o).count();
    if a.json {
        let nodes: Vec<serde_json::Value> = graph
            .nodes
            .iter()
            .zip(&rec.times)
            .map(|(n, (outcome, secs))| serde_json::json!({"what": n.what, "at": n.at, "hash": n.hash, "entry": n.entry, "outcome": outcome, "secs": secs}))
            .collect();
        let v = serde_json::json!({
            "image": def.name, "hash": built.hash, "entry": built.entry, "base": graph.base,
            "layers": built.config.layers, "nodes": nodes, "secs": secs, "lock_written": wrote,
            "pushed": pushed,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        eprintln!(
            "aisb: image {} {} in {secs:.1} s: {} built, {} cached{}",
            def.name,
            &built.hash[..16],
            count(Outcome::Built),
            count(Outcome::Cached),
            if wrote {
                format!("; wrote {}", lock_path.display())
            } else {
                String::new()
            }
        );
    }
    Ok(0)
}

/// RUN steps on the runtime: the build defines what a step is (`image::step`), the runtime
/// runs one (`runtime::step`); neither imports the other, the command line joins them.
pub struct Runner;

impl crate::image::step::StepRunner for Runner {
    fn run(
        &self,
        step: &crate::image::step::StepRun,
        on_line: &mut dyn FnMut(&str),
    ) -> Result<i32, crate::image::step::StepError> {
        let s = crate::runtime::step::Step {
            layers: step.layers,
            upper: step.upper,
            scratch: step.scratch,
            argv: &step.argv,
            env: &step.env,
            cwd: &step.cwd,
            user: step.user,
            allow: &step.allow,
            audit: &step.audit,
        };
        crate::runtime::step::run(&s, on_line).map_err(|e| {
            use miette::Diagnostic;
            crate::image::step::StepError::Runner {
                message: e.to_string(),
                help: e
                    .help()
                    .map_or_else(|| "`aisb doctor` checks the host".into(), |h| h.to_string()),
            }
        })
    }

    fn remove(&self, path: &std::path::Path) -> std::io::Result<()> {
        crate::userns::remove_all(path)
    }
}
