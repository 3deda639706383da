//! The raw configuration model: what one `sandbox.kdl` says, with a location for every value.
//! Nothing here is resolved: paths still hold `$VARS`, profiles are not merged, imports not read.

use super::diag::{Loc, Spanned};

pub type S<T> = Spanned<T>;

/// One decoded file.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ConfigFile {
    pub imports: Vec<S<String>>,
    /// The top-level settings: the base every profile extends unless it names another.
    pub base: Settings,
    pub profiles: Vec<ProfileDecl>,
    pub tasks: Vec<TaskDecl>,
    pub groups: Vec<GroupDecl>,
    pub default_profile: Option<S<String>>,
    pub images: Vec<ImageDecl>,
}

/// `image "NAME" { from …; run …; copy …; env …; … }`: a Dockerfile's steps in KDL.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ImageDecl {
    pub name: S<String>,
    pub steps: Vec<super::instr::Step>,
}

/// `rootfs`: what the sandbox's root filesystem is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RootfsCfg {
    /// The host's own system directories, read-only (the default).
    Host,
    /// Built from a Dockerfile (path relative to the project).
    Dockerfile(String),
    /// An `image` declared in KDL, by name.
    Image(String),
    /// An image used as it is: `oci:DIR[:TAG]`, `oci-archive:FILE`, or a registry reference.
    From(String),
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProfileDecl {
    pub name: S<String>,
    pub extends: Option<S<String>>,
    pub description: Option<String>,
    pub settings: Settings,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TaskDecl {
    pub name: S<String>,
    pub description: Option<String>,
    /// One string: run by `/bin/sh -c`; several: an argv.
    pub run: S<Vec<String>>,
    pub profile: Option<S<String>>,
    pub cwd: Option<S<String>>,
    pub env: Vec<(S<String>, S<String>)>,
}

/// `domains "NAME" "a.com" "*.b.com"`: a named list of domain rules presets can refer to.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GroupDecl {
    pub name: S<String>,
    pub domains: Vec<S<String>>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read-only bind mount.
    Ro,
    /// Read-write bind mount: writes reach the host.
    Rw,
    /// Copy-on-write: writable inside, changes kept in the sandbox's state, never on the host.
    Overlay,
}

impl Access {
    pub const NAMES: [&'static str; 3] = ["ro", "rw", "overlay"];
    pub fn parse(s: &str) -> Option<Access> {
        match s {
            "ro" | "read-only" => Some(Access::Ro),
            "rw" | "read-write" => Some(Access::Rw),
            "overlay" | "cow" => Some(Access::Overlay),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Ro => "ro",
            Access::Rw => "rw",
            Access::Overlay => "overlay",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HomeMode {
    /// An empty private home (tmpfs); only what is mounted into it is visible. The default.
    Empty,
    /// The real home, read-only, with the sensitive home paths masked.
    Ro,
    /// The real home, copy-on-write, with the sensitive home paths masked.
    Overlay,
}

impl HomeMode {
    pub const NAMES: [&'static str; 3] = ["empty", "ro", "overlay"];
    pub fn parse(s: &str) -> Option<HomeMode> {
        match s {
            "empty" | "hidden" => Some(HomeMode::Empty),
            "ro" | "read-only" => Some(HomeMode::Ro),
            "overlay" => Some(HomeMode::Overlay),
            _ => None,
        }
    }
}

/// Where `XDG_CONFIG_HOME`, `XDG_DATA_HOME`, `XDG_CACHE_HOME` and `XDG_STATE_HOME` point
/// inside (seed 003's state relocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum XdgMode {
    /// Their usual places under the home directory, as `home` shows it. The default.
    Home,
    /// Writable directories in the sandbox's state, kept between runs, never the host's.
    Sandbox,
}

impl XdgMode {
    pub const NAMES: [&'static str; 2] = ["home", "sandbox"];
    pub fn parse(s: &str) -> Option<XdgMode> {
        match s {
            "home" => Some(XdgMode::Home),
            "sandbox" => Some(XdgMode::Sandbox),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Inherit {
    /// Everything from the caller's environment, minus denied and secret-looking names.
    All,
    /// Only a fixed list of harmless names (PATH, TERM, LANG, …) plus `allow` and `pass`.
    Safe,
    /// Nothing but what `set`, `pass` and `allow` name.
    None,
}

impl Inherit {
    pub const NAMES: [&'static str; 3] = ["all", "safe", "none"];
    pub fn parse(s: &str) -> Option<Inherit> {
        match s {
            "all" => Some(Inherit::All),
            "safe" => Some(Inherit::Safe),
            "none" => Some(Inherit::None),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetMode {
    /// Loopback only, no proxy.
    None,
    /// Only the allowlisted domains, through the filtering proxy.
    Allow,
    /// The host's network namespace: no isolation at all.
    Host,
}

impl NetMode {
    pub const NAMES: [&'static str; 3] = ["none", "allow", "host"];
    pub fn parse(s: &str) -> Option<NetMode> {
        match s {
            "none" => Some(NetMode::None),
            "allow" => Some(NetMode::Allow),
            "host" => Some(NetMode::Host),
            _ => None,
        }
    }
}

/// How the allowlist combines the domain lists aisb ships (presets, built-in profiles) with
/// the ones written in the project's own configuration files (seed 003's network modes).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum DomainsMode {
    /// Only the built-in lists: what the project's files add is ignored.
    Strict,
    /// Built-in lists plus the project's own (the default).
    Merge,
    /// Only the project's own lists: the presets' domains are dropped.
    Replace,
}

impl DomainsMode {
    pub const NAMES: [&'static str; 3] = ["strict", "merge", "replace"];
    pub fn parse(s: &str) -> Option<DomainsMode> {
        match s {
            "strict" => Some(DomainsMode::Strict),
            "merge" => Some(DomainsMode::Merge),
            "replace" => Some(DomainsMode::Replace),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// Everything a profile can say. `None` / empty means "not said here" (inherit).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Settings {
    /// Preferred runtime (`libcontainer` | `bwrap`); `--backend` overrides it.
    pub backend: Option<S<String>>,
    pub rootfs: Option<S<RootfsCfg>>,
    /// `rootfs … { network … }`: what an image's RUN steps may reach (default: the
    /// `registries` and `os-packages` groups).
    pub build_network: Option<NetworkCfg>,
    pub project: ProjectCfg,
    pub read_only: Option<S<bool>>,
    pub mounts: Vec<MountCfg>,
    pub tmpfs: Vec<TmpfsCfg>,
    pub home: Option<S<HomeMode>>,
    /// `home … toolchains=#false`: no toolchain from the home (see `eval::toolchains`).
    #[serde(default)]
    pub toolchains: Option<S<bool>>,
    pub xdg: Option<S<XdgMode>>,
    pub block: Vec<S<String>>,
    pub allow: Vec<S<String>>,
    /// `unprotect ".vscode/settings.json" …`: protected files (`eval::protect`) the sandbox may
    /// write (a loosening, asked about like one).
    #[serde(default)]
    pub unprotect: Vec<S<String>>,
    pub secrets: SecretsCfg,
    pub env: EnvCfg,
    pub network: NetworkCfg,
    pub process: ProcessCfg,
    pub limits: LimitsCfg,
    /// `tools { allow …; deny … }`: the agent tools the workload may call (see `crate::tools`).
    #[serde(default)]
    pub tools: ToolsCfg,
    /// `credential "NAME" env="VAR" { from …; hosts …; header … }`: a secret the sandbox sees
    /// only as a placeholder, the proxy adding the real value for its hosts (issue 31).
    #[serde(default)]
    pub credentials: Vec<CredentialCfg>,
}

/// One `credential`, as written.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CredentialCfg {
    pub name: S<String>,
    /// The variable that holds the placeholder inside.
    pub env: Option<S<String>>,
    /// Where the real value comes from on the host.
    pub from: Option<S<CredentialSource>>,
    /// The hosts it is added for (exact names).
    pub hosts: Vec<S<String>>,
    /// `allow-request "GET *"`, `deny-request "POST */git-receive-pack"`: which requests to its
    /// hosts may go at all (`METHOD PATH`, `*` any run of characters).
    #[serde(default)]
    pub allow_requests: Vec<S<String>>,
    #[serde(default)]
    pub deny_requests: Vec<S<String>>,
    /// The header it goes in, and how (`raw`, `bearer`, `basic`; raw when not said).
    pub header: Option<S<String>>,
    pub scheme: Option<S<String>>,
    pub loc: super::diag::Loc,
}

/// `from env="VAR"`, `from file="PATH"`, `from command="gh auth token"`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CredentialSource {
    Env(String),
    File(String),
    Command(String),
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Env(v) => write!(f, "the caller's ${v}"),
            CredentialSource::File(p) => write!(f, "the file {p}"),
            CredentialSource::Command(c) => write!(f, "the output of `{c}`"),
        }
    }
}

/// `tools { allow "Read"; deny "Write" "Bash(git push:*)" }`, rules as written.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ToolsCfg {
    pub allow: Vec<S<String>>,
    pub deny: Vec<S<String>>,
}

/// `limits { pids 4096; memory "8G"; cpus 2; disk "20G" }`: the sandbox's share of the host,
/// enforced by a cgroup (the disk by aisb's watcher). `None`: not said here (inherit); for memory and cpus, `Some(None)` is
/// `"unlimited"` (a profile lifting what a preset set).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LimitsCfg {
    pub pids: Option<S<u64>>,
    /// Bytes.
    pub memory: Option<S<Option<u64>>>,
    /// Thousandths of a CPU (`cpus 1.5` is 1500).
    pub cpus: Option<S<Option<u32>>>,
    /// Bytes of the host's disk the sandbox's copy-on-write layers and private copies may
    /// take (see `runtime::disk`).
    #[serde(default)]
    pub disk: Option<S<Option<u64>>>,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ProjectCfg {
    pub root: Option<S<String>>,
    pub access: Option<S<Access>>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MountCfg {
    pub source: S<String>,
    pub target: Option<S<String>>,
    pub access: Access,
    pub optional: bool,
    pub loc: Loc,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TmpfsCfg {
    pub target: S<String>,
    pub size: Option<u64>,
    pub loc: Loc,
}

/// The layers of the blocklist (seed 000): built-in sensitive patterns, gitignored files,
/// git-crypt files, and the tool dirs exempted from the gitignored layer.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SecretsCfg {
    pub defaults: Option<S<bool>>,
    pub gitignored: Option<S<bool>>,
    pub git_crypt: Option<S<bool>>,
    pub tool_dirs: Vec<S<String>>,
    /// `dependency-dirs`: directories added to the built-in dependency and build-output
    /// directories (exempt from the gitignored layer, copy-on-write; see `eval::deps`).
    #[serde(default)]
    pub dependency_dirs: Vec<S<String>>,
    /// `not-dependency-dirs`: built-in ones this project uses for its own files (masked again
    /// when git ignores them).
    #[serde(default)]
    pub not_dependency_dirs: Vec<S<String>>,
    /// `write-through`: dependency directories the sandbox writes in place (a loosening).
    #[serde(default)]
    pub write_through: Vec<S<String>>,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct EnvCfg {
    pub inherit: Option<S<Inherit>>,
    pub filter_secrets: Option<S<bool>>,
    pub allow: Vec<S<String>>,
    pub deny: Vec<S<String>>,
    pub pass: Vec<S<String>>,
    pub set: Vec<(S<String>, S<String>)>,
    /// `from-file ".env" "KEY" …`: only these keys' values, read from that dotenv file.
    pub from_file: Vec<(S<String>, Vec<S<String>>)>,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct NetworkCfg {
    pub mode: Option<S<NetMode>>,
    /// `network domains="strict|merge|replace"`.
    pub domains: Option<S<DomainsMode>>,
    pub allow: Vec<S<String>>,
    pub deny: Vec<S<String>>,
    pub groups: Vec<S<String>>,
    pub localhost_ports: Vec<S<u16>>,
    /// `network transparent=#false`: no DNS stub, no relay for tools that ignore the proxy
    /// variables (on by default in allow mode).
    #[serde(default)]
    pub transparent: Option<S<bool>>,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ProcessCfg {
    pub command: Option<S<Vec<String>>>,
    pub cwd: Option<S<String>>,
    pub shell: Option<S<String>>,
    pub user: Option<UserCfg>,
    pub rlimits: Vec<RlimitCfg>,
    pub hostname: Option<S<String>>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct UserCfg {
    pub uid: Option<S<u32>>,
    pub gid: Option<S<u32>>,
    pub name: Option<S<String>>,
    pub loc: Loc,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RlimitCfg {
    pub resource: S<String>,
    pub soft: u64,
    pub hard: u64,
    pub loc: Loc,
}

/// What `limits` accepts: below these a shell cannot start a pipeline or the init cannot
/// load; above them the value is a typo (the kernel's own ceiling for pids, more memory than
/// any one machine has, more CPUs than the scheduler's quota can express).
pub const PIDS_MIN: u64 = 8;
pub const PIDS_MAX: u64 = 4_194_304;
pub const MEMORY_MIN: u64 = 16 << 20;
pub const MEMORY_MAX: u64 = 64 << 40;
pub const DISK_MIN: u64 = 16 << 20;
pub const DISK_MAX: u64 = 1 << 50;
pub const CPUS_MILLI_MIN: u32 = 10;
pub const CPUS_MILLI_MAX: u32 = 1_024_000;

/// The rlimit names accepted by `rlimit`, mapped to their OCI names.
pub const RLIMITS: [(&str, &str); 10] = [
    ("as", "RLIMIT_AS"),
    ("core", "RLIMIT_CORE"),
    ("cpu", "RLIMIT_CPU"),
    ("data", "RLIMIT_DATA"),
    ("fsize", "RLIMIT_FSIZE"),
    ("memlock", "RLIMIT_MEMLOCK"),
    ("nofile", "RLIMIT_NOFILE"),
    ("nproc", "RLIMIT_NPROC"),
    ("stack", "RLIMIT_STACK"),
    ("sigpending", "RLIMIT_SIGPENDING"),
];
