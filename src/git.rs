//! Git on the host, in repositories a sandbox can write (the project of an ephemeral run, a
//! named sandbox's clone), without ever running what the sandbox wrote.
//!
//! Git runs programs that its configuration names (`core.fsmonitor` on every index read,
//! hooks, `core.sshCommand`, pagers, editors, credential helpers, filters, …), and it finds
//! that configuration through files in the git directory (`config`, `commondir`, `hooks/`,
//! `info/`). Two halves keep it out of the sandbox's reach:
//!
//! - [`guards`]: inside the sandbox, those files are bound read-only over themselves, and the
//!   git directory itself is bound over itself (a mount point cannot be renamed away and
//!   replaced by one the sandbox made). Objects, refs, the index and logs stay writable, so
//!   `git add`/`commit`/`branch`/`stash` work inside. The same for each submodule's git
//!   directory (`.git/modules/…`) and the `.git` files pointing at them; `.git/worktrees` is
//!   read-only as a whole (it belongs to work trees elsewhere on the host).
//! - [`command`]: every git aisb itself runs in such a repository names its git directory
//!   explicitly (a planted `commondir` cannot redirect it), reads no system configuration,
//!   and overrides every setting that names a program with one that runs nothing.
//!
//! What guards cannot stop, because the git directory must stay writable for commits: new
//! files there that git reads configuration through ([`PLANTABLE`]). [`disarm`] moves them
//! aside after a run and before aisb's own git touches the repository.

pub mod back;
pub mod lfs;
pub mod store;
pub mod view;

use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// At most this many guarded paths, and submodules nested this deep: a repository shaped by
/// a sandbox must not make aisb walk or mount without bound.
const MAX_GUARDS: usize = 1024;
const MAX_MODULE_DEPTH: usize = 8;

/// Settings that name programs git would run, each overridden (`-c` has the highest
/// precedence) with one that runs nothing; plus no automatic gc or maintenance (they start
/// further commands) and no transport but local paths.
const OVERRIDES: &[&str] = &[
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.sshCommand=false",
    "core.pager=cat",
    "core.editor=false",
    "sequence.editor=false",
    "core.askPass=",
    "credential.helper=",
    "diff.external=",
    "gpg.program=false",
    "gpg.ssh.program=false",
    "gpg.x509.program=false",
    // (Empty is not "none": git then fails to list the alternates' refs at all.)
    "core.alternateRefsCommand=true",
    // A commit-graph is the repository's to write (a sandbox's clone): git would trust it.
    "core.commitGraph=false",
    "uploadpack.packObjectsHook=",
    "protocol.allow=never",
    "protocol.file.allow=always",
    "gc.auto=0",
    "maintenance.auto=false",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "diff.ignoreSubmodules=all",
    "status.submoduleSummary=false",
    "core.quotepath=off",
];

/// Environment variables that name programs or redirect git, removed from every git aisb runs.
const UNSET: &[&str] = &[
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_PROXY_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_PAGER",
    "GIT_EXEC_PATH",
    "GIT_TEMPLATE_DIR",
    "GIT_CONFIG",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS",
    "GIT_NAMESPACE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
];

/// `git` without the environment variables that name programs or redirect it.
fn stripped() -> Command {
    let mut cmd = Command::new("git");
    for v in UNSET {
        cmd.env_remove(v);
    }
    cmd
}

/// [`stripped`] with every program-naming setting overridden.
fn overridden() -> Command {
    let mut cmd = stripped();
    for o in OVERRIDES {
        cmd.arg("-c").arg(o);
    }
    cmd
}

/// `git` for the repository whose git directory is `git_dir` and work tree `work_tree`
/// (`None` for commands that need none, such as fetch). `git_dir` is its own common directory:
/// a `commondir` file in it is never followed.
pub fn command(git_dir: &Path, work_tree: Option<&Path>) -> Command {
    let mut cmd = overridden();
    cmd.env("GIT_DIR", git_dir)
        .env("GIT_COMMON_DIR", git_dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_PROTOCOL_FROM_USER", "0");
    match work_tree {
        Some(w) => {
            cmd.env("GIT_WORK_TREE", w).current_dir(w);
        }
        None => {
            cmd.env_remove("GIT_WORK_TREE").current_dir(git_dir);
        }
    }
    cmd
}

/// `git` in the work tree `root` (a project): its git directory named outright when `root` has
/// one. A git directory inside `root` is the sandbox's to write, so it is its own common
/// directory; one outside (a linked work tree's) is not, and its `commondir` is followed.
pub fn for_work_tree(root: &Path) -> Command {
    let Some(git_dir) = git_dir_of(root) else {
        return discover(root);
    };
    let mut cmd = command(&git_dir, Some(root));
    if !git_dir.starts_with(root) {
        if let Some(common) = gitfile_like(&git_dir.join("commondir"), &git_dir) {
            cmd.env("GIT_COMMON_DIR", common);
        }
    }
    cmd
}

/// The path in a one-line file (`commondir`), relative ones taken from `base`.
fn gitfile_like(file: &Path, base: &Path) -> Option<PathBuf> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // A regular file, bounded: not a link to /dev/zero or a FIFO that would never end.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(file)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(4096).read_to_string(&mut text).ok()?;
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| lexical_join(base, Path::new(line)))
}

/// `git` with [`command`]'s overrides for a directory whose repository is not known yet (the
/// discovery of the git directory itself, `git config --global`): no repository's own
/// configuration is trusted more than the user's here either.
pub fn discover(dir: &Path) -> Command {
    let mut cmd = overridden();
    for v in ["GIT_DIR", "GIT_COMMON_DIR", "GIT_WORK_TREE"] {
        cmd.env_remove(v);
    }
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .current_dir(dir);
    cmd
}

/// The git directory of the work tree `root` (its `.git` directory, or where its `.git` file
/// points), when it has one, found without running git. `None`: not the top of a work tree.
pub fn git_dir_of(root: &Path) -> Option<PathBuf> {
    let dot = root.join(".git");
    let md = std::fs::symlink_metadata(&dot).ok()?;
    if md.is_dir() {
        return Some(dot);
    }
    if md.is_file() {
        return gitfile_target(&dot, root);
    }
    None
}

/// A linked work tree (`git worktree add`): its own git directory (`HEAD`, index, logs) and
/// the repository's common one (objects, refs, configuration), which holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedWorktree {
    /// `<common>/worktrees/<name>`.
    pub admin: PathBuf,
    pub common: PathBuf,
}

impl LinkedWorktree {
    /// The admin directory's path under the common directory (`worktrees/<name>`).
    pub fn rel(&self) -> PathBuf {
        self.admin
            .strip_prefix(&self.common)
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }
}

/// The work tree `root` as a linked work tree of a repository, found without running git:
/// its `.git` file names `<common>/worktrees/<name>` outside `root`, whose `commondir` names
/// `<common>` and whose `gitdir` names `root/.git` back (so a `.git` file cannot borrow some
/// other repository's work tree: only git writes those two files). `None` otherwise.
pub fn linked_worktree(root: &Path) -> Option<LinkedWorktree> {
    let dot = root.join(".git");
    if !std::fs::symlink_metadata(&dot).ok()?.is_file() {
        return None;
    }
    let admin = gitfile_target(&dot, root)?;
    if admin.starts_with(root) {
        return None;
    }
    let common = gitfile_like(&admin.join("commondir"), &admin)?;
    let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    if admin.parent() != Some(&common.join("worktrees")) || !is_dir(&admin) || !is_dir(&common) {
        return None;
    }
    let back = gitfile_like(&admin.join("gitdir"), &admin)?;
    // A git directory (a crafted archive could name any directory, the project's parent
    // with all its siblings first), never one that holds the work tree.
    let git_dir = is_dir(&common.join("objects"))
        && is_dir(&common.join("refs"))
        && std::fs::symlink_metadata(common.join("HEAD")).is_ok_and(|m| m.is_file());
    // Compared as the file system resolves them: a link partway along a path (`sib/up ->
    // ../..`) would make a directory that holds the work tree look like another one. Each
    // must already be its own real path.
    let real = |p: &Path| std::fs::canonicalize(p).is_ok_and(|r| r == p);
    (back == dot
        && git_dir
        && real(root)
        && real(&admin)
        && real(&common)
        && !root.starts_with(&common))
    .then_some(LinkedWorktree { admin, common })
}

/// The directory a `.git` file (`gitdir: PATH`) names, relative paths taken from `base`.
fn gitfile_target(file: &Path, base: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(file)
        .ok()?
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    let target = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    if target.is_empty() {
        return None;
    }
    Some(lexical_join(base, Path::new(target)))
}

/// `base.join(rel)` with `.` and `..` folded without touching the file system (a symlink in
/// the middle is not followed: guarded paths are checked component by component anyway).
pub(crate) fn lexical_join(base: &Path, rel: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in base.join(rel).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// One path of a git directory bound over itself inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// Where it is inside the sandbox.
    pub target: PathBuf,
    /// The host path bound there.
    pub source: PathBuf,
    /// The git directory itself, pinned in place; everything else is read-only.
    pub writable: bool,
    /// `hooks/` and `info/` are created empty when missing: a hook the sandbox wrote into a
    /// directory it made would run on the host at the next commit.
    pub create_dir: bool,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum GuardError {
    #[error("{path} is a symbolic link: aisb cannot keep the sandbox from changing what git runs through it")]
    #[diagnostic(help(
        "replace the link with the directory or file it points to (git does not need it), or run with `project access=\"overlay\"`"
    ))]
    Symlink { path: PathBuf },
    #[error("{path} has more than {MAX_GUARDS} git directories and hooks to protect, or submodules nested deeper than {MAX_MODULE_DEPTH}")]
    #[diagnostic(help(
        "run this project with `project access=\"overlay\"` or read-only, or use a named sandbox"
    ))]
    TooMany { path: PathBuf },
    #[error("reading {path}: {source}")]
    #[diagnostic(help("check that the project's .git directory is readable"))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What to bind so a sandbox with the work tree `source` mounted writable at `target` cannot
/// change what git runs on the host: empty when `source` is not the top of a work tree.
pub fn guards(target: &Path, source: &Path) -> Result<Vec<Guard>, GuardError> {
    let mut g = Guards {
        target,
        source,
        out: Vec::new(),
    };
    let dot = source.join(".git");
    match std::fs::symlink_metadata(&dot) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(GuardError::Io { path: dot, source }),
        Ok(md) if md.file_type().is_symlink() => return Err(GuardError::Symlink { path: dot }),
        Ok(md) if md.is_dir() => g.git_dir(&dot, 0)?,
        Ok(_) => {
            // A `.git` file (a linked work tree, a submodule's work tree): pinned read-only,
            // and the directory it names guarded when the sandbox can see it.
            g.push(&dot, false, false)?;
            if let Some(dir) = gitfile_target(&dot, source).filter(|d| d.starts_with(source)) {
                if dir.is_dir() {
                    g.git_dir(&dir, 0)?;
                }
            }
        }
    }
    // Hooks kept in the work tree (`core.hooksPath`, as husky and lefthook set it) run on the
    // host as surely as `.git/hooks`: read-only too, created empty when missing.
    // A linked work tree's configuration is its repository's common directory's.
    let dirs = linked_worktree(source)
        .map(|w| (w.admin, w.common))
        .or_else(|| git_dir_of(source).map(|g| (g.clone(), g)));
    if let Some(hooks) = dirs.and_then(|(gd, common)| hooks_path(source, &gd, &common)) {
        if hooks.starts_with(source) && hooks != source {
            g.push(&hooks, false, true)?;
        }
    }
    Ok(g.out)
}

/// Where git looks for the hooks of the work tree `root` when `core.hooksPath` says so (the
/// repository's or the user's configuration): `None` when it is not set. Git is asked only
/// when a configuration file mentions it (or includes another), so a start usually costs no
/// extra process.
fn hooks_path(root: &Path, git_dir: &Path, common: &Path) -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".config")));
    let files = [
        Some(common.join("config")),
        Some(git_dir.join("config.worktree")),
        home.map(|h| h.join(".gitconfig")),
        xdg.map(|x| x.join("git/config")),
    ];
    let mentions = files.iter().flatten().any(|f| {
        std::fs::read(f).is_ok_and(|b| {
            let lower = b.to_ascii_lowercase();
            lower.windows(9).any(|w| w == b"hookspath") || lower.windows(7).any(|w| w == b"include")
        })
    });
    if !mentions {
        return None;
    }
    // Without [`command`]'s overrides (they set this very key): reading runs nothing.
    let out = stripped()
        .env("GIT_DIR", git_dir)
        .env("GIT_COMMON_DIR", common)
        .current_dir(root)
        .args(["config", "--path", "--get", "core.hooksPath"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let value = String::from_utf8_lossy(&out.stdout)
        .trim_end_matches('\n')
        .to_string();
    (out.status.success() && !value.is_empty()).then(|| lexical_join(root, Path::new(&value)))
}

struct Guards<'a> {
    target: &'a Path,
    source: &'a Path,
    out: Vec<Guard>,
}

impl Guards<'_> {
    fn push(&mut self, path: &Path, writable: bool, create_dir: bool) -> Result<(), GuardError> {
        if self.out.len() >= MAX_GUARDS {
            return Err(GuardError::TooMany {
                path: self.source.to_path_buf(),
            });
        }
        check_no_symlinks(self.source, path)?;
        let rel = path.strip_prefix(self.source).unwrap_or(path);
        self.out.push(Guard {
            target: self.target.join(rel),
            source: path.to_path_buf(),
            writable,
            create_dir,
        });
        Ok(())
    }

    fn push_if_exists(&mut self, path: &Path) -> Result<(), GuardError> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => self.push(path, false, false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(GuardError::Io {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    fn git_dir(&mut self, dir: &Path, depth: usize) -> Result<(), GuardError> {
        if depth > MAX_MODULE_DEPTH {
            return Err(GuardError::TooMany {
                path: self.source.to_path_buf(),
            });
        }
        self.push(dir, true, false)?;
        for f in [
            "config",
            "config.worktree",
            "commondir",
            "branches",
            "remotes",
            "worktrees",
        ] {
            self.push_if_exists(&dir.join(f))?;
        }
        for d in ["hooks", "info"] {
            self.push(&dir.join(d), false, true)?;
        }
        // Where git finds other repositories' objects: `objects/info/alternates` read-only
        // (a named sandbox's clone has aisb's own, naming the repository's objects), and
        // `objects/` and `objects/info/` pinned, so neither can be swapped for a directory of
        // the sandbox's with alternates of its own.
        let objects = dir.join("objects");
        if std::fs::symlink_metadata(&objects).is_ok_and(|m| m.is_dir()) {
            self.push(&objects, true, false)?;
            self.push(&objects.join("info"), true, true)?;
            self.push_if_exists(&objects.join("info/alternates"))?;
        }
        let modules = dir.join("modules");
        if std::fs::symlink_metadata(&modules).is_ok_and(|m| m.is_dir()) {
            self.modules(&modules, depth)?;
        }
        Ok(())
    }

    /// Submodules' git directories under `modules/` (a name may contain `/`, so a directory
    /// without `HEAD` is searched further), and the `.git` files of their work trees.
    fn modules(&mut self, dir: &Path, depth: usize) -> Result<(), GuardError> {
        let entries = std::fs::read_dir(dir).map_err(|source| GuardError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        for e in entries.flatten() {
            let path = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if path.join("HEAD").is_file() {
                self.git_dir(&path, depth + 1)?;
                if let Some(work) = module_work_tree(&path).filter(|w| w.starts_with(self.source)) {
                    let dot = work.join(".git");
                    if std::fs::symlink_metadata(&dot).is_ok_and(|m| m.is_file()) {
                        self.push(&dot, false, false)?;
                    }
                }
            } else if depth < MAX_MODULE_DEPTH {
                self.modules(&path, depth + 1)?;
            } else {
                return Err(GuardError::TooMany {
                    path: self.source.to_path_buf(),
                });
            }
        }
        Ok(())
    }
}

/// A submodule's work tree, from `core.worktree` in its git directory's config (relative to
/// that directory), read as text: git is not run on a configuration the sandbox could write.
fn module_work_tree(git_dir: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(git_dir.join("config"))
        .ok()?
        .take(1 << 20)
        .read_to_string(&mut text)
        .ok()?;
    let value = text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim().eq_ignore_ascii_case("worktree")).then(|| v.trim().trim_matches('"').to_string())
    })?;
    Some(lexical_join(git_dir, Path::new(&value)))
}

/// Every component of `path` below `root` (and `path` itself) is not a symbolic link: a
/// bind follows links, and the sandbox may have made one where a guarded path should be.
fn check_no_symlinks(root: &Path, path: &Path) -> Result<(), GuardError> {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let mut cur = root.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(GuardError::Symlink { path: cur });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Create the guarded directories that are missing (`hooks/`, `info/`), refusing symbolic
/// links: called just before the sandbox starts, when the guards are mounted.
pub fn realise(guard: &Guard) -> Result<(), GuardError> {
    let io = |source| GuardError::Io {
        path: guard.source.clone(),
        source,
    };
    match std::fs::symlink_metadata(&guard.source) {
        Ok(m) if m.file_type().is_symlink() => Err(GuardError::Symlink {
            path: guard.source.clone(),
        }),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && guard.create_dir => {
            match std::fs::create_dir(&guard.source) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => realise(guard),
                Err(e) => Err(io(e)),
            }
        }
        Err(e) => Err(io(e)),
    }
}

/// Files a writable git directory may gain that git takes configuration through: `commondir`
/// (config and hooks from wherever it points) and `config.worktree` (read as soon as
/// `extensions.worktreeConfig` is on, which `git sparse-checkout` turns on).
pub const PLANTABLE: &[&str] = &["commondir", "config.worktree"];

/// Move each [`PLANTABLE`] file that was not there when the guards were made (those are
/// guarded read-only) out of each pinned git directory into `quarantine` (nothing is
/// deleted). Returns what was moved, for the audit log.
pub fn disarm(guards: &[Guard], quarantine: &Path) -> Vec<(PathBuf, PathBuf)> {
    guards
        .iter()
        .filter(|g| g.writable)
        .flat_map(|g| {
            PLANTABLE
                .iter()
                .map(|f| g.source.join(f))
                .filter(|p| !guards.iter().any(|o| o.source == *p))
        })
        .filter_map(|p| quarantine_file(&p, quarantine))
        .collect()
}

/// [`disarm`] for a git directory whose every [`PLANTABLE`] file is the sandbox's (a clone).
pub fn disarm_git_dir(git_dir: &Path, quarantine: &Path) -> Vec<(PathBuf, PathBuf)> {
    PLANTABLE
        .iter()
        .filter_map(|f| quarantine_file(&git_dir.join(f), quarantine))
        .collect()
}

/// Move `path`, if it exists, into `quarantine`: (from, to). Where that is another file
/// system, beside itself under a name git never reads.
pub fn quarantine_file(path: &Path, quarantine: &Path) -> Option<(PathBuf, PathBuf)> {
    std::fs::symlink_metadata(path).ok()?;
    let _ = std::fs::create_dir_all(quarantine);
    let name = quarantined_name(path.file_name()?);
    let to = quarantine.join(&name);
    match std::fs::rename(path, &to) {
        Ok(()) => Some((path.to_path_buf(), to)),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let beside = path.with_file_name(&name);
            std::fs::rename(path, &beside).ok()?;
            Some((path.to_path_buf(), beside))
        }
        Err(_) => None,
    }
}

/// [`quarantine_file`] for a `path` below `root` (a directory aisb trusts, named without
/// links) whose directories something untrusted shapes, perhaps at this very moment (a
/// sandbox still running, another run's sandbox in the same project): the directory holding
/// it is opened beneath `root` without following any link, and the entry moved from that
/// descriptor. A directory swapped for a link between a check and the move makes it fail;
/// nothing outside `root` is ever moved.
pub fn quarantine_beneath(
    root: &Path,
    path: &Path,
    quarantine: &Path,
) -> Option<(PathBuf, PathBuf)> {
    use rustix::fs::{openat2, renameat, statat, AtFlags, Mode, OFlags, ResolveFlags, CWD};
    let rel = path.strip_prefix(root).ok()?;
    let name = rel.file_name()?;
    let parent = dir_beneath(root, rel.parent().unwrap_or(Path::new(""))).ok()?;
    statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    let _ = std::fs::create_dir_all(quarantine);
    let into = openat2(
        CWD,
        quarantine,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::empty(),
    )
    .ok()?;
    let new_name = quarantined_name(name);
    match renameat(&parent, name, &into, &new_name) {
        Ok(()) => Some((path.to_path_buf(), quarantine.join(&new_name))),
        Err(rustix::io::Errno::XDEV) => {
            renameat(&parent, name, &parent, &new_name).ok()?;
            Some((path.to_path_buf(), path.with_file_name(&new_name)))
        }
        Err(_) => None,
    }
}

/// `name` as it is kept in a quarantine: a suffix git never reads, unique by the time.
fn quarantined_name(name: &std::ffi::OsStr) -> std::ffi::OsString {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut out = name.to_os_string();
    out.push(format!(".aisb-quarantined-{nanos}"));
    out
}

/// The directory `rel` below `root` (a path aisb trusts), as an `O_PATH` descriptor opened
/// beneath it without following any link (`root` itself when `rel` is empty).
pub fn dir_beneath(root: &Path, rel: &Path) -> rustix::io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags, CWD};
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root = openat2(CWD, root, flags, Mode::empty(), ResolveFlags::empty())?;
    if rel.as_os_str().is_empty() {
        return Ok(root);
    }
    openat2(
        &root,
        rel,
        flags,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

/// What identifies the index file's content without reading it: git replaces the file (a
/// new inode) whenever it writes it, and the sandbox writes only its own copy (see
/// [`back`]). Not its ctime: aisb's own hard link to it at the start of a run changes that.
pub type IndexStamp = (u64, u64, i64, i64);

pub fn index_stamp(git_dir: &Path) -> Option<IndexStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(git_dir.join("index")).ok()?;
    Some((m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// Whether the index of `git_dir` may hold a gitlink: the mode 160000 (`00 00 e0 00`) occurs
/// in it (a hash may hold it too; then git is asked). Without git, and bounded. The answer
/// is kept in `memo` (aisb's state) with the index's stamp: an index of 100,000 entries is
/// read again only when it changed.
pub fn may_have_gitlinks(git_dir: &Path, memo: &Path) -> bool {
    let Some(stamp) = index_stamp(git_dir) else {
        return false;
    };
    let key = format!("{stamp:?}");
    if let Ok(text) = std::fs::read_to_string(memo) {
        if let Some(answer) = text.strip_prefix(&key).and_then(|r| r.strip_prefix(' ')) {
            return answer.trim() != "no";
        }
    }
    let found = scan_for_gitlinks(git_dir);
    let _ = std::fs::write(
        memo,
        format!("{key} {}\n", if found { "yes" } else { "no" }),
    );
    found
}

fn scan_for_gitlinks(git_dir: &Path) -> bool {
    use std::io::Read;
    const MODE: [u8; 4] = [0, 0, 0xe0, 0];
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(git_dir.join("index"))
    else {
        return false;
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut f = f.take(256 << 20);
    let mut buf = vec![0u8; 1 << 20];
    let mut carry = 0usize;
    loop {
        let n = match f.read(&mut buf[carry..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        let end = carry + n;
        if buf[..end].windows(4).any(|w| w == MODE) {
            return true;
        }
        // The last three bytes again at the front: a match across two reads is found too.
        carry = end.min(3);
        buf.copy_within(end - carry..end, 0);
    }
}

/// At most this many bytes of `git ls-files --stage` are read: an index shaped by a sandbox
/// is bounded like everything else it wrote.
const MAX_LS_FILES: u64 = 256 << 20;

/// Submodule work trees (gitlinks in the index of the work tree `root`, whose git directory
/// is `git_dir`) whose `.git`, or what git runs through it, changed at or after `since`: git
/// on the host looks into each gitlink on `git status`, with that repository's configuration.
pub fn changed_submodules(
    root: &Path,
    git_dir: &Path,
    since: std::time::SystemTime,
) -> Vec<PathBuf> {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let Ok(mut child) = command(git_dir, Some(root))
        .args(["ls-files", "--stage", "-z"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = stdout.take(MAX_LS_FILES).read_to_end(&mut out);
    }
    let _ = child.kill();
    let _ = child.wait();
    let changed = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(p).is_ok_and(|m| {
            let ctime = std::time::UNIX_EPOCH
                + std::time::Duration::new(m.ctime().max(0) as u64, m.ctime_nsec().max(0) as u32);
            ctime >= since
        })
    };
    out.split(|b| *b == 0)
        .filter_map(|entry| {
            let tab = entry.iter().position(|b| *b == b'\t')?;
            let (meta, path) = entry.split_at(tab);
            meta.starts_with(b"160000 ").then(|| &path[1..])
        })
        .map(|rel| root.join(std::ffi::OsStr::from_bytes(rel)))
        .filter(|work| work.starts_with(root) && check_no_symlinks(root, work).is_ok())
        .map(|work| work.join(".git"))
        .filter(|dot| {
            changed(dot)
                || ["config", "config.worktree", "commondir", "hooks", "info"]
                    .iter()
                    .any(|f| changed(&dot.join(f)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(dir: &Path) {
        let ok = Command::new("git")
            .args(["init", "-q"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    #[test]
    fn guards_pin_the_git_dir_and_protect_what_names_programs() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("p");
        init(&root);
        std::fs::remove_dir_all(root.join(".git/hooks")).unwrap();
        // Older gits' templates make it; it is guarded when there.
        let _ = std::fs::remove_dir_all(root.join(".git/branches"));
        let g = guards(&root, &root).unwrap();
        let rel: Vec<(String, bool, bool)> = g
            .iter()
            .map(|g| {
                (
                    g.source
                        .strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                    g.writable,
                    g.create_dir,
                )
            })
            .collect();
        assert_eq!(
            rel,
            vec![
                (".git".into(), true, false),
                (".git/config".into(), false, false),
                (".git/hooks".into(), false, true),
                (".git/info".into(), false, true),
                (".git/objects".into(), true, false),
                (".git/objects/info".into(), true, true),
            ]
        );
        for x in &g {
            realise(x).unwrap();
        }
        assert!(root.join(".git/hooks").is_dir());
    }

    #[test]
    fn a_symlink_where_a_guard_goes_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("p");
        init(&root);
        std::fs::remove_dir_all(root.join(".git/hooks")).unwrap();
        std::os::unix::fs::symlink(t.path(), root.join(".git/hooks")).unwrap();
        assert!(matches!(
            guards(&root, &root),
            Err(GuardError::Symlink { .. })
        ));
        let other = t.path().join("q");
        std::fs::create_dir_all(&other).unwrap();
        std::os::unix::fs::symlink(root.join(".git"), other.join(".git")).unwrap();
        assert!(matches!(
            guards(&other, &other),
            Err(GuardError::Symlink { .. })
        ));
    }

    #[test]
    fn a_planted_commondir_is_moved_aside() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("p");
        init(&root);
        let g = guards(&root, &root).unwrap();
        std::fs::write(root.join(".git/commondir"), "../evil\n").unwrap();
        let q = t.path().join("quarantine");
        let moved = disarm(&g, &q);
        assert_eq!(moved.len(), 1);
        assert!(!root.join(".git/commondir").exists());
        assert_eq!(std::fs::read_to_string(&moved[0].1).unwrap(), "../evil\n");
    }

    #[test]
    fn submodule_git_dirs_and_their_git_files_are_guarded() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("p");
        init(&root);
        let m = root.join(".git/modules/lib/inner");
        std::fs::create_dir_all(m.join("objects")).unwrap();
        std::fs::write(m.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(
            m.join("config"),
            "[core]\n\tworktree = ../../../../lib/inner\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("lib/inner")).unwrap();
        std::fs::write(
            root.join("lib/inner/.git"),
            "gitdir: ../../.git/modules/lib/inner\n",
        )
        .unwrap();
        let g = guards(&root, &root).unwrap();
        let has = |rel: &str, writable: bool| {
            g.iter()
                .any(|x| x.source == root.join(rel) && x.writable == writable)
        };
        assert!(has(".git/modules/lib/inner", true));
        assert!(has(".git/modules/lib/inner/config", false));
        assert!(has(".git/modules/lib/inner/hooks", false));
        assert!(has("lib/inner/.git", false));
    }
}
