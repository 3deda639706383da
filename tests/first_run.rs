//! What a new user meets on a fresh machine: the configuration file as an argument, the exit
//! codes `aisb --help` documents (0 ok, 1 configuration errors, 2 usage, 125 could not start),
//! and each error a fresh machine gives (no git repository, no bwrap, no subordinate ids, no
//! delegated cgroup, an unwritable cache directory, no `aisb-init` beside `aisb`): the message
//! names the real cause and the command that fixes it.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::Out;

/// A scratch directory everyone may read, with its own copy of aisb alone (no `aisb-init`
/// beside it, as `cargo run` or a copied binary gives), a project and a home.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let s = Scratch {
            dir: tempfile::tempdir().unwrap(),
        };
        for d in ["bin", "proj", "home"] {
            std::fs::create_dir_all(s.path(d)).unwrap();
        }
        std::fs::copy(env!("CARGO_BIN_EXE_aisb"), s.exe()).unwrap();
        s
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn exe(&self) -> PathBuf {
        self.path("bin/aisb")
    }
    fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).unwrap();
    }
    /// Hand everything to `user` (the tree stays readable by all).
    fn give_to(&self, user: (u32, u32)) {
        support::chown_r(self.dir.path(), user.0, user.1);
        std::fs::set_permissions(
            self.dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
    /// aisb in the project, with a clean environment; as `user` when given.
    fn cmd(&self, user: Option<(u32, u32)>, args: &[&str]) -> Command {
        let mut c = Command::new(self.exe());
        if let Some((uid, gid)) = user {
            std::os::unix::process::CommandExt::uid(&mut c, uid);
            std::os::unix::process::CommandExt::gid(&mut c, gid);
        }
        c.args(args)
            .current_dir(self.path("proj"))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.path("home"))
            .env("XDG_CACHE_HOME", self.path("cache"))
            .stdin(Stdio::null());
        c
    }
    fn aisb(&self, user: Option<(u32, u32)>, args: &[&str]) -> Out {
        output(&mut self.cmd(user, args))
    }
}

/// Runs `cmd`. The binary was just copied: a test on another thread that forked meanwhile
/// holds the copy's write descriptor until its exec (ETXTBSY), so that is retried, at most 5 s.
fn output(cmd: &mut Command) -> Out {
    for _ in 0..250 {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => return Out::from(r.unwrap()),
        }
    }
    panic!("{cmd:?}: text file busy for 5 s");
}

fn git_repo(dir: &Path) {
    support::git_in(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README"), "hi\n").unwrap();
    support::git_in(dir, &["add", "README"]);
    support::git_in(
        dir,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "one",
        ],
    );
}

/// `text` with miette's line wrapping undone: words joined by single spaces.
fn unwrapped(text: &str) -> String {
    text.replace(['│', '╰', '─', '▶'], " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Asserts `o` failed with `code` and that its stderr holds every one of `needles` (however
/// the terminal width wrapped it).
fn says(o: &Out, code: i32, needles: &[&str], what: &str) {
    assert_eq!(
        o.code, code,
        "{what}: exit code\n{}\n{}",
        o.stdout, o.stderr
    );
    let stderr = unwrapped(&o.stderr);
    for n in needles {
        assert!(
            stderr.contains(&unwrapped(n)),
            "{what}: no `{n}` in:\n{}",
            o.stderr
        );
    }
}

#[test]
fn check_and_plan_take_files_as_arguments_with_documented_exit_codes() {
    let s = Scratch::new();
    s.write("proj/a.kdl", "block \"secrets/\"\n");
    s.write("proj/b.kdl", "network {\n    group \"github\"\n}\n");
    s.write("proj/bad.kdl", "projet \".\"\n");
    let o = s.aisb(None, &["check", "a.kdl", "b.kdl"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("a.kdl: ok") && o.stderr.contains("b.kdl: ok"),
        "{}",
        o.stderr
    );
    // Every file is checked; one with errors makes the status 1.
    let o = s.aisb(None, &["check", "--format", "short", "bad.kdl", "a.kdl"]);
    assert_eq!(o.code, 1, "{}\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("bad.kdl:1:1: error:"), "{}", o.stdout);
    let o = s.aisb(None, &["check", "bad.kdl"]);
    says(&o, 1, &["bad.kdl:1:1", "projet"], "check bad.kdl");
    // `-f` still works, before or after the verb.
    assert_eq!(s.aisb(None, &["-f", "a.kdl", "check"]).code, 0);
    assert_eq!(s.aisb(None, &["check", "-f", "a.kdl"]).code, 0);
    // Usage errors: 2.
    says(
        &s.aisb(None, &["-f", "a.kdl", "check", "b.kdl"]),
        2,
        &["two configuration files", "give one"],
        "-f and a file",
    );
    says(
        &s.aisb(None, &["check", "--bogus"]),
        2,
        &["unexpected argument '--bogus'"],
        "check --bogus",
    );
    says(
        &s.aisb(None, &["frobnicate"]),
        2,
        &["unrecognized subcommand"],
        "a typo",
    );
    // A missing file is a configuration error: 1.
    says(
        &s.aisb(None, &["check", "nope.kdl"]),
        1,
        &["no configuration file at", "nope.kdl", "aisb init"],
        "check nope.kdl",
    );
    let o = s.aisb(None, &["plan", "b.kdl"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let config = o.stdout.lines().next().unwrap_or_default().to_string();
    assert!(
        config.starts_with("config") && config.ends_with("/proj/b.kdl"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("github"), "{}", o.stdout);
    // The help says what the codes mean.
    let help = s.aisb(None, &["--help"]);
    for line in [
        "1    the configuration has errors",
        "2    usage error",
        "125  aisb could not do it",
    ] {
        assert!(help.stdout.contains(line), "{line}: {}", help.stdout);
    }
}

#[test]
fn a_named_sandbox_outside_a_git_repository_says_to_make_one() {
    let s = Scratch::new();
    let o = s.aisb(None, &["up", "t", "--", "true"]);
    says(
        &o,
        125,
        &["is not a git repository with a commit", "git init"],
        "up NAME outside a repository",
    );
}

#[test]
fn no_bwrap_on_path_names_the_package() {
    let s = Scratch::new();
    let o = output(
        s.cmd(None, &["run", "--backend", "bwrap", "--", "/bin/true"])
            .env("PATH", s.path("bin")),
    );
    says(
        &o,
        125,
        &["cannot start `bwrap`", "apt-get install bubblewrap"],
        "run without bwrap",
    );
}

#[test]
fn an_unwritable_cache_directory_names_it_and_the_variable() {
    if !support::root_or_skip("the unwritable cache test (it runs as nobody)") {
        return;
    }
    let s = Scratch::new();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let user = (nobody.uid.as_raw(), nobody.gid.as_raw());
    std::fs::create_dir_all(s.path("ro")).unwrap();
    s.give_to(user);
    std::fs::set_permissions(
        s.path("ro"),
        std::os::unix::fs::PermissionsExt::from_mode(0o555),
    )
    .unwrap();
    let o = output(
        s.cmd(Some(user), &["run", "--backend", "bwrap", "--", "true"])
            .env("XDG_CACHE_HOME", s.path("ro/cache")),
    );
    let dir = s.path("ro/cache/aisb").display().to_string();
    says(
        &o,
        125,
        &[
            "cannot use aisb's cache directory",
            "Permission denied",
            "XDG_CACHE_HOME",
        ],
        "unwritable cache",
    );
    // The directory is named in full (miette may wrap the help line; the error line first).
    assert!(
        o.stderr
            .replace(['\n', ' ', '│'], "")
            .contains(&dir.replace(' ', "")),
        "{}",
        o.stderr
    );
}

#[test]
fn rootless_libcontainer_without_subordinate_ids_names_setup_user() {
    if !support::root_or_skip("the subordinate ids test (it runs as nobody)") {
        return;
    }
    let s = Scratch::new();
    git_repo(&s.path("proj"));
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let user = (nobody.uid.as_raw(), nobody.gid.as_raw());
    s.give_to(user);
    let o = s.aisb(
        Some(user),
        &["run", "--backend", "libcontainer", "--", "true"],
    );
    says(
        &o,
        125,
        &["nobody has no subordinate uids", "aisb setup-user nobody"],
        "libcontainer without subuids",
    );
    let doctor = s.aisb(Some(user), &["doctor"]);
    assert!(
        doctor.stdout.contains("aisb setup-user nobody"),
        "doctor: {}",
        doctor.stdout
    );
    // bwrap needs none of it, and aisb alone (no aisb-init beside it) serves as the init.
    let o = s.aisb(
        Some(user),
        &[
            "run",
            "--backend",
            "bwrap",
            "--",
            "sh",
            "-c",
            "echo in=$(id -u)",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.expect("in", &user.0.to_string());
    let o = s.aisb(Some(user), &["up", "--backend", "bwrap", "t", "--", "true"]);
    assert_eq!(o.code, 0, "up t as nobody with aisb alone: {}", o.stderr);
}

const NO_CGROUP_USER: &str = "aisb-test-nocg";

/// An account with subordinate ids and no delegated cgroup: half of `aisb setup-user`.
fn user_without_cgroup() -> (u32, u32) {
    if nix::unistd::User::from_name(NO_CGROUP_USER)
        .ok()
        .flatten()
        .is_none()
    {
        let _ = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(NO_CGROUP_USER)
            .status();
    }
    let u = nix::unistd::User::from_name(NO_CGROUP_USER)
        .unwrap()
        .expect("useradd");
    for (file, flag) in [
        ("/etc/subuid", "--add-subuids"),
        ("/etc/subgid", "--add-subgids"),
    ] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.starts_with(&format!("{NO_CGROUP_USER}:")))
        {
            continue;
        }
        let end = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split(':').skip(1);
                Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
            })
            .max()
            .unwrap_or(100_000)
            .max(100_000);
        let ok = Command::new("usermod")
            .arg(flag)
            .arg(format!("{end}-{}", end + 65_535))
            .arg(NO_CGROUP_USER)
            .status()
            .unwrap()
            .success();
        assert!(ok, "usermod {flag}");
    }
    (u.uid.as_raw(), u.gid.as_raw())
}

#[test]
fn rootless_libcontainer_without_a_delegated_cgroup_names_setup_user() {
    if !support::root_or_skip("the cgroup delegation test") {
        return;
    }
    // Only cgroup v1 hierarchies need a delegated cgroup (aisb doctor: "cgroups v1").
    if !Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists() {
        eprintln!("not applicable: no cgroup v1 pids hierarchy on this host");
        return;
    }
    let user = user_without_cgroup();
    let s = Scratch::new();
    git_repo(&s.path("proj"));
    s.give_to(user);
    let o = s.aisb(
        Some(user),
        &["run", "--backend", "libcontainer", "--", "true"],
    );
    says(
        &o,
        125,
        &[
            &format!("no cgroup is delegated to {NO_CGROUP_USER}"),
            &format!("aisb setup-user {NO_CGROUP_USER}"),
        ],
        "libcontainer without a delegated cgroup",
    );
}

#[test]
fn doctor_says_how_bwrap_gets_copy_on_write_directories() {
    if !support::root_or_skip("the doctor test (root and nobody)") {
        return;
    }
    let s = Scratch::new();
    let o = s.aisb(None, &["doctor"]);
    let line = |o: &Out| {
        o.stdout
            .lines()
            .find(|l| l.starts_with("bwrap ") && l.contains("works"))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line(&o).contains("copy-on-write directories are overlayfs, mounted by aisb's init"),
        "as root: {}",
        o.stdout
    );
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let user = (nobody.uid.as_raw(), nobody.gid.as_raw());
    s.give_to(user);
    let o = s.aisb(Some(user), &["doctor"]);
    assert!(
        line(&o).contains("mounted by aisb's init in a mount namespace of its own"),
        "as nobody: {}",
        o.stdout
    );
}

/// The size of the init the sandbox runs, and whether it exited 0.
fn init_size(s: &Scratch) -> String {
    let o = s.aisb(
        None,
        &[
            "run",
            "--backend",
            "bwrap",
            "--",
            "stat",
            "-L",
            "-c",
            "size=%s",
            "/run/aisb/init",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.value("size").unwrap_or_default().to_string()
}

fn size(p: &Path) -> String {
    std::fs::metadata(p).unwrap().len().to_string()
}

#[test]
fn an_aisb_init_from_other_sources_beside_aisb_is_not_used() {
    if !support::root_or_skip("the foreign init test") {
        return;
    }
    let s = Scratch::new();
    git_repo(&s.path("proj"));
    let init = s.path("bin/aisb-init");
    let doctor = |s: &Scratch| {
        let o = s.aisb(None, &["doctor"]);
        o.stdout
            .lines()
            .find(|l| l.contains("sandbox init"))
            .unwrap_or_default()
            .to_string()
    };
    // This build's aisb-init: used.
    std::fs::copy(env!("CARGO_BIN_EXE_aisb-init"), &init).unwrap();
    assert_eq!(init_size(&s), size(&init));
    assert!(doctor(&s).contains("(this build's)"), "{}", doctor(&s));
    // The same binary with another source identity (an aisb-init left from an older build,
    // as `cargo run` after an edit leaves it): not used; aisb serves as the init.
    let mut bytes = std::fs::read(&init).unwrap();
    let id = aisb::init::SOURCE_ID;
    let at = bytes
        .windows(id.len())
        .position(|w| w == id)
        .expect("the source identity is in aisb-init");
    bytes[at] ^= 0x01;
    std::fs::remove_file(&init).unwrap();
    std::fs::write(&init, &bytes).unwrap();
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert_eq!(init_size(&s), size(&s.exe()));
    assert!(
        doctor(&s).contains("is from other sources, so it is not used"),
        "{}",
        doctor(&s)
    );
    // Not an aisb binary at all: not used either, and every verb works.
    s.write("bin/aisb-init", "#!/bin/sh\nexit 3\n");
    assert_eq!(init_size(&s), size(&s.exe()));
    let o = s.aisb(None, &["up", "--backend", "bwrap", "t", "--", "true"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn man_pages_and_completions_for_the_install_section() {
    let s = Scratch::new();
    let o = s.aisb(None, &["man"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains(".TH aisb 1"),
        "{}",
        &o.stdout[..200.min(o.stdout.len())]
    );
    assert!(o.stdout.contains("125"), "the exit codes are in the page");
    let dir = s.path("man1");
    let o = s.aisb(None, &["man", "--dir", dir.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    for p in [
        "aisb.1",
        "aisb-run.1",
        "aisb-check.1",
        "aisb-up.1",
        "aisb-man.1",
    ] {
        assert!(pages.iter().any(|x| x == p), "{p} missing: {pages:?}");
    }
    // aisb's own plumbing gets no page.
    assert!(!pages.iter().any(|p| p.contains("__")), "{pages:?}");
    if Command::new("man").arg("--version").output().is_ok() {
        let o = output(
            Command::new("man")
                .arg("-l")
                .arg(dir.join("aisb-check.1"))
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "100"),
        );
        assert_eq!(o.code, 0, "man -l: {}", o.stderr);
        assert!(o.stdout.contains("FILE"), "{}", o.stdout);
    }
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = s.aisb(None, &["completions", shell]);
        assert!(
            o.code == 0 && o.stdout.contains("aisb"),
            "{shell}: {}",
            o.stderr
        );
    }
}

#[test]
fn a_named_sandbox_whose_init_ends_says_so_with_its_reason() {
    if !support::root_or_skip("the early-ending init test (it runs as nobody)") {
        return;
    }
    // An ordinary user's init cannot fork its workload under `nproc 0`: it ends at once.
    let s = Scratch::new();
    s.write("proj/sandbox.kdl", "process {\n    rlimit \"nproc\" 0\n}\n");
    git_repo(&s.path("proj"));
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let user = (nobody.uid.as_raw(), nobody.gid.as_raw());
    s.give_to(user);
    let o = s.aisb(Some(user), &["up", "--backend", "bwrap", "t", "--", "true"]);
    says(
        &o,
        125,
        &[
            "cannot start the workload",
            "sandbox `t` ended before a session could join it (its init exited with 125)",
            "aisb run --sandbox t -- true",
        ],
        "an init that ends",
    );
    assert!(!o.stderr.contains("cache directory"), "{}", o.stderr);
}
