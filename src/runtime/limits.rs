//! How a sandbox's limits (`limits { pids …; memory …; cpus … }`) are enforced on this host for
//! this caller, and what is said when one of them stopped the workload.
//!
//! | caller, host                                     | pids              | memory, cpus   |
//! |--------------------------------------------------|-------------------|----------------|
//! | root                                             | cgroup            | cgroup         |
//! | a user, cgroup v1, `aisb setup-user` done        | cgroup            | cgroup         |
//! | a user, otherwise (v1 not delegated; v2)         | RLIMIT_NPROC      | refused        |
//! | root without a pids cgroup (none mounted)        | warned, none      | refused        |
//!
//! RLIMIT_NPROC is counted per uid *per user namespace* (Linux 5.14+ ucounts), and the sandbox
//! has its own: for an ordinary user it caps the sandbox's tasks, not all of theirs. For root
//! it is no limit at all (the kernel exempts uid 0), hence the warning. A limit the
//! configuration names that nothing can enforce is refused: fail closed.

use crate::eval::plan::{Limits, Plan};
use crate::spec::LimitsBy;

use super::cgroup::{self, Hits};

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LimitsError {
    #[error("the {which} limit set at {at} cannot be enforced here: {why}")]
    #[diagnostic(help("{help}"))]
    Unenforceable {
        which: &'static str,
        at: String,
        why: String,
        help: String,
    },
}

/// What enforces `plan`'s limits for the caller (on either backend: libcontainer makes its
/// cgroup where aisb would); refuses when a configured one cannot be. A default pids limit
/// that cannot be applied is a warning on stderr.
pub fn decide(plan: &Plan) -> Result<LimitsBy, LimitsError> {
    // A deliberately weakened sandbox, so that `aisb test` and the suites prove they notice.
    let env = crate::eval::BREAK_ISOLATION_ENV;
    if std::env::var(env).as_deref() == Ok("pids") {
        eprintln!("aisb: WARNING: {env}=pids: this sandbox has no limits (a test of the tests)");
        return Ok(LimitsBy::Nothing);
    }
    let uid = nix::unistd::geteuid().as_raw();
    let (by, why) = match cgroup::available(&plan.limits, uid) {
        Ok(()) => (LimitsBy::Cgroup, String::new()),
        Err(why) if uid != 0 => (LimitsBy::Rlimit, why),
        Err(why) => (LimitsBy::Nothing, why),
    };
    check(&plan.limits, by, &why, &plan.identity.name)?;
    if by == LimitsBy::Nothing {
        eprintln!(
            "aisb: warning: this sandbox has no process limit ({why}); `aisb doctor` checks cgroups"
        );
    }
    Ok(by)
}

/// `plan` without aisb's default memory limit when a cgroup holds this caller's other limits
/// but no memory cgroup can hold that one (a user whose delegated cgroups lack the memory
/// controller, a host without its hierarchy). `None`: `plan` as it is (where no cgroup can be
/// had at all, no memory limit is applied anyway).
pub fn held(plan: &Plan) -> Option<Plan> {
    let l = &plan.limits;
    if l.configured("memory") || l.memory.is_none() {
        return None;
    }
    let uid = nix::unistd::geteuid().as_raw();
    let without = Limits {
        memory: None,
        ..l.clone()
    };
    if cgroup::available(l, uid).is_ok() || cgroup::available(&without, uid).is_err() {
        return None;
    }
    let mut p = plan.clone();
    p.limits.memory = None;
    Some(p)
}

/// Whether aisb's default memory limit in `limits` is held here (for `aisb plan`).
pub fn default_memory_held(limits: &Limits) -> bool {
    cgroup::available(limits, nix::unistd::geteuid().as_raw()).is_ok()
}

/// Refuse the configured limits `by` cannot enforce (`why`: why no cgroup).
fn check(limits: &Limits, by: LimitsBy, why: &str, user: &str) -> Result<(), LimitsError> {
    if by == LimitsBy::Cgroup {
        return Ok(());
    }
    let help = if nix::unistd::geteuid().is_root() {
        "mount the cgroup hierarchy it needs, or remove it from the `limits` node in sandbox.kdl"
            .to_string()
    } else {
        format!(
            "on a cgroup v1 host, root's one-time `aisb setup-user {user}` delegates a cgroup to you; \
             or remove it from the `limits` node in sandbox.kdl (or run as root)"
        )
    };
    let unenforced = [
        // aisb's default memory limit is set only where a cgroup can hold it.
        (
            "memory",
            limits.memory.is_some() && limits.configured("memory"),
        ),
        ("cpus", limits.cpus_milli.is_some()),
        ("pids", by == LimitsBy::Nothing && limits.configured("pids")),
    ];
    match unenforced.iter().find(|(_, set)| *set) {
        Some((which, _)) => Err(LimitsError::Unenforceable {
            which,
            at: limits.set_at.get(*which).cloned().unwrap_or_default(),
            why: why.to_string(),
            help,
        }),
        None => Ok(()),
    }
}

/// How limits are enforced for the caller, one line (`aisb doctor`); false when not at all.
pub fn describe(limits: &Limits) -> (bool, String) {
    let uid = nix::unistd::geteuid().as_raw();
    let layout = match super::rootless::cgroup_layout() {
        super::rootless::CgroupLayout::Unified => "cgroup v2",
        super::rootless::CgroupLayout::V1 => "cgroup v1",
    };
    match cgroup::available(limits, uid) {
        Ok(()) => (
            true,
            format!("pids, memory and cpus limits by {layout} (default: {} processes)", limits.pids),
        ),
        Err(why) if uid != 0 => (
            true,
            format!(
                "no cgroup for this user ({why}): the pids limit is an RLIMIT_NPROC in the sandbox's \
                 own user namespace; a memory or cpus limit is refused (cgroup v1: root's one-time \
                 `aisb setup-user NAME`)"
            ),
        ),
        Err(why) => (
            false,
            format!("{why}: sandboxes run with no process limit, and memory or cpus limits are refused"),
        ),
    }
}

/// The lines to say after a run that ran into a limit: which one, what it did, and how to
/// raise it. Empty when none was hit.
pub fn report(limits: &Limits, hits: Hits, exit_code: i32) -> Vec<String> {
    let whose = |name: &str| match limits.set_at.get(name) {
        Some(at) => format!("set at {at}"),
        None => "aisb's default".to_string(),
    };
    let mut out = Vec::new();
    if hits.oom_kills > 0 {
        let m = limits.memory.unwrap_or(0);
        out.push(format!(
            "aisb: the sandbox ran out of memory: the kernel killed {} process{} at its memory limit of {} ({}); exit status {exit_code}. Raise it in sandbox.kdl: `limits {{ memory \"{}\" }}`",
            hits.oom_kills,
            if hits.oom_kills == 1 { "" } else { "es" },
            human(m),
            whose("memory"),
            human(m.saturating_mul(2)),
        ));
    }
    if hits.pids > 0 {
        out.push(format!(
            "aisb: the sandbox hit its pids limit of {} processes and threads ({}): {} fork{} refused; exit status {exit_code}. Raise it in sandbox.kdl: `limits {{ pids {} }}`",
            limits.pids,
            whose("pids"),
            hits.pids,
            if hits.pids == 1 { " was" } else { "s were" },
            limits.pids.saturating_mul(2).min(crate::config::model::PIDS_MAX),
        ));
    }
    out
}

/// Bytes as the `limits` node writes them (`512M`, `8G`).
pub fn human(bytes: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        let mut l = Limits {
            memory: Some(512 << 20),
            ..Limits::default()
        };
        l.set_at.insert("memory".into(), "sandbox.kdl:2".into());
        l
    }

    #[test]
    fn report_names_the_limit_and_how_to_raise_it() {
        let l = limits();
        assert!(report(&l, Hits::default(), 0).is_empty());
        assert_eq!(
            report(&l, Hits { pids: 0, oom_kills: 1 }, 137),
            ["aisb: the sandbox ran out of memory: the kernel killed 1 process at its memory limit of 512M (set at sandbox.kdl:2); exit status 137. Raise it in sandbox.kdl: `limits { memory \"1G\" }`"]
        );
        assert_eq!(
            report(&l, Hits { pids: 3, oom_kills: 0 }, 2),
            ["aisb: the sandbox hit its pids limit of 4096 processes and threads (aisb's default): 3 forks were refused; exit status 2. Raise it in sandbox.kdl: `limits { pids 8192 }`"]
        );
    }

    #[test]
    fn configured_limits_without_a_cgroup_are_refused() {
        let l = limits();
        let e = check(&l, LimitsBy::Rlimit, "no cgroup", "dev").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the memory limit set at sandbox.kdl:2 cannot be enforced here: no cgroup"
        );
        // The default pids limit falls back to an rlimit, or to a warning for root.
        let d = Limits::default();
        assert!(check(&d, LimitsBy::Rlimit, "no cgroup", "dev").is_ok());
        assert!(check(&d, LimitsBy::Nothing, "no cgroup", "dev").is_ok());
        let mut p = Limits::default();
        p.set_at.insert("pids".into(), "sandbox.kdl:1".into());
        assert!(check(&p, LimitsBy::Rlimit, "no cgroup", "dev").is_ok());
        assert!(check(&p, LimitsBy::Nothing, "no cgroup", "dev").is_err());
        assert!(check(&l, LimitsBy::Cgroup, "", "dev").is_ok());
    }

    #[test]
    fn sizes_read_back_as_written() {
        assert_eq!(human(8 << 30), "8G");
        assert_eq!(human(1536 << 20), "1536M");
        assert_eq!(human(1000), "1000");
    }
}
