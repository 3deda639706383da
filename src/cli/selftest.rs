//! `aisb test` (seed 002's `sandbox test`): attack the configured sandbox from inside and
//! report, check by check, what was expected and what was observed.

use std::process::{Command, Stdio};

use serde::Serialize;

use super::Global;
use crate::eval::plan::{NetMode, Plan};
use crate::runtime::Backend;
use crate::Error;

/// Check the sandbox's protections from inside: masked paths, writes outside, secrets in the
/// environment, the network, agent tool denials, capabilities, seccomp and the pids limit
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb test                       the default profile, on the default backend
  aisb test --profile investigate --backend bwrap
  aisb test --json                one object per check, for CI

Exits 1 when any protection does not hold.")]
pub struct Args {
    #[arg(short, long)]
    pub profile: Option<String>,
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    #[arg(long)]
    pub json: bool,
    /// Check at most this many masked paths (all by default)
    #[arg(long)]
    pub max_masks: Option<usize>,
}

#[derive(Debug, Serialize)]
struct Check {
    check: String,
    expected: &'static str,
    observed: String,
    ok: bool,
}

/// The agents whose pre-tool hook is aisb's (the others' policy is their own settings).
const HOOKED: [&str; 2] = ["claude", "gemini"];

/// Single-quote for sh.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// One probe per line: `KEY=status`; 0 means the attempt succeeded.
fn script(plan: &Plan, max_masks: usize) -> (String, Vec<(String, String, bool)>) {
    // (key, description, the attempt must fail)
    let mut checks: Vec<(String, String, bool)> = Vec::new();
    let mut s =
        String::from("t() { k=$1; shift; \"$@\" >/dev/null 2>&1 </dev/null; echo \"$k=$?\"; }\n");
    // The reporting layer of masks lands just after the start (`runtime::live::deny`): its
    // mounts are waited for (at most 5 s), so that the reads below are reported.
    // Waited for until all are there or their number stops growing (a mask the layer does
    // not cover, a link, is never there); then where it is, for the check below.
    let stacked = plan.masks.len().min(max_masks);
    if stacked > 0 {
        s.push_str(&format!(
            "i=0; p=0; while [ $i -lt 100 ]; do c=$(grep -c ' - fuse aisb-deny' /proc/self/mountinfo); \
             [ \"$c\" -gt {stacked} ] && break; [ \"$c\" -gt 1 ] && [ \"$c\" = \"$p\" ] && [ $i -gt 10 ] && break; p=$c; sleep 0.05; i=$((i+1)); done\n\
             grep ' - fuse aisb-deny' /proc/self/mountinfo | while read -r _ _ _ _ at _; do echo \"deny_at=$at\"; done\n"
        ));
    }
    for (i, m) in plan.masks.iter().take(max_masks).enumerate() {
        let key = format!("mask{i}");
        let p = q(&m.path.to_string_lossy());
        if m.dir {
            // Readable contents or a successful write would both be a leak.
            // Visible contents or write access would both be a leak (checked, never tried).
            s.push_str(&format!(
                "t {key} sh -c {}\n",
                q(&format!(
                    "test -n \"$(ls -A {p} 2>/dev/null)\" || test -w {p}"
                ))
            ));
        } else {
            s.push_str(&format!("t {key} cat {p}\n"));
        }
        checks.push((key, format!("read {} ({})", m.path.display(), m.rule), true));
    }
    let home = plan.identity.home.to_string_lossy().into_owned();
    for (key, what, cmd) in [
        (
            "write_usr",
            "write to /usr".to_string(),
            "echo x > /usr/.aisb-test".to_string(),
        ),
        (
            "write_etc",
            "write to /etc".to_string(),
            "echo x > /etc/.aisb-test".to_string(),
        ),
        (
            "read_shadow",
            "read /etc/shadow".to_string(),
            "cat /etc/shadow".to_string(),
        ),
        (
            "proc1_root",
            "read /etc/shadow through /proc/1/root".to_string(),
            "cat /proc/1/root/etc/shadow".to_string(),
        ),
        (
            "ssh_dir",
            format!("list {home}/.ssh"),
            format!("test -n \"$(ls -A {}/.ssh 2>/dev/null)\"", q(&home)),
        ),
    ] {
        s.push_str(&format!("t {key} sh -c {}\n", q(&cmd)));
        checks.push((key.to_string(), what, true));
    }
    // The policy and the files the host runs or obeys (`eval::protect`): none writable from
    // inside (checked with `test -w`, never written).
    for (i, m) in plan
        .mounts
        .iter()
        .filter(|m| {
            crate::eval::protect::is_protect_mount(m)
                && matches!(m.kind, crate::eval::plan::MountKind::Bind { .. })
        })
        .enumerate()
    {
        let key = format!("protected{i}");
        s.push_str(&format!(
            "t {key} test -w {}\n",
            q(&m.target.to_string_lossy())
        ));
        checks.push((
            key,
            format!("write {} ({})", m.target.display(), m.why),
            true,
        ));
    }
    // Files aisb wrote for an agent (its permission layer mirroring the sandbox) must hold:
    // neither they nor their directory writable from inside.
    for (i, m) in plan.mounts.iter().enumerate() {
        if let crate::eval::plan::MountKind::Generated { files, .. } = &m.kind {
            let dir = m.target.to_string_lossy().into_owned();
            let mut cmd = format!("test -w {}", q(&dir));
            for f in files {
                let path = format!("{dir}/{}", f.name);
                // Missing counts as tampered with: the attempt "succeeds".
                cmd.push_str(&format!(" || test -w {p} || ! test -r {p}", p = q(&path)));
            }
            let key = format!("generated{i}");
            s.push_str(&format!("t {key} sh -c {}\n", q(&cmd)));
            checks.push((key, format!("change or remove {dir} ({})", m.why), true));
        }
    }
    // The tool policy, per agent preset with a hook: each denial handed to aisb's hook inside
    // as that agent would call it must come back refused (exit 2). Rules whose calls cannot be
    // made up without guessing (a path glob) are shown by `aisb plan`, not tried.
    let mut n = 0;
    for agent in plan
        .tools
        .agents
        .iter()
        .filter(|a| HOOKED.contains(&a.as_str()))
    {
        for r in &plan.tools.deny {
            let Ok((name, spec)) = crate::tools::parse(&r.rule) else {
                continue;
            };
            let input = match spec {
                None => serde_json::json!({}),
                Some(p) if p.ends_with(":*") => {
                    serde_json::json!({"command": p.trim_end_matches(":*")})
                }
                Some(_) => continue,
            };
            let Some(tool) = crate::tools::names_for(agent, name).into_iter().next() else {
                continue;
            };
            let call = serde_json::json!({
                "tool_name": tool,
                "tool_input": input,
                "cwd": plan.project,
            });
            let key = format!("tool{n}");
            n += 1;
            s.push_str(&format!(
                "t {key} sh -c {}\n",
                q(&format!(
                    "printf %s {} | {} agent-event {agent}",
                    q(&call.to_string()),
                    crate::vocab::INIT_PATH
                ))
            ));
            checks.push((
                key,
                format!("{agent} calls {tool} (tools deny {:?}, {})", r.rule, r.at),
                true,
            ));
        }
    }
    // In a writable project, what git on the host would run (config, hooks, info) must not be
    // writable from inside, and the git directory must be pinned (a mount point: it cannot be
    // renamed away and replaced). Derived from the project itself, not from the mounts that
    // should protect it; checked, never tried.
    let writable_project = plan.mounts.iter().any(|m| {
        m.target == plan.project
            && matches!(
                m.kind,
                crate::eval::plan::MountKind::Bind { writable: true, .. }
            )
    });
    let git_paths = if writable_project {
        crate::git::guards(&plan.project, &plan.project).unwrap_or_default()
    } else {
        Vec::new()
    };
    // A `.git` directory is the run's own (an overlay: see `git::back`): what is pinned inside
    // it on the host's behalf is moot there, the overlay itself is checked.
    let dot = plan.project.join(".git");
    let private_git = std::fs::symlink_metadata(&dot).is_ok_and(|m| m.is_dir());
    let git_paths: Vec<_> = git_paths
        .into_iter()
        .filter(|g| !(private_git && g.writable && g.target != dot))
        .collect();
    for (i, g) in git_paths.iter().enumerate() {
        let writable = &g.writable;
        let path = g.target.to_string_lossy().into_owned();
        let key = format!("git{i}");
        // mountinfo escapes spaces, tabs, newlines and backslashes as octal.
        let escaped = path
            .replace('\\', "\\134")
            .replace(' ', "\\040")
            .replace('\t', "\\011")
            .replace('\n', "\\012");
        let (cmd, what) = if *writable && private_git {
            (
                format!(
                    "! grep -F {} /proc/self/mountinfo | grep -q ' - overlay '",
                    q(&format!(" {escaped} "))
                ),
                format!("write {path} through to the host (git on the host would obey it)"),
            )
        } else if *writable {
            (
                format!(
                    "! cut -d' ' -f5 /proc/self/mountinfo | grep -qxF {}",
                    q(&escaped)
                ),
                format!("replace {path} (git on the host would use the new one)"),
            )
        } else {
            (
                format!("test -w {}", q(&path)),
                format!("change {path} (git on the host runs what it names)"),
            )
        };
        s.push_str(&format!("t {key} sh -c {}\n", q(&cmd)));
        checks.push((key, what, true));
    }
    // No git credential inside (issue 30): the project's git configuration as the sandbox
    // reads it names no token in a URL, no extra header, no credential setting, no include of
    // a host file; git-crypt's keys are not readable.
    if crate::git::git_dir_of(&plan.project).is_some() {
        let p = q(&plan.project.to_string_lossy());
        s.push_str(&format!(
            "t git_credentials sh -c {}\n",
            q(&format!(
                "git -C {p} config --local --list 2>/dev/null | grep -qiE {}",
                q("(^|[.])extraheader=|^credential[.]|^include(if)?[.]|://[^/@:]+:[^/@]+@")
            ))
        ));
        checks.push((
            "git_credentials".into(),
            "read a credential in the project's git configuration".into(),
            true,
        ));
        s.push_str(&format!(
            "t git_crypt_keys sh -c {}\n",
            q(&format!(
                "test -n \"$(ls -A {p}/.git/git-crypt/keys 2>/dev/null)\""
            ))
        ));
        checks.push((
            "git_crypt_keys".into(),
            "list git-crypt's keys".into(),
            true,
        ));
        // No masked content through git inside (issue 30 item 4): the blob of each masked
        // file the index tracks is read by its name; it must read as aisb's placeholder.
        for (i, (rel, oid)) in masked_blobs(plan, max_masks).iter().enumerate() {
            let key = format!("git_masked{i}");
            s.push_str(&format!(
                "t {key} sh -c {}\n",
                q(&format!(
                    "out=$(git -C {p} cat-file blob {oid} 2>/dev/null | head -c 14); \
                     test -n \"$out\" && test \"$out\" != {}",
                    q("aisb: withheld")
                ))
            ));
            checks.push((
                key,
                format!("read the content of {rel} through git (blob {oid})"),
                true,
            ));
        }
    }
    if plan.read_only {
        let p = q(&plan.project.to_string_lossy());
        s.push_str(&format!(
            "t write_project sh -c {}\n",
            q(&format!("test -w {p}"))
        ));
        checks.push((
            "write_project".into(),
            "write to the read-only project".into(),
            true,
        ));
    }
    // Secrets and denied names (a shell sets PWD, SHLVL, `_` by itself: those prove nothing).
    let secrets = plan
        .env
        .dropped
        .iter()
        .filter(|d| d.reason.contains("secret") || d.reason.contains("deny"));
    for (i, d) in secrets.enumerate() {
        let key = format!("env{i}");
        s.push_str(&format!(
            "t {key} sh -c {}\n",
            q(&format!("test -n \"${{{}+x}}\"", d.name))
        ));
        checks.push((key, format!("see ${} ({})", d.name, d.reason), true));
    }
    match plan.network.mode {
        NetMode::None => {
            s.push_str("t net_tcp sh -c 'exec 3<>/dev/tcp/192.0.2.1/443' \n");
            checks.push((
                "net_tcp".into(),
                "a TCP connection out (network none)".into(),
                true,
            ));
        }
        NetMode::Allow => {
            s.push_str(
                "t net_unlisted sh -c 'curl -sf -m 5 -o /dev/null https://aisb-test.invalid/'\n",
            );
            checks.push((
                "net_unlisted".into(),
                "a domain not in the allowlist, through the proxy".into(),
                true,
            ));
        }
        NetMode::Host => {}
    }
    s.push_str("t caps sh -c 'grep -q \"^CapEff:[[:space:]]*0*$\" /proc/self/status'\n");
    checks.push(("caps".into(), "no effective capabilities".into(), false));
    s.push_str("t seccomp sh -c 'grep -q \"^Seccomp:[[:space:]]*2\" /proc/self/status'\n");
    checks.push(("seccomp".into(), "seccomp filter in force".into(), false));
    s.push_str("t nnp sh -c 'grep -q \"^NoNewPrivs:[[:space:]]*1\" /proc/self/status'\n");
    checks.push(("nnp".into(), "no_new_privs set".into(), false));
    // Through the init's own probes: present in every sandbox, whatever the image holds.
    for (key, probe, what) in [
        (
            "io_uring",
            "io-uring",
            "io_uring_setup (I/O that the seccomp filter never sees)",
        ),
        (
            "pidfd_getfd",
            "pidfd-getfd",
            "take another process's descriptor (pidfd_getfd)",
        ),
    ] {
        s.push_str(&format!(
            "t {key} {} probe {probe}\n",
            crate::vocab::INIT_PATH
        ));
        checks.push((key.into(), what.into(), true));
    }
    // Last, as it leaves the sandbox full: one more process than the pids limit allows (each a
    // `sleep` that goes with the sandbox). The shell dies at the first refused fork; the
    // attempt "succeeds" when every one of them started.
    let over = plan.limits.pids + 1;
    s.push_str(&format!(
        "t pids_limit sh -c {}\n",
        q(&format!(
            "i=0; while [ $i -lt {over} ]; do sleep 30 & i=$((i+1)); done"
        ))
    ));
    checks.push((
        "pids_limit".into(),
        format!("start {over} processes (pids limit {})", plan.limits.pids),
        true,
    ));
    (s, checks)
}

/// The masked files the project's index tracks, with their blobs: at most `max` (and 20),
/// read by aisb's git with reduced trust.
fn masked_blobs(plan: &Plan, max: usize) -> Vec<(String, String)> {
    use crate::git::store::Rules;
    let Some(rules) = plan.live.as_ref() else {
        return Vec::new();
    };
    let Ok(out) = crate::git::for_work_tree(&plan.project)
        .args(["ls-files", "-s", "-z"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    out.stdout
        .split(|b| *b == 0)
        .filter_map(|entry| {
            // `MODE OID STAGE\tPATH`
            let tab = entry.iter().position(|b| *b == b'\t')?;
            let (head, path) = (&entry[..tab], &entry[tab + 1..]);
            let oid = std::str::from_utf8(head).ok()?.split(' ').nth(1)?;
            (head.starts_with(b"100") && rules.masked(path).is_some())
                .then(|| (String::from_utf8_lossy(path).into_owned(), oid.to_string()))
        })
        .filter(|(_, oid)| crate::git::back::is_object_name(oid))
        .take(max.min(20))
        .collect()
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let plan = g.plan(&host, a.profile.clone(), vec![])?;
    let (probe, checks) = script(&plan, a.max_masks.unwrap_or(usize::MAX));
    // Asked here, on the terminal, if at all: the run below has none.
    crate::trust::check(&plan, &host.config_home(), g.trust)?;
    let exe = super::current_exe()?;
    let mut cmd = Command::new(exe);
    if let Some(f) = &g.file {
        cmd.arg("-f").arg(f);
    }
    if let Some(d) = g.domains {
        cmd.args(["--domains", d.name()]);
    }
    cmd.arg("--trust");
    cmd.arg("run");
    if let Some(p) = &a.profile {
        cmd.args(["--profile", p]);
    }
    if let Some(b) = a.backend {
        cmd.arg("--backend").arg(
            clap::ValueEnum::to_possible_value(&b)
                .map_or_else(String::new, |v| v.get_name().to_string()),
        );
    }
    // Where the attempts on masked paths are to be found afterwards.
    let log = plan.state_dir.join("audit.jsonl");
    let log_from = std::fs::metadata(&log).map_or(0, |m| m.len());
    let out = cmd
        .args(["--", "/bin/bash", "-c", &probe])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Io {
            path: "aisb run".into(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let status = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
            .map(str::to_string)
    };
    let results: Vec<Check> = checks
        .into_iter()
        .map(|(key, what, must_fail)| {
            let got = status(&key);
            let (observed, ok) = match (got.as_deref(), must_fail) {
                (None, _) => ("did not run".to_string(), false),
                // A missing tool or an attempt this kernel cannot make proves nothing.
                (Some(c @ ("126" | "127")), _) => (format!("could not run ({c})"), false),
                (Some("0"), true) => ("SUCCEEDED".to_string(), false),
                (Some(c), true) => (format!("refused ({c})"), true),
                (Some("0"), false) => ("yes".to_string(), true),
                (Some(c), false) => (format!("no ({c})"), false),
            };
            Check {
                check: what,
                expected: if must_fail { "refused" } else { "yes" },
                observed,
                ok,
            }
        })
        .collect();
    let mut results = results;
    // Each refused read of a masked file is an audit event (issue 32): seen in the log.
    // Where the layer is (mountinfo's octal escapes undone): only those masks can be told.
    let covered: std::collections::HashSet<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("deny_at="))
        .map(|at| {
            at.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
                .replace("\\134", "\\")
        })
        .collect();
    let file_masks: Vec<String> = plan
        .masks
        .iter()
        .take(a.max_masks.unwrap_or(usize::MAX))
        // Not those whose attempts are not told (`eval::masks::UNREPORTED`).
        .filter(|m| !m.dir && !m.rule.ends_with(crate::eval::masks::UNREPORTED))
        .map(|m| m.path.to_string_lossy().into_owned())
        .collect();
    let files: Vec<String> = file_masks
        .iter()
        .filter(|f| covered.contains(*f))
        .cloned()
        .collect();
    if !file_masks.is_empty()
        && covered.is_empty()
        && results.iter().any(|c| c.observed != "did not run")
    {
        results.push(Check {
            check: "refused reads of masked files are in the audit log".into(),
            expected: "yes",
            observed: "no: the reporting layer is not there (FUSE: the kernel's module, /dev/fuse for this user; `aisb doctor`)".into(),
            ok: false,
        });
    }
    if !files.is_empty() && results.iter().any(|c| c.observed != "did not run") {
        let text = std::fs::read(&log)
            .ok()
            .map(|b| {
                String::from_utf8_lossy(b.get(log_from as usize..).unwrap_or_default()).into_owned()
            })
            .unwrap_or_default();
        let reported: std::collections::HashSet<String> = crate::audit::parse(&text)
            .into_iter()
            .filter_map(|e| match e.kind {
                crate::audit::Kind::File {
                    target, operation, ..
                } if operation == "read" => Some(target),
                _ => None,
            })
            .collect();
        let seen = files.iter().filter(|f| reported.contains(*f)).count();
        results.push(Check {
            check: format!(
                "refused reads of masked files are in the audit log ({seen} of {})",
                files.len()
            ),
            expected: "yes",
            observed: if seen == files.len() {
                "yes".into()
            } else {
                format!("no: {} not reported", files.len() - seen)
            },
            ok: seen == files.len(),
        });
    }
    let failed = results.iter().filter(|c| !c.ok).count();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&results).unwrap_or_default()
        );
    } else {
        println!("{:<6} {:<70} {:<9} OBSERVED", "", "CHECK", "EXPECTED");
        for c in &results {
            println!(
                "{:<6} {:<70} {:<9} {}",
                if c.ok { "ok" } else { "FAIL" },
                c.check,
                c.expected,
                c.observed
            );
        }
        if !plan.tools.is_empty() {
            println!("\ntool policy (`tools`), per agent preset:");
            for line in plan.tools.describe() {
                println!("  {line}");
            }
            println!();
        }
        println!(
            "{} checks, {failed} failed (profile {}, {} masked paths)",
            results.len(),
            plan.profile,
            plan.masks.len()
        );
        if results.iter().all(|c| c.observed == "did not run") {
            eprintln!(
                "the sandbox did not run: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}
