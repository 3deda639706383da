//! Plan -> OCI runtime spec. A pure function of the plan and where the bundle's files live; no
//! I/O, so the output is snapshot-tested. `bundle` writes the rest of a bundle (rootfs skeleton,
//! the masking file, overlay dirs, copies) so any OCI runtime can run it.
//!
//! Mount order matters and is: kernel filesystems, system paths (read-only), the plan's mounts
//! (parents before children: home, /tmp, project, extra), then masks, last, so that nothing
//! mounted later can uncover a masked path.

pub mod bundle;
pub mod k8s;

use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;
use serde_json::{json, Value};

use crate::eval::plan::{MountKind, NetMode, Plan, SystemPath};
use crate::vocab::INIT_PATH;

/// Where the bundle's own files are. Absolute paths, except `rootfs` (relative to the bundle).
#[derive(Debug, Clone)]
pub struct SpecPaths {
    pub rootfs: PathBuf,
    /// An empty file with mode 0000, bind-mounted read-only over masked files: reading one
    /// fails with EACCES (not an empty read the agent could trust).
    pub mask_file: PathBuf,
    /// Absolute cgroup path (never empty: "" on cgroup v1 means the caller's own cgroup).
    pub cgroups_path: String,
    /// Host path of the aisb binary: mounted read-only at [`INIT_PATH`] and run as the
    /// sandbox's first process (loopback, capabilities, no_new_privs, seccomp, reaping).
    /// `None` only for specs meant to be read, not run.
    pub init: Option<PathBuf>,
    /// Give the process a pseudo-terminal (runtimes that need a console socket).
    pub terminal: bool,
    /// Host directory holding the network proxy's socket, mounted read-only at
    /// `/run/aisb/net` when the network is `allow` (the init relays loopback ports to it).
    /// Without it such a sandbox has no way out at all.
    pub proxy_dir: Option<PathBuf>,
    /// Set when an ordinary user runs a runtime whose init is root inside while it sets the
    /// sandbox up (libcontainer): container root maps to one of their subordinate ids.
    pub rootless: Option<Rootless>,
    /// How the plan's limits are enforced here (see `runtime::limits`).
    pub limits: LimitsBy,
    /// Host file holding [`mask_list`]'s bytes, mounted at [`crate::vocab::MASK_LIST`]: with
    /// an init, the masks are its to mount, one mount(2) each (thousands of OCI mounts cost
    /// libcontainer a mount-table read each, and bubblewrap caps its arguments at 9,000).
    /// `None`: each mask is a mount of the spec (specs for other runtimes).
    pub mask_list: Option<PathBuf>,
}

/// The masks a spec makes: only where something is mounted (a mask on a mount's own target
/// hides the whole mount: `block` wins over `mount`); elsewhere the path does not exist inside.
fn visible_masks(plan: &Plan) -> impl Iterator<Item = &crate::eval::plan::Mask> {
    let visible = |p: &Path| {
        plan.mounts.iter().any(|m| p.starts_with(&m.target))
            || plan
                .system
                .iter()
                .any(|sp| sp.mounted_at().is_some_and(|path| p.starts_with(path)))
    };
    plan.masks.iter().filter(move |m| visible(&m.path))
}

/// The contents of [`SpecPaths::mask_list`] for `plan`: each masked path, ended by NUL (a path
/// may hold any other byte). Parents come before what is inside them (the plan's order).
pub fn mask_list(plan: &Plan) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for m in visible_masks(plan) {
        out.extend_from_slice(m.path.as_os_str().as_bytes());
        out.push(0);
    }
    out
}

/// What enforces a sandbox's limits on this host, for this caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitsBy {
    /// A cgroup the runtime makes with the spec's `linux.resources`.
    Cgroup,
    /// A cgroup aisb made at `cgroupsPath` with the limits set, before the runtime starts:
    /// the spec names it and carries no resources. For bwrap (no cgroup support) and for
    /// rootless libcontainer, whose cgroup v1 manager, given resources, also writes the
    /// devices controller's rules, which only root may.
    OwnCgroup,
    /// No cgroup can be had: the pids limit becomes the init's RLIMIT_NPROC. It counts the
    /// tasks of the workload's uid in the sandbox's own user namespace, so for an ordinary
    /// user it is a per-sandbox limit; memory and CPU limits have no rlimit equivalent.
    Rlimit,
    /// Nothing can enforce them (root without a pids cgroup).
    Nothing,
}

/// The ids an unprivileged caller's sandbox maps beside their own (see `runtime::rootless`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rootless {
    /// Host uid and gid (subordinate ids of the caller) that container root maps to.
    pub root_uid: u32,
    pub root_gid: u32,
    /// The cgroup delegated to the caller, under which their sandboxes' cgroups go.
    pub cgroup_parent: String,
    /// The runtime already runs in a user namespace with the caller's whole map over their
    /// subordinate ids (`userns`: an ordinary user's sandbox on an image, whose files belong
    /// to those ids): the spec makes no user namespace of its own.
    pub outer_userns: bool,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SpecError {
    #[error("the generated spec is invalid: {0}")]
    #[diagnostic(help("this is a bug in aisb; please report it with `aisb plan --json`"))]
    Invalid(#[from] serde_json::Error),
    #[error("{} is not valid UTF-8: a runtime spec cannot name it, so aisb could not {what} it", path.display())]
    #[diagnostic(help(
        "rename it to a UTF-8 name, or move it out of the project; nothing was run"
    ))]
    NotUtf8 { path: PathBuf, what: &'static str },
    #[error("{} has `:` or `,` in its path: overlayfs takes its layers as a list separated by them, so aisb could not copy-on-write {}", path.display(), target.display())]
    #[diagnostic(help(
        "move the directory (or XDG_CACHE_HOME, where aisb keeps its layers) to a path without `:` or `,`; nothing was run"
    ))]
    LayerPath { path: PathBuf, target: PathBuf },
}

pub const MASKED_PROC: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PROC: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn mount(dest: &Path, ty: &str, source: &str, options: &[String]) -> Value {
    json!({ "destination": s(dest), "type": ty, "source": source, "options": options })
}

fn opts(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The spec as JSON with sorted keys, so the same plan always gives the same bytes.
pub fn to_json(spec: &Spec) -> Result<String, SpecError> {
    let mut v = serde_json::to_value(spec)?;
    // Capability sets are hash sets in oci-spec: sort them too.
    if let Some(Value::Object(sets)) = v.pointer_mut("/process/capabilities") {
        for set in sets.values_mut() {
            if let Value::Array(caps) = set {
                caps.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
            }
        }
    }
    Ok(serde_json::to_string_pretty(&v)?)
}

/// The caller's own id mapped to itself, and container root to `root` when given (and the
/// caller is not root already).
fn id_maps(own: u32, root: Option<u32>) -> Vec<Value> {
    let mut maps = Vec::new();
    if let Some(host) = root.filter(|_| own != 0) {
        maps.push(json!({ "containerID": 0, "hostID": host, "size": 1 }));
    }
    maps.push(json!({ "containerID": own, "hostID": own, "size": 1 }));
    maps
}

/// The kernel filesystems every sandbox (and build step) gets first: a fresh /proc, a
/// private /dev with its own pts and shm, a read-only /sys.
fn kernel_mounts() -> Vec<Value> {
    vec![
        mount(
            Path::new("/proc"),
            "proc",
            "proc",
            &opts(&["nosuid", "noexec", "nodev"]),
        ),
        mount(
            Path::new("/dev"),
            "tmpfs",
            "tmpfs",
            &opts(&["nosuid", "strictatime", "mode=755", "size=65536k"]),
        ),
        mount(
            Path::new("/dev/pts"),
            "devpts",
            "devpts",
            &opts(&[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ]),
        ),
        mount(
            Path::new("/dev/shm"),
            "tmpfs",
            "shm",
            &opts(&["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
        ),
        mount(
            Path::new("/sys"),
            "sysfs",
            "sysfs",
            &opts(&["nosuid", "noexec", "nodev", "ro"]),
        ),
    ]
}

pub fn build(plan: &Plan, paths: &SpecPaths) -> Result<Spec, SpecError> {
    // A path the spec would name under another (lossily decoded) name would not be masked or
    // mounted at all: refused, never run weaker.
    let named = plan
        .masks
        .iter()
        .map(|m| (&m.path, "mask"))
        .chain(plan.mounts.iter().map(|m| (&m.target, "mount")));
    for (path, what) in named {
        if path.to_str().is_none() {
            return Err(SpecError::NotUtf8 {
                path: path.clone(),
                what,
            });
        }
    }
    let netns = plan.network.mode != NetMode::Host;
    let mut mounts = kernel_mounts();
    for sys in &plan.system {
        if let SystemPath::Snapshot { path, snapshot, .. } = sys {
            mounts.push(mount(
                path,
                "bind",
                &s(&snapshot.dir),
                &opts(&["rbind", "ro", "nosuid", "nodev"]),
            ));
        }
        if let SystemPath::Bind { path } = sys {
            mounts.push(mount(
                path,
                "bind",
                &s(path),
                &opts(&["rbind", "ro", "nosuid", "nodev"]),
            ));
        }
        if let SystemPath::Image { path, source } = sys {
            mounts.push(mount(
                path,
                "bind",
                &s(source),
                &opts(&["rbind", "ro", "nosuid", "nodev"]),
            ));
        }
    }
    for m in &plan.mounts {
        if let MountKind::Overlay {
            lower,
            upper,
            work,
            above,
        } = &m.kind
        {
            // One layer with `:` would be read as two (a parent directory among them).
            if let Some(bad) = [lower, upper, work].into_iter().chain(above).find(|p| {
                p.as_os_str()
                    .as_encoded_bytes()
                    .iter()
                    .any(|b| matches!(b, b':' | b','))
            }) {
                return Err(SpecError::LayerPath {
                    path: bad.clone(),
                    target: m.target.clone(),
                });
            }
        }
        let v = match &m.kind {
            MountKind::Bind { source, writable }
            | MountKind::Git {
                source, writable, ..
            } => mount(
                &m.target,
                "bind",
                &s(source),
                &opts(&[
                    "rbind",
                    if *writable { "rw" } else { "ro" },
                    "nosuid",
                    "nodev",
                ]),
            ),
            MountKind::Overlay {
                lower,
                upper,
                work,
                above,
            } => mount(
                &m.target,
                "overlay",
                "overlay",
                &[
                    // The leftmost lower layer is the topmost.
                    match above {
                        Some(a) => format!("lowerdir={}:{}", s(a), s(lower)),
                        None => format!("lowerdir={}", s(lower)),
                    },
                    format!("upperdir={}", s(upper)),
                    format!("workdir={}", s(work)),
                    "userxattr".into(),
                    "nosuid".into(),
                    "nodev".into(),
                ],
            ),
            MountKind::Copy { copy, .. } => mount(
                &m.target,
                "bind",
                &s(copy),
                &opts(&["bind", "rw", "nosuid", "nodev"]),
            ),
            MountKind::State { dir } => mount(
                &m.target,
                "bind",
                &s(dir),
                &opts(&["rbind", "rw", "nosuid", "nodev"]),
            ),
            MountKind::Generated { dir, .. } => mount(
                &m.target,
                "bind",
                &s(dir),
                &opts(&["rbind", "ro", "nosuid", "nodev"]),
            ),
            MountKind::Tmpfs { size, mode, owner } => {
                let mut o = opts(&["nosuid", "nodev"]);
                o.push(format!("mode={mode:o}"));
                if let Some((uid, gid)) = owner {
                    o.push(format!("uid={uid}"));
                    o.push(format!("gid={gid}"));
                }
                if let Some(size) = size {
                    o.push(format!("size={size}"));
                }
                mount(&m.target, "tmpfs", "tmpfs", &o)
            }
        };
        mounts.push(v);
    }
    // With an init and a list, the init mounts the masks (after everything else, as here).
    let listed =
        paths.init.is_some() && paths.mask_list.is_some() && visible_masks(plan).next().is_some();
    if let (true, Some(list)) = (listed, &paths.mask_list) {
        mounts.push(mount(
            Path::new(crate::vocab::MASK_LIST),
            "bind",
            &s(list),
            &opts(&["bind", "ro", "nosuid", "nodev", "noexec"]),
        ));
    }
    for m in visible_masks(plan).filter(|_| !listed) {
        mounts.push(if m.dir {
            mount(
                &m.path,
                "tmpfs",
                "tmpfs",
                &opts(&["ro", "nosuid", "nodev", "noexec", "mode=555", "size=4k"]),
            )
        } else {
            mount(
                &m.path,
                "bind",
                &s(&paths.mask_file),
                &opts(&["bind", "ro", "nosuid", "nodev", "noexec"]),
            )
        });
    }

    // The live mask layer binds this file over secrets that appear while the sandbox runs
    // (`runtime::live`): a clone of a mount already in the sandbox's namespace is what the new
    // mount API lets it attach there on every kernel.
    if (plan.live.is_some() || listed) && paths.init.is_some() {
        mounts.push(mount(
            Path::new(crate::vocab::MASK_SOURCE),
            "bind",
            &s(&paths.mask_file),
            &opts(&["bind", "ro", "nosuid", "nodev", "noexec"]),
        ));
    }

    // Where the mask helper mounts the reporting layer (see `runtime::live::deny`).
    if paths.init.is_some() && (plan.live.is_some() || visible_masks(plan).next().is_some()) {
        mounts.push(mount(
            Path::new(crate::vocab::DENY_DIR),
            "tmpfs",
            "tmpfs",
            &opts(&["ro", "nosuid", "nodev", "noexec", "mode=0555", "size=4k"]),
        ));
    }

    let proxied = netns && plan.network.mode == NetMode::Allow;
    if let (true, Some(dir)) = (proxied, &paths.proxy_dir) {
        mounts.push(mount(
            Path::new(crate::vocab::PROXY_DIR),
            "bind",
            &s(dir),
            &opts(&["bind", "ro", "nosuid", "nodev", "noexec"]),
        ));
    }
    // Transparent egress: the sandbox's resolver is the init's stub, whatever /etc held.
    let resolv = plan.mounts.iter().find_map(|m| match &m.kind {
        MountKind::Generated { dir, .. } if m.target == Path::new(crate::vocab::RESOLV_DIR) => {
            Some(dir.join("resolv.conf"))
        }
        _ => None,
    });
    let transparent = proxied && !plan.network.transparent_ports.is_empty();
    // Bound only over a file the sandbox's /etc has (a bind target cannot be made in a
    // read-only /etc: the host's /etc snapshot always has one; an image may not, and then
    // resolvers ask 127.0.0.1, where the stub answers too).
    let etc_has_resolv = plan.system.iter().any(|sp| match sp {
        // The snapshot always has one (`graph::etc`).
        SystemPath::Snapshot { path, .. } if path == Path::new("/etc") => true,
        SystemPath::Image { path, source } if path == Path::new("/etc") => {
            source.join("resolv.conf").exists()
        }
        SystemPath::Bind { path } if path == Path::new("/etc") => path.join("resolv.conf").exists(),
        _ => false,
    });
    if let (true, true, Some(file)) = (transparent, etc_has_resolv, &resolv) {
        mounts.push(mount(
            Path::new("/etc/resolv.conf"),
            "bind",
            &s(file),
            &opts(&["bind", "ro", "nosuid", "nodev", "noexec"]),
        ));
    }
    if let Some(init) = &paths.init {
        mounts.push(mount(
            Path::new(INIT_PATH),
            "bind",
            &s(init),
            &opts(&["bind", "ro", "nosuid", "nodev"]),
        ));
    }

    let outer_userns = paths.rootless.as_ref().is_some_and(|r| r.outer_userns);
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
        json!({"type": "user"}),
        json!({"type": "cgroup"}),
    ];
    if outer_userns {
        namespaces.retain(|n| n["type"] != "user");
    }
    if netns {
        namespaces.push(json!({"type": "network"}));
    }
    let id = &plan.identity;
    let env: Vec<String> = plan
        .env
        .vars
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let rlimits: Vec<Value> = plan
        .process
        .rlimits
        .iter()
        .map(|r| json!({"type": r.kind, "soft": r.soft, "hard": r.hard}))
        .collect();
    // The init needs CAP_NET_ADMIN for `lo` and CAP_SETPCAP to empty the bounding set; it drops
    // both (and everything else) before the workload starts.
    let init_caps: Vec<String> = match (&paths.init, netns) {
        // Transparent egress binds 53, 80, 443, 22 before the capabilities go.
        (Some(_), true) if transparent => {
            opts(&["CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_SETPCAP"])
        }
        (Some(_), true) => opts(&["CAP_NET_ADMIN", "CAP_SETPCAP"]),
        (Some(_), false) => opts(&["CAP_SETPCAP"]),
        (None, _) => Vec::new(),
    };
    // The init mounts the masks (and a mount namespace of its own where bwrap's is not its
    // user namespace's), then drops this with the rest.
    let init_caps = if listed {
        let mut caps = init_caps;
        caps.push("CAP_SYS_ADMIN".to_string());
        caps
    } else {
        init_caps
    };
    let mut args: Vec<String> = Vec::new();
    if paths.init.is_some() {
        args.extend([INIT_PATH.to_string(), "__init".to_string()]);
        if netns {
            args.push("--loopback".into());
        }
        if proxied {
            args.push("--relay-proxy".into());
            for p in &plan.network.localhost_ports {
                args.push(format!("--relay-port={p}"));
            }
            if transparent && resolv.is_some() {
                let ports: Vec<String> = plan
                    .network
                    .transparent_ports
                    .iter()
                    .map(u16::to_string)
                    .collect();
                args.push(format!("--transparent={}", ports.join(",")));
            }
        }
        if listed {
            args.push(format!("--mask-list={}", crate::vocab::MASK_LIST));
        }
        if paths.limits == LimitsBy::Rlimit {
            let n = plan.limits.pids;
            args.push(format!("--rlimit=RLIMIT_NPROC={n}:{n}"));
        }
        for r in &plan.process.rlimits {
            args.push(format!("--rlimit={}={}:{}", r.kind, r.soft, r.hard));
        }
        args.push("--".into());
    }
    args.extend(plan.process.args.iter().cloned());
    let mut linux = json!({
        "uidMappings": id_maps(id.uid, paths.rootless.as_ref().map(|r| r.root_uid)),
        "gidMappings": id_maps(id.gid, paths.rootless.as_ref().map(|r| r.root_gid)),
        "namespaces": namespaces,
        "cgroupsPath": paths.cgroups_path,
        "maskedPaths": MASKED_PROC,
        "readonlyPaths": READONLY_PROC,
        "rootfsPropagation": "private",
    });
    if outer_userns {
        if let Some(l) = linux.as_object_mut() {
            l.remove("uidMappings");
            l.remove("gidMappings");
        }
    }
    if paths.limits == LimitsBy::Cgroup {
        linux["resources"] = resources(&plan.limits);
    }
    let v = json!({
        "ociVersion": "1.0.2",
        "root": { "path": s(&paths.rootfs), "readonly": true },
        "hostname": plan.process.hostname,
        "process": {
            "terminal": paths.terminal,
            "user": { "uid": id.uid, "gid": id.gid },
            "args": args,
            "env": env,
            "cwd": s(&plan.process.cwd),
            "noNewPrivileges": true,
            "capabilities": { "bounding": init_caps, "effective": init_caps, "inheritable": init_caps, "permitted": init_caps, "ambient": init_caps },
            "rlimits": rlimits,
        },
        "mounts": mounts,
        "linux": linux,
        "annotations": {
            "org.aisb.profile": plan.profile,
            "org.aisb.project": s(&plan.project),
            "org.aisb.network": match plan.network.mode { NetMode::None => "none", NetMode::Allow => "allow", NetMode::Host => "host" },
        },
    });
    Ok(serde_json::from_value(v)?)
}

/// The CFS period CPU limits are expressed in (the kernel's default, 100 ms).
pub const CPU_PERIOD_US: u64 = 100_000;

/// `linux.resources` for the plan's limits. Swap is limited to the memory limit (OCI's
/// `swap` is memory plus swap): the sandbox cannot swap its way around it.
fn resources(l: &crate::eval::plan::Limits) -> Value {
    let mut r = json!({ "pids": { "limit": l.pids } });
    if let Some(m) = l.memory {
        r["memory"] = json!({ "limit": m, "swap": m });
    }
    if let Some(c) = l.cpus_milli {
        r["cpu"] = json!({ "quota": u64::from(c) * CPU_PERIOD_US / 1000, "period": CPU_PERIOD_US });
    }
    r
}

/// What an image build step's sandbox is (see `image::step`).
pub struct StepSpec<'a> {
    /// Where the helper mounts the step's root (an overlay whose upper dir is the new layer).
    pub root: &'a Path,
    pub init: &'a Path,
    /// The proxy's socket directory, when the step has network.
    pub proxy_dir: Option<&'a Path>,
    pub args: &'a [String],
    pub env: &'a [String],
    pub cwd: &'a str,
    pub user: (u32, u32),
    pub cgroups_path: String,
}

/// The capabilities a build step keeps (Docker's default set: enough for package managers
/// and `useradd`, nothing that reaches past the step's own namespaces).
pub const STEP_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The OCI spec of an image build step: root inside a user namespace that maps ids 0–65535
/// to themselves (files keep the owners the step gives them, so the image's users match the
/// host's), every namespace private, no network but the proxy's relay, the image's own root
/// writable (its changes land in the step's layer).
pub fn build_step(step: &StepSpec) -> Result<Spec, SpecError> {
    let mut mounts = kernel_mounts();
    mounts.push(mount(
        Path::new(INIT_PATH),
        "bind",
        &s(step.init),
        &opts(&["bind", "ro", "nosuid", "nodev"]),
    ));
    // Root keeps Docker's default set; another USER gets none (the init drops them all).
    let root = step.user.0 == 0;
    let mut args = vec![INIT_PATH.to_string(), "__init".into(), "--loopback".into()];
    if root {
        args.push("--keep-caps".into());
    }
    if let Some(dir) = step.proxy_dir {
        mounts.push(mount(
            Path::new(crate::vocab::PROXY_DIR),
            "bind",
            &s(dir),
            &opts(&["bind", "ro", "nosuid", "nodev", "noexec"]),
        ));
        args.push("--relay-proxy".into());
    }
    args.push("--".into());
    args.extend(step.args.iter().cloned());
    let mut caps = if root {
        opts(STEP_CAPS)
    } else {
        opts(&["CAP_SETPCAP"])
    };
    caps.push("CAP_NET_ADMIN".into());
    let map = vec![json!({"containerID": 0, "hostID": 0, "size": 65536})];
    let v = json!({
        "ociVersion": "1.0.2",
        "root": { "path": s(step.root), "readonly": false },
        "hostname": "aisb-build",
        "process": {
            "terminal": false,
            "user": { "uid": step.user.0, "gid": step.user.1 },
            "args": args,
            "env": step.env,
            "cwd": step.cwd,
            "noNewPrivileges": true,
            "capabilities": { "bounding": caps, "effective": caps, "inheritable": caps, "permitted": caps, "ambient": caps },
        },
        "mounts": mounts,
        "linux": {
            "uidMappings": map,
            "gidMappings": map,
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "user"}, {"type": "cgroup"}, {"type": "network"}],
            "cgroupsPath": step.cgroups_path,
            "maskedPaths": MASKED_PROC,
            "readonlyPaths": READONLY_PROC,
            "rootfsPropagation": "private",
        },
    });
    Ok(serde_json::from_value(v)?)
}
