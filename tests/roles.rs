//! Real projects run in the embedded default sandbox (no `sandbox.kdl`): their installed
//! dependencies, build outputs and toolchains are there, while their secrets are not.
//!
//! Each project has what git ignores in a real one: `node_modules/` (a package and a
//! package's `.env`), a Python `.venv` holding a library module named `credentials.py`,
//! `__pycache__/`, a make `build/` and a Rust `target/` built on the host first, and a
//! gitignored `config/master.key`. Inside, `npm test`, pytest, make and cargo run against
//! them; the `.env`, the `.pem` and `master.key` stay masked; and afterwards the host's
//! `node_modules/`, `build/` and `target/` are byte for byte what they were (writes went to
//! the sandbox's copy-on-write layer), unless `secrets { write-through … }` says otherwise.
//! Both backends, as root and as an ordinary user.

mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::Out;

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];

/// Every name, kind, mode and content below `dir`, links as their targets.
fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    for e in walkdir::WalkDir::new(dir).follow_links(false) {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(dir).unwrap().to_path_buf();
        let md = e.path().symlink_metadata().unwrap();
        let what = if md.file_type().is_symlink() {
            format!("link {}", std::fs::read_link(e.path()).unwrap().display())
        } else if md.is_dir() {
            format!("dir {:o}", md.permissions().mode())
        } else {
            let bytes = std::fs::read(e.path()).unwrap();
            format!(
                "file {:o} {:x}",
                md.permissions().mode(),
                sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(&bytes))
            )
        };
        out.insert(rel, what);
    }
    out
}

struct Project {
    dir: tempfile::TempDir,
    /// The ordinary user who owns it and runs aisb (None: root).
    user: Option<(u32, u32)>,
    exe: PathBuf,
}

impl Project {
    /// The project, with `sandbox.kdl` = `config` when given.
    fn new(user: Option<(u32, u32)>, config: Option<&str>) -> Project {
        let dir = tempfile::tempdir().unwrap();
        let p = Project {
            dir,
            user,
            exe: PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
        };
        let proj = p.proj();
        std::fs::create_dir_all(p.root().join("home")).unwrap();
        std::fs::create_dir_all(&proj).unwrap();
        support::git_in(&proj, &["init", "-q"]);
        if let Some(c) = config {
            p.write("sandbox.kdl", c);
        }
        p.write(
            ".gitignore",
            "node_modules/\n.venv/\n__pycache__/\nbuild/\ntarget/\nconfig/master.key\n",
        );
        // Node: an installed package, and a package that shipped its author's secrets next
        // to library code whose name matches the broad `*credentials*` glob.
        p.write(
            "package.json",
            r#"{"name":"app","version":"1.0.0","scripts":{"test":"node test.js"}}"#,
        );
        p.write(
            "test.js",
            "const pad = require('left-pad');\nconst creds = require('some-sdk/credentials');\n\
             if (pad('7', 3) !== '007' || creds.kind !== 'provider') process.exit(1);\n\
             console.log('node-test=ok');\n",
        );
        p.write(
            "node_modules/left-pad/index.js",
            "module.exports = (s, n) => s.padStart(n, '0');\n",
        );
        p.write(
            "node_modules/some-sdk/credentials.js",
            "module.exports = { kind: 'provider' };\n",
        );
        p.write("node_modules/some-sdk/.env", "SDK_AUTHOR_TOKEN=leaked\n");
        p.write("node_modules/some-sdk/test/server-key.pem", "PRIVATE KEY\n");
        // A CA bundle stays readable: TLS clients load it (certifi's shape).
        p.write("node_modules/some-sdk/cacert.pem", "CERTIFICATE\n");
        // Python: a library module named credentials.py in the venv (botocore's shape).
        let venv = Command::new("/usr/bin/python3")
            .args(["-m", "venv", "--without-pip", "--system-site-packages"])
            .arg(proj.join(".venv"))
            .status()
            .unwrap();
        assert!(venv.success(), "python3 -m venv (python3-venv)");
        let site = std::fs::read_dir(proj.join(".venv/lib"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("site-packages/fakeboto");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(site.join("__init__.py"), "").unwrap();
        std::fs::write(site.join("credentials.py"), "KIND = 'chain'\n").unwrap();
        p.write(
            "tests/test_creds.py",
            "from fakeboto.credentials import KIND\n\ndef test_kind():\n    assert KIND == 'chain'\n",
        );
        p.write("tests/__pycache__/stale.pyc", "host's bytecode\n");
        // make: an output built on the host.
        p.write(
            "Makefile",
            "build/out.txt: src.txt\n\tmkdir -p build && cp src.txt build/out.txt\n",
        );
        p.write("src.txt", "v1\n");
        let made = Command::new("make")
            .arg("-s")
            .current_dir(&proj)
            .status()
            .unwrap();
        assert!(made.success());
        // A gitignored secret next to tracked configuration.
        p.write("config/app.yml", "name: app\n");
        p.write("config/master.key", "MASTER-KEY-SECRET\n");
        support::commit_all(&proj, "init");
        if let Some((uid, gid)) = user {
            let exe = support::hand_to_user(p.root(), uid, gid);
            return Project { exe, ..p };
        }
        p
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn proj(&self) -> PathBuf {
        self.root().join("proj")
    }
    fn write(&self, rel: &str, content: &str) {
        let p = self.proj().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    fn run(&self, backend: &str, home: &Path, path: &str, script: &str) -> Out {
        Out::from(self.cmd(backend, home, path, script).output().unwrap())
    }
    /// `aisb --trust run --backend BACKEND -- /bin/sh -c SCRIPT` in the project, as its owner.
    fn cmd(&self, backend: &str, home: &Path, path: &str, script: &str) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.current_dir(self.proj())
            .env_clear()
            .env("PATH", path)
            .env("HOME", home)
            .env("XDG_CACHE_HOME", self.root().join("cache"))
            .env("XDG_CONFIG_HOME", self.root().join("config"))
            .args([
                "--trust",
                "run",
                "--backend",
                backend,
                "--",
                "/bin/sh",
                "-c",
            ])
            .arg(script)
            .stdin(std::process::Stdio::null());
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        cmd
    }
}

fn ready() -> bool {
    support::root_or_skip("the real-project suite")
        && support::tool_or_skip("node", "the real-project suite")
        && support::tool_or_skip("make", "the real-project suite")
}

/// Two tests of one case: as root, and as an ordinary user.
macro_rules! as_root_and_a_user {
    ($root:ident, $user:ident => $case:ident) => {
        #[test]
        fn $root() {
            if ready() {
                $case(None);
            }
        }

        #[test]
        fn $user() {
            if ready() {
                $case(Some(support::test_user()));
            }
        }
    };
}

const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Node, Python and make in the default sandbox; secrets masked; the host's directories
/// untouched by what the sandbox wrote.
fn ecosystems(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let p = Project::new(user, None);
        let proj = p.proj();
        let before: Vec<_> = ["node_modules", "build", ".venv", "tests/__pycache__"]
            .iter()
            .map(|d| tree(&proj.join(d)))
            .collect();
        let home = p.root().join("home");
        let o = p.run(
            backend,
            &home,
            SYSTEM_PATH,
            "npm test --silent 2>&1 | tail -1; \
             .venv/bin/python -m pytest -q -p no:cacheprovider tests >/dev/null 2>&1; echo pytest=$?; \
             echo v2 > src.txt; make -s; echo make=$?; echo built=$(cat build/out.txt); \
             echo x > node_modules/left-pad/installed-inside; echo nm-write=$?; \
             cat tests/__pycache__/stale.pyc >/dev/null 2>&1; echo stale-pyc=$?; \
             cat node_modules/some-sdk/.env >/dev/null 2>&1; echo dep-env=$?; \
             cat node_modules/some-sdk/test/server-key.pem >/dev/null 2>&1; echo dep-pem=$?; \
             cat node_modules/some-sdk/cacert.pem >/dev/null 2>&1; echo ca-bundle=$?; \
             cat config/master.key >/dev/null 2>&1; echo master-key=$?",
        );
        let who = format!(
            "[{backend}, {}]",
            if user.is_some() { "user" } else { "root" }
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("node-test", "ok");
        o.expect("pytest", "0");
        o.expect("make", "0");
        o.expect("built", "v2");
        o.expect("nm-write", "0");
        // The host's bytecode is not the sandbox's, nor the sandbox's the host's (a planted
        // .pyc would run in the host's Python).
        o.expect_failed("stale-pyc", "a cache directory is private and empty inside");
        o.expect_failed("dep-env", "a .env inside node_modules stays masked");
        o.expect_failed("dep-pem", "a key inside node_modules stays masked");
        o.expect("ca-bundle", "0");
        o.expect_failed("master-key", "a gitignored secret stays masked");
        let after: Vec<_> = ["node_modules", "build", ".venv", "tests/__pycache__"]
            .iter()
            .map(|d| tree(&proj.join(d)))
            .collect();
        assert_eq!(before, after, "{who} the host's directories changed");
        // A second run sees its own earlier writes (the layer is the sandbox's, kept).
        let o = p.run(
            backend,
            &home,
            SYSTEM_PATH,
            "test -f node_modules/left-pad/installed-inside; echo kept=$?",
        );
        o.expect("kept", "0");
    }
}

as_root_and_a_user!(node_python_and_make_projects_work_as_root, node_python_and_make_projects_work_as_a_user => ecosystems);

/// A fresh clone: the manifests promise `node_modules/` and `target/`, neither exists yet.
/// The sandbox's first install and build land in its own layers; the host never gets the
/// directories (a `node_modules/.bin` the host's hooks would run), and the next run sees
/// what the first one wrote.
fn fresh_clone(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let p = Project::new(user, None);
        let proj = p.proj();
        std::fs::remove_dir_all(proj.join("node_modules")).unwrap();
        p.write(
            "Cargo.toml",
            "[package]\nname = \"app\"\nversion = \"0.1.0\"\n",
        );
        assert!(!proj.join("target").exists());
        let home = p.root().join("home");
        let who = format!(
            "[{backend}, {}]",
            if user.is_some() { "user" } else { "root" }
        );
        let o = p.run(
            backend,
            &home,
            SYSTEM_PATH,
            "mkdir -p node_modules/.bin && printf '#!/bin/sh\\necho pwned\\n' > node_modules/.bin/prettier \
             && chmod +x node_modules/.bin/prettier; echo nm=$?; \
             mkdir -p target/debug && echo x > target/debug/build-script; echo target=$?",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("nm", "0");
        o.expect("target", "0");
        for d in ["node_modules", "target"] {
            assert!(
                std::fs::symlink_metadata(proj.join(d)).is_err(),
                "{who} the sandbox's {d}/ reached the host"
            );
        }
        // A run killed before it could remove its own layer (a second run at once gets one
        // of its own, `deps-run/<pid>`): the next start removes it.
        let state = walkdir::WalkDir::new(p.root().join("cache"))
            .into_iter()
            .flatten()
            .find(|e| e.file_type().is_dir() && e.file_name() == "deps")
            .map(|e| e.path().parent().unwrap().to_path_buf())
            .expect("the dependency layers' state dir");
        // One whose lock nobody holds (its run was killed), one whose lock is held (a run in
        // another pid namespace that shares this state dir, alive).
        let leaked = state.join("deps-run").join("4000000-1");
        let live = state.join("deps-run").join("4000001-1");
        for d in [&leaked, &live] {
            std::fs::create_dir_all(d.join("node_modules/upper")).unwrap();
            std::fs::write(d.join("node_modules/upper/file"), "x").unwrap();
            std::fs::write(d.join("lock"), "").unwrap();
        }
        let held = std::fs::File::open(live.join("lock")).unwrap();
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(
            unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) },
            0
        );
        // A leftover of a killed run that had made node_modules/ for itself: empty, recorded
        // as aisb's. The next run takes it as its own and removes it.
        let made_layer = std::fs::read_dir(state.join("deps"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.join("empty").is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().ends_with("-node_modules"))
            })
            .expect("node_modules/'s layer");
        std::fs::create_dir(proj.join("node_modules")).unwrap();
        std::fs::write(
            made_layer.join("made"),
            proj.join("node_modules").as_os_str().as_encoded_bytes(),
        )
        .unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::lchown(proj.join("node_modules"), Some(uid), Some(gid)).unwrap();
            std::os::unix::fs::lchown(made_layer.join("made"), Some(uid), Some(gid)).unwrap();
            support::chown_r(&state.join("deps-run"), uid, gid);
        }
        let o = p.run(
            backend,
            &home,
            SYSTEM_PATH,
            "test -x node_modules/.bin/prettier; echo kept=$?; test -f target/debug/build-script; echo kept-target=$?",
        );
        assert!(
            !leaked.exists(),
            "{who} a dead run's layer was left in {}",
            leaked.display()
        );
        assert!(
            live.join("node_modules/upper/file").exists(),
            "{who} a live run's layer was removed"
        );
        drop(held);
        o.expect("kept", "0");
        o.expect("kept-target", "0");
        assert!(
            std::fs::symlink_metadata(proj.join("node_modules")).is_err(),
            "{who} node_modules/ left on the host after the second run"
        );
    }
}

/// Two runs of a fresh clone at once: the first makes `node_modules/` for itself, the second
/// finds it made; the first ends while the second runs. It must not remove the directory the
/// other still has its layer on (removing a mount point in another mount namespace detaches
/// the mount there, and that run's writes would reach the host).
#[test]
fn a_made_directory_outlives_the_first_of_two_runs() {
    if !ready() {
        return;
    }
    for backend in BACKENDS {
        let p = Project::new(None, None);
        let proj = p.proj();
        std::fs::remove_dir_all(proj.join("node_modules")).unwrap();
        let home = p.root().join("home");
        let spawn = |script: &str| {
            p.cmd(backend, &home, SYSTEM_PATH, script)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let wait_for = |name: &str| {
            let mut waited = 0;
            while !proj.join(name).exists() && waited < 300 {
                std::thread::sleep(std::time::Duration::from_millis(100));
                waited += 1;
            }
            assert!(
                proj.join(name).exists(),
                "[{backend}] {name} never appeared"
            );
        };
        const WAIT: &str =
            "i=0; while [ ! -e $F ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done";
        let first = spawn(&format!(
            "touch first-started; F=second-started; {WAIT}; echo first=ok"
        ));
        wait_for("first-started");
        let second = spawn(&format!(
            "touch second-started; F=go-on; {WAIT}; \
             mkdir -p node_modules/.bin && echo evil > node_modules/.bin/hook; echo wrote=$?"
        ));
        let out = first.wait_with_output().unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("first=ok"),
            "[{backend}] {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(proj.join("go-on"), "").unwrap();
        let out = second.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("wrote=0"),
            "[{backend}] {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !proj.join("node_modules/.bin/hook").exists(),
            "[{backend}] the second run's install reached the host's node_modules/"
        );
        assert!(
            std::fs::symlink_metadata(proj.join("node_modules")).is_err(),
            "[{backend}] node_modules/ left on the host after both runs"
        );
    }
}

as_root_and_a_user!(a_fresh_clones_first_install_stays_in_the_sandbox_as_root, a_fresh_clones_first_install_stays_in_the_sandbox_as_a_user => fresh_clone);

/// The host's package caches are usable inside (a build works offline from them), and what
/// the sandbox downloads stays in its own layer: the host's cache is byte for byte the same.
/// A cache reached through a link is not mounted (the link could lead anywhere).
fn package_caches(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let p = Project::new(user, None);
        let home = p.root().join("home");
        for (rel, content) in [
            (
                ".cargo/registry/cache/index.crates.io/hex-0.4.3.crate",
                "crate bytes",
            ),
            (".npm/_cacache/index-v5/aa/bb", "npm index"),
            (".cache/pip/http/x", "wheel"),
        ] {
            let f = home.join(rel);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, content).unwrap();
        }
        // Go's cache through a link to a directory elsewhere: not followed.
        let elsewhere = p.root().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("mod")).unwrap();
        std::fs::write(elsewhere.join("mod/private.txt"), "other project").unwrap();
        std::fs::create_dir_all(home.join("go")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, home.join("go/pkg")).unwrap();
        if let Some((uid, gid)) = user {
            support::chown_r(&home, uid, gid);
        }
        let before = tree(&home);
        let who = format!(
            "[{backend}, {}]",
            if user.is_some() { "user" } else { "root" }
        );
        let o = p.run(
            backend,
            &home,
            SYSTEM_PATH,
            "echo crate=$(cat ~/.cargo/registry/cache/index.crates.io/hex-0.4.3.crate); \
             echo npm=$(cat ~/.npm/_cacache/index-v5/aa/bb); \
             echo downloaded > ~/.npm/_cacache/index-v5/aa/new; echo npm-write=$?; \
             echo changed > ~/.cache/pip/http/x; echo pip-write=$?; \
             cat ~/go/pkg/mod/private.txt >/dev/null 2>&1; echo linked=$?",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("crate", "crate bytes");
        o.expect("npm", "npm index");
        o.expect("npm-write", "0");
        o.expect("pip-write", "0");
        o.expect_failed("linked", "a cache behind a link is not mounted");
        assert_eq!(before, tree(&home), "{who} the host's caches changed");
        // The sandbox's own downloads are there the next time.
        let o = p.run(
            backend,
            &home,
            SYSTEM_PATH,
            "echo kept=$(cat ~/.npm/_cacache/index-v5/aa/new)",
        );
        o.expect("kept", "downloaded");
    }
}

as_root_and_a_user!(package_caches_are_usable_and_stay_the_hosts_as_root, package_caches_are_usable_and_stay_the_hosts_as_a_user => package_caches);

#[test]
fn write_through_writes_the_hosts_directory() {
    if !ready() {
        return;
    }
    for backend in BACKENDS {
        let p = Project::new(
            None,
            Some("secrets {\n    write-through \"node_modules/\"\n}\n"),
        );
        let home = p.root().join("home");
        let o = p.run(
            backend,
            &home,
            SYSTEM_PATH,
            "echo x > node_modules/left-pad/installed-inside; echo nm-write=$?; \
             cat node_modules/some-sdk/.env >/dev/null 2>&1; echo dep-env=$?",
        );
        o.expect("nm-write", "0");
        o.expect_failed("dep-env", "masked even when written through");
        assert!(
            p.proj()
                .join("node_modules/left-pad/installed-inside")
                .exists(),
            "[{backend}] write-through must reach the host"
        );
    }
}

/// The caller's rustup toolchain (root's, where CI runs) works from the hidden home: cargo
/// builds and tests a crate whose `target/` the host built first, and the host's `target/`
/// is unchanged afterwards.
#[test]
fn cargo_from_rustup_in_the_home_builds_over_the_hosts_target() {
    if !ready() {
        return;
    }
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    let cargo_bin = home.join(".cargo/bin");
    if !cargo_bin.join("cargo").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI builds with rustup: {} must exist",
            cargo_bin.display()
        );
        eprintln!("SKIPPED: no rustup toolchain in {}", home.display());
        return;
    }
    let path = format!("{}:{SYSTEM_PATH}", cargo_bin.display());
    for backend in BACKENDS {
        let p = Project::new(None, None);
        p.write(
            "Cargo.toml",
            "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
        );
        p.write(
            "src/main.rs",
            "fn main() { println!(\"answer={}\", 6 * 7); }\n#[test]\nfn adds() { assert_eq!(2 + 2, 4); }\n",
        );
        let host_build = Command::new(cargo_bin.join("cargo"))
            .args(["build", "--offline", "-q"])
            .current_dir(p.proj())
            .env_remove("CARGO_TARGET_DIR")
            .env("PATH", &path)
            .status()
            .unwrap();
        assert!(host_build.success());
        let before = tree(&p.proj().join("target"));
        let o = p.run(
            backend,
            &home,
            &path,
            "cargo --version >/dev/null; echo cargo=$?; \
             cat ~/.cargo/config.toml ~/.cargo/credentials.toml 2>/dev/null | wc -c | sed 's/^ */cargo-config-bytes=/'; \
             echo 'fn main() { println!(\"answer={}\", 7 * 6); }' > src/main.rs; \
             cargo build --offline -q && ./target/debug/tiny; \
             cargo test --offline -q 2>&1 | grep -c 'test result: ok' | sed 's/^/tested=/'",
        );
        assert_eq!(o.code, 0, "[{backend}] {}\n{}", o.stdout, o.stderr);
        o.expect("cargo", "0");
        o.expect("cargo-config-bytes", "0");
        o.expect("answer", "42");
        o.expect("tested", "1");
        assert_eq!(
            before,
            tree(&p.proj().join("target")),
            "[{backend}] the host's target/ changed"
        );
    }
}
