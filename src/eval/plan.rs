//! The resolved plan: what the sandbox will be, with no spans, no variables and no KDL.
//! Everything after evaluation (spec generation, runtimes, `aisb plan`) reads only this.

use std::path::PathBuf;

use serde::Serialize;

pub use crate::config::model::{Access, DomainsMode, NetMode};

/// A cache evaluation computed and did not write (evaluating writes nothing): the decoded
/// config files, the project scan. Whoever evaluated stores them (`graph::realise::memos`).
#[derive(Debug, Clone, Default)]
pub struct Memo {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The config file used, `None` when the embedded default applied.
    pub config_file: Option<PathBuf>,
    /// Caches to write (see [`Memo`]); taken by whoever stores them.
    #[serde(skip)]
    pub memos: Vec<Memo>,
    /// sha256 of every configuration file read from disk (the root and its imports), for
    /// pinning trust in exactly that text. None with the embedded default.
    #[serde(skip)]
    pub config_digest: Option<String>,
    pub profile: String,
    /// The runtime the configuration prefers, if it names one.
    pub backend: Option<String>,
    /// The root filesystem: the host's system directories, or an image (`image`).
    pub rootfs: Rootfs,
    /// Domain rules an image's RUN steps may reach through the proxy (empty: none).
    pub build_network: Vec<String>,
    pub project: PathBuf,
    pub project_access: Access,
    pub read_only: bool,
    pub identity: Identity,
    /// Per-sandbox state: overlay upper dirs, copies, bundle (`$XDG_CACHE_HOME/aisb/…`).
    pub state_dir: PathBuf,
    /// The content-addressed store shared by all sandboxes (`$XDG_CACHE_HOME/aisb/store`).
    pub store: PathBuf,
    /// Host system paths mounted read-only (or recreated as symlinks), in mount order.
    pub system: Vec<SystemPath>,
    /// Everything else mounted, in mount order (parents before children).
    pub mounts: Vec<Mount>,
    /// Paths hidden inside, each with the rule that hid it.
    pub masks: Vec<Mask>,
    /// Masks kept because an earlier run of this sandbox masked them, though the rules no
    /// longer would (`eval::masks::keep`): unmasking is the user's to approve (`aisb trust`).
    pub kept_masked: Vec<PathBuf>,
    /// Protected files absent at start (see [`Protected`]).
    pub protected: Vec<Protected>,
    /// The project's directories written in place, relative (`""` the top), when it is: where
    /// the run's end looks for protected names the sandbox created below the top
    /// (`runtime::protect`).
    #[serde(skip)]
    pub project_dirs: std::sync::Arc<ProjectDirs>,
    /// Protected names below the top that a mask or another mount covers (the sandbox cannot
    /// replace them): not the sandbox's when the run's end finds them.
    #[serde(skip)]
    pub protect_covered: Vec<PathBuf>,
    /// Protected files `unprotect` opened: written in place like the rest of the project.
    pub unprotected: Vec<PathBuf>,
    /// Dependency directories absent on the host that the runtime makes empty for the run, so
    /// that their copy-on-write layer has a place, and removes after it while still empty
    /// (`eval::deps::absent`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub made_for_run: Vec<PathBuf>,
    /// What the configuration files on disk expose beyond the defaults that the rest of the
    /// plan does not show (`allow`, a secrets layer turned off, `tool-dirs`,
    /// `dependency-dirs`, the project root moved), one line each with where it was written:
    /// trust asks about them like any other loosening.
    pub exposures: Vec<String>,
    /// What is masked when it appears in the project while the sandbox runs (see
    /// `runtime::live`); `None` when nothing is watched.
    #[serde(skip)]
    pub live: Option<LiveRules>,
    pub scan: ScanSummary,
    pub env: Env,
    pub network: Network,
    pub process: Process,
    pub limits: Limits,
    /// The agent tools the workload may call (`tools`), each rule with where it was written.
    pub tools: crate::tools::Policy,
    pub tasks: Vec<Task>,
    pub profiles: Vec<String>,
    /// Brokered credentials (`credential`): the sandbox's variable holds a placeholder, the
    /// proxy adds the real value for the hosts (issue 31). No value here: it is read at start.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<Credential>,
}

/// One brokered credential: where its real value comes from and where it may go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Credential {
    pub name: String,
    /// The variable inside that holds the placeholder.
    pub env: String,
    pub source: crate::config::model::CredentialSource,
    /// Normalised host names.
    pub hosts: Vec<String>,
    /// Request rules for its hosts: (rule, `file:line`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_requests: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny_requests: Vec<(String, String)>,
    /// The header, lower case.
    pub header: String,
    pub scheme: crate::config::credential::Scheme,
    /// `file:line` of the `credential` node.
    pub at: String,
}

impl Plan {
    /// Whether the workload may change the project's files (in place or in a copy-on-write
    /// layer): not under `read-only`, not with a read-only project.
    pub fn project_writable(&self) -> bool {
        !self.read_only && self.project_access != Access::Ro
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Rootfs {
    /// The host's system directories, read-only, and an allowlisted /etc snapshot.
    Host,
    /// Built from this Dockerfile (its directory is the build context).
    Dockerfile { path: PathBuf },
    /// An `image` declared in KDL (the project is the build context).
    Image {
        name: String,
        steps: Vec<crate::config::instr::Step>,
    },
    /// An image used as it is.
    From { source: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    pub home: PathBuf,
}

/// A snapshot of part of a host directory in the store (`graph::etc` plans and realises it;
/// its key covers every entry's stamp).
#[derive(Debug, Clone, Serialize)]
pub struct EtcSnapshot {
    /// Where the snapshot lives in the store.
    pub dir: PathBuf,
    #[serde(skip)]
    pub source: PathBuf,
    #[serde(skip)]
    pub names: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SystemPath {
    /// Read-only bind of the host path at the same place.
    Bind { path: PathBuf },
    /// The host path is a symlink (merged /usr): recreate it in the rootfs.
    Symlink { path: PathBuf, target: PathBuf },
    /// A store snapshot of part of a host directory (the /etc allowlist), one read-only bind.
    Snapshot {
        path: PathBuf,
        snapshot: EtcSnapshot,
    },
    /// A top-level directory of an image's root (mounted privately for the runtime), bound
    /// read-only at the same place.
    Image { path: PathBuf, source: PathBuf },
}

impl Mount {
    /// The guard this mount is (see [`crate::git`]), for a `Git` mount.
    pub fn git_guard(&self) -> Option<crate::git::Guard> {
        match &self.kind {
            MountKind::Git {
                source,
                writable,
                create_dir,
            } => Some(crate::git::Guard {
                target: self.target.clone(),
                source: source.clone(),
                writable: *writable,
                create_dir: *create_dir,
            }),
            _ => None,
        }
    }
}

impl SystemPath {
    /// Where it appears inside the sandbox when it is mounted (symlinks are not).
    pub fn mounted_at(&self) -> Option<&std::path::Path> {
        match self {
            SystemPath::Bind { path }
            | SystemPath::Snapshot { path, .. }
            | SystemPath::Image { path, .. } => Some(path),
            SystemPath::Symlink { .. } => None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Mount {
    pub target: PathBuf,
    #[serde(flatten)]
    pub kind: MountKind,
    /// Why this mount exists (`project`, `home`, `mount at sandbox.kdl:12`, …).
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum MountKind {
    Bind {
        source: PathBuf,
        writable: bool,
    },
    /// Copy-on-write directory: overlayfs with the host path as the lower layer.
    Overlay {
        lower: PathBuf,
        upper: PathBuf,
        work: PathBuf,
        /// A layer of aisb's between the upper and the lower one (a git directory's objects
        /// without masked content: `git::store`).
        #[serde(skip_serializing_if = "Option::is_none")]
        above: Option<PathBuf>,
    },
    /// Copy-on-write file: a private copy taken when the sandbox is created.
    Copy {
        source: PathBuf,
        copy: PathBuf,
    },
    Tmpfs {
        size: Option<u64>,
        mode: u32,
        owner: Option<(u32, u32)>,
    },
    /// A writable directory of the sandbox's own state (`xdg "sandbox"`), kept between runs and
    /// created on first use; never a host path the configuration named.
    State {
        dir: PathBuf,
    },
    /// Files aisb writes for the sandbox (an agent's settings mirroring it), read-only, in the
    /// store under a name from their content.
    Generated {
        dir: PathBuf,
        files: Vec<GeneratedFile>,
    },
    /// Part of a git directory the sandbox can otherwise write, bound over itself so git on
    /// the host never runs what the sandbox wrote (see [`crate::git`]): the directory pinned
    /// (`writable`), its config, hooks and info read-only.
    Git {
        source: PathBuf,
        writable: bool,
        create_dir: bool,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct GeneratedFile {
    pub name: String,
    pub content: String,
}

/// The project's directories as the scan saw them, relative to the project, `/`-separated:
/// those written in place (`dirs`, `""` the top) and those whose writes never reach the host
/// (`skip`: dependency and cache directories, masked directories, the git dir), which are
/// never walked.
#[derive(Debug, Clone, Default)]
pub struct ProjectDirs {
    /// With each its inode at the scan.
    pub dirs: Vec<(Vec<u8>, u64)>,
    pub skip: Vec<Vec<u8>>,
    /// Protected names below the top that `unprotect` opened (relative): the sandbox's own
    /// to make.
    pub opened: Vec<Vec<u8>>,
}

/// A file the host runs or obeys that did not exist when the sandbox started (see
/// `eval::protect`): one the sandbox creates is moved aside when the run ends.
#[derive(Debug, Clone, Serialize)]
pub struct Protected {
    pub path: PathBuf,
    pub dir: bool,
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Mask {
    pub path: PathBuf,
    pub dir: bool,
    pub rule: String,
}

/// The rules of the live mask layer: the sensitive patterns and the `block` list, minus `allow`.
/// Never the gitignored layer: builds write ignored outputs that they must read back.
#[derive(Debug, Clone)]
pub struct LiveRules {
    pub block: crate::eval::masks::PatternSet,
    pub allow: crate::eval::masks::PatternSet,
    /// Patterns written in `block` (the others come from the built-in sensitive set).
    pub explicit: std::collections::BTreeSet<String>,
    /// When the project scan began: a directory not changed since holds nothing it missed.
    pub since: std::time::SystemTime,
    /// Inside dependency and cache directories only credential files are masked.
    pub roles: crate::eval::deps::RoleRules,
}

/// The rules as they apply to a repository's history (`git::store`): the `block` list (built-in
/// and configured) and the credential files of dependency directories, wherever a path is
/// (which directories are dependency directories is the work tree's, which the sandbox
/// writes); `allow` unmasks.
impl crate::git::store::Rules for LiveRules {
    fn masked(&self, path: &[u8]) -> Option<String> {
        let check = |rel: &[u8], dir: bool| -> Option<String> {
            if self.allow.covers(rel, dir).is_some() {
                return None;
            }
            self.block
                .matching(rel, dir)
                .or_else(|| self.roles.dep_block.matching(rel, dir))
                .map(|p| self.rule_name(p))
        };
        if self.allow.covers(path, false).is_some() {
            return None;
        }
        check(path, false).or_else(|| {
            path.iter()
                .enumerate()
                .filter(|(_, b)| **b == b'/')
                .find_map(|(i, _)| check(&path[..i], true))
        })
    }

    fn digest(&self) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"aisb git store 3\0");
        // Which directories are dependency directories is not part of it (see `masked`).
        for set in [&self.block, &self.allow, &self.roles.dep_block] {
            for (p, d) in set.patterns().iter().zip(set.dir_only()) {
                h.update(p.as_bytes());
                h.update([0, u8::from(*d)]);
            }
            h.update([1]);
        }
        format!("{:x}", h.finalize())
    }
}

impl LiveRules {
    /// The rule that masks `rel` (project-relative, `/`-separated), as the audit log names it.
    pub fn rule_for(&self, rel: &(impl AsRef<[u8]> + ?Sized), is_dir: bool) -> Option<String> {
        if self.allow.covers(rel, is_dir).is_some() {
            return None;
        }
        let set = if self.roles.inside(rel.as_ref(), is_dir) {
            &self.roles.dep_block
        } else {
            &self.block
        };
        set.matching(rel, is_dir).map(|p| self.rule_name(p))
    }

    /// `block "P"` for a pattern of the `block` list, `sensitive "P"` for a built-in one.
    pub fn rule_name(&self, pattern: &str) -> String {
        if self.explicit.contains(pattern) {
            format!("block \"{pattern}\"")
        } else {
            format!("sensitive \"{pattern}\"")
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ScanSummary {
    pub git: bool,
    pub cached: bool,
    pub entries: usize,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Env {
    /// Names and values passed in. Values never leave the process except into the spec.
    #[serde(serialize_with = "names_only")]
    pub vars: Vec<(String, String)>,
    pub dropped: Vec<Dropped>,
}

fn names_only<S: serde::Serializer>(vars: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(vars.iter().map(|(k, _)| k))
}

#[derive(Debug, Clone, Serialize)]
pub struct Dropped {
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Network {
    pub mode: NetMode,
    /// How built-in and project domain lists were combined.
    pub domains: DomainsMode,
    /// Rules the domain mode left out, with where they were written.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub localhost_ports: Vec<u16>,
    /// Transparent egress (allow mode): the ports its relay takes for any address, empty when
    /// off. See [`crate::config::domain::transparent_ports`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub transparent_ports: Vec<u16>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Process {
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub shell: PathBuf,
    pub hostname: String,
    pub rlimits: Vec<Rlimit>,
}

/// The sandbox's share of the host, enforced by a cgroup (see `runtime::limits`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Processes and threads at once. Always set: a fork bomb inside must never use up the
    /// host's pid space.
    pub pids: u64,
    /// Bytes of memory (swap included: the sandbox cannot swap its way around it).
    pub memory: Option<u64>,
    /// Thousandths of a CPU's time (`cpus 1.5` is 1500).
    pub cpus_milli: Option<u32>,
    /// The host's disk the sandbox's copy-on-write layers and private copies may take.
    pub disk: Disk,
    /// Where the configuration set each limit (`pids` -> `sandbox.kdl:12`); a limit not
    /// named here is aisb's default.
    pub set_at: std::collections::BTreeMap<String, String>,
}

impl Limits {
    /// Processes and threads at once when nothing says otherwise. Far above what a build or a
    /// test runner starts (a `cargo build` on 64 cores, rustc's codegen threads included, or a
    /// jest/pytest-xdist run with a worker per core stays under ~2,000 tasks), and an eighth
    /// of a default host's pid space (`pid_max` is 32,768 up to 32 CPUs): several fork bombs
    /// at once still leave the host room to start processes.
    pub const DEFAULT_PIDS: u64 = 4096;

    /// Whether `name` (`pids`, `memory`, `cpus`) was set by the configuration.
    pub fn configured(&self, name: &str) -> bool {
        self.set_at.contains_key(name)
    }

    /// The memory limit when the configuration names none: half of the host's memory (at
    /// least 1 GiB), in whole MiB. A build or an agent has room; a runaway allocation inside
    /// never takes the host's last pages (the private /tmp's pages count against it too).
    /// `None` when the host's memory cannot be read.
    pub fn default_memory() -> Option<u64> {
        host_memory().map(|m| ((m / 2).max(1 << 30) >> 20) << 20)
    }

    /// The size of the sandbox's private /tmp when nothing says otherwise: a quarter of the
    /// host's memory (its pages are the host's memory), in whole MiB; 1 GiB when the host's
    /// memory cannot be read.
    pub fn default_tmp_size() -> u64 {
        host_memory().map_or(1 << 30, |m| ((m / 4).max(64 << 20) >> 20) << 20)
    }
}

/// MemTotal, in bytes (read once).
fn host_memory() -> Option<u64> {
    static TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    })
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            pids: Limits::DEFAULT_PIDS,
            memory: None,
            cpus_milli: None,
            disk: Disk::Default,
            set_at: Default::default(),
        }
    }
}

/// The disk budget (`limits { disk … }`, enforced by `runtime::disk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Disk {
    /// Half of what the layers hold plus what is free, on each file system they are on.
    Default,
    /// At most this many bytes (and never more than nine tenths of what they hold plus what
    /// is free).
    Bytes(u64),
    /// `disk "unlimited"`: not watched.
    Unlimited,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rlimit {
    /// OCI name, e.g. `RLIMIT_NOFILE`.
    pub kind: String,
    pub soft: u64,
    pub hard: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Task {
    pub name: String,
    pub description: Option<String>,
    pub args: Vec<String>,
    pub profile: Option<String>,
    pub cwd: Option<PathBuf>,
    #[serde(serialize_with = "names_only")]
    pub env: Vec<(String, String)>,
}
