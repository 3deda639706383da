//! Secrets that appear while a sandbox runs: the host writes a file that the sensitive patterns
//! or the `block` list match into the project (created, renamed in, in a new directory, a new
//! directory whose name matches), and within 100 ms it is unreadable inside, on both backends,
//! as root and as an ordinary user, with an audit event naming it; a gitignored build output
//! the host writes stays readable. Named sandboxes never see the host's untracked files at all.
//!
//! Inside, a monitor reads every path as fast as it can and records each change of what it
//! sees (readable, denied, missing) with the time; the host records when it wrote each one.
//! Needs root (it runs the suite as the test user too); CI runs as root.

mod support;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{test_user, Out};

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];
/// The promise: a late secret is unreadable inside this soon after the host wrote it.
const DEADLINE_NS: i128 = 100_000_000;

fn matrix() -> Vec<(&'static str, Option<(u32, u32)>)> {
    let user = test_user();
    let mut m: Vec<_> = BACKENDS.iter().map(|b| (*b, None)).collect();
    m.extend(BACKENDS.iter().map(|b| (*b, Some(user))));
    m
}

fn privileged() -> bool {
    support::root_or_skip("the late-secrets suite")
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// Reads each path (argv) in a tight loop until `live-stop` exists (or 30 s), and prints one
/// line per path: `path|state@ns,state@ns,...` (each change of state), then `reads=N`.
const MONITOR: &str = r#"
import os, sys, time
paths = sys.argv[1:]
seen = {p: [] for p in paths}
def state(p):
    try:
        with open(p, "rb") as f:
            return "readable:" + f.read().decode(errors="replace").strip().replace(",", ";")
    except PermissionError:
        return "denied"
    except FileNotFoundError:
        return "missing"
    except IsADirectoryError:
        return "dir"
    except OSError as e:
        return "error:" + str(e.errno)
print("started", flush=True)
reads = 0
end = time.time() + 30
while not os.path.exists("live-stop") and time.time() < end:
    for p in paths:
        s = state(p)
        reads += 1
        if not seen[p] or seen[p][-1][0] != s:
            seen[p].append((s, time.time_ns()))
for p in paths:
    print(p + "|" + ",".join(s + "@" + str(t) for s, t in seen[p]))
print("reads=" + str(reads))
print("end=" + str(time.time_ns()))
"#;

struct Project {
    dir: tempfile::TempDir,
    user: Option<(u32, u32)>,
    exe: PathBuf,
}

impl Project {
    fn new(user: Option<(u32, u32)>) -> Project {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Project {
            dir,
            user,
            exe: PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
        };
        for d in ["home", "proj", "outside"] {
            std::fs::create_dir_all(p.root().join(d)).unwrap();
        }
        std::fs::write(p.proj().join(".gitignore"), "build/\nlive-*\n").unwrap();
        std::fs::write(p.proj().join("sandbox.kdl"), "block \"*.dump\"\n").unwrap();
        std::fs::write(p.proj().join("README"), "hello\n").unwrap();
        std::fs::write(p.proj().join("notes.txt"), "shared notes\n").unwrap();
        p.git(&["init", "-q"]);
        p.git(&["add", "-A"]);
        p.git(&["commit", "-qm", "init"]);
        if let Some((uid, gid)) = user {
            p.exe = support::hand_to_user(p.root(), uid, gid);
        }
        p
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn proj(&self) -> PathBuf {
        self.root().join("proj")
    }
    fn git(&self, args: &[&str]) {
        let ok = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(self.proj())
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "git {args:?}");
    }
    fn aisb(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        cmd.current_dir(self.proj())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.root().join("home"))
            .env("XDG_CACHE_HOME", self.root().join("cache"))
            .stdin(Stdio::null());
        cmd
    }
    /// Write `content` at `rel` as the host (the sandbox's owner would), creating parents.
    fn host_write(&self, rel: &str, content: &str) {
        let p = self.proj().join(rel);
        let mut created = Vec::new();
        let mut d = p.parent().unwrap().to_path_buf();
        while !d.exists() {
            created.push(d.clone());
            d = d.parent().unwrap().to_path_buf();
        }
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        self.give(&p);
        for d in created {
            self.give(&d);
        }
    }
    fn give(&self, p: &Path) {
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
        }
    }
}

/// What the monitor saw of one path: (state, time) at each change.
fn timeline(out: &str, path: &str) -> Vec<(String, i128)> {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{path}|")))
        .unwrap_or_else(|| panic!("the monitor reported nothing for {path}:\n{out}"));
    line.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (st, t) = s.rsplit_once('@').unwrap();
            (st.to_string(), t.parse().unwrap())
        })
        .collect()
}

/// One late secret: `hidden` is what the monitor must see in the end (`denied` for a masked
/// file, `missing` for a file in a masked directory), and it must have got there within the
/// deadline. Returns the window in ns: from the host's write to the last time the monitor
/// could read it (0: never).
fn assert_masked(
    out: &Out,
    label: &str,
    path: &str,
    written_ns: i128,
    hidden: &str,
    end_ns: i128,
) -> i128 {
    let t = timeline(&out.stdout, path);
    let (last, at) = t.last().unwrap().clone();
    assert_eq!(
        last, hidden,
        "[{label}] {path}: not hidden at the end; timeline {t:?}\nstderr:\n{}",
        out.stderr
    );
    assert!(
        end_ns - written_ns > 2 * DEADLINE_NS,
        "[{label}] the monitor stopped too early to tell"
    );
    assert!(
        at - written_ns < DEADLINE_NS,
        "[{label}] {path}: hidden only {} ms after the host wrote it; timeline {t:?}",
        (at - written_ns) / 1_000_000
    );
    // Readable from the change into a readable state until the mask: the race.
    t.iter()
        .position(|(s, _)| s.starts_with("readable"))
        .map_or(0, |i| t[i + 1].1 - written_ns)
}

/// Each case: the path the monitor reads, and what the host does.
#[test]
fn late_secrets_are_masked_within_100ms() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let who = user.map_or("root".to_string(), |(uid, _)| uid.to_string());
        let label = format!("{backend} {who}");
        let p = Project::new(user);
        let watched = [
            ".env.local",
            "id_rsa",
            "db.dump",
            "new/deeper/.env",
            ".aws/credentials",
            "build/out.txt",
            "notes.txt",
            ".env.early",
        ];
        let mut child = p
            .aisb()
            .args(["run", "--backend", backend, "--", "python3", "-c", MONITOR])
            .args(watched)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // While the sandbox starts: before or after the scan, before or after the watcher's
        // first walk, before its helper joined; masked in the end whichever it was.
        p.host_write(".env.early", "EARLY=1\n");
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "started\n", "[{label}] the sandbox did not start");
        // The watcher is set up while the workload starts; give it a moment, as a late secret
        // is by definition late.
        std::thread::sleep(Duration::from_millis(200));
        let mut written = Vec::new();
        let gap = Duration::from_millis(150);

        written.push(now_ns());
        p.host_write(".env.local", "LATE_SECRET=1\n");
        std::thread::sleep(gap);

        // Renamed into place from outside the project (same filesystem).
        let staged = p.root().join("outside/key");
        std::fs::write(&staged, "PRIVATE KEY\n").unwrap();
        p.give(&staged);
        written.push(now_ns());
        std::fs::rename(&staged, p.proj().join("id_rsa")).unwrap();
        std::thread::sleep(gap);

        written.push(now_ns());
        p.host_write("db.dump", "rows\n");
        std::thread::sleep(gap);

        // A file inside directories that are new: created before any watch could be on them.
        written.push(now_ns());
        p.host_write("new/deeper/.env", "DEEP=1\n");
        std::thread::sleep(gap);

        // A directory whose name matches (`.aws/`): the whole directory is masked.
        written.push(now_ns());
        p.host_write(".aws/credentials", "aws_secret\n");
        std::thread::sleep(gap);

        // A symlink with a secret's name: what it points to in the project is masked, as the
        // start-up masks do (the runtimes follow it).
        written.push(now_ns());
        std::os::unix::fs::symlink("notes.txt", p.proj().join(".env.alias")).unwrap();
        p.give(&p.proj().join(".env.alias"));
        std::thread::sleep(gap);

        // A gitignored build output: not a secret, stays readable.
        p.host_write("build/out.txt", "artifact\n");
        std::thread::sleep(Duration::from_millis(300));

        p.host_write("live-stop", "");
        let started = Instant::now();
        let status = child.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        let out = Out {
            stdout: rest,
            stderr,
            code: status.code().unwrap_or(-1),
        };
        assert_eq!(out.code, 0, "[{label}] {}\n{}", out.stdout, out.stderr);
        assert!(started.elapsed() < Duration::from_secs(10));
        // The helper that masked inside ended with the run.
        let helpers = Command::new("pgrep")
            .args(["-f", &format!("__mask [0-9]+ {}$", p.proj().display())])
            .output()
            .unwrap();
        assert!(
            helpers.stdout.is_empty(),
            "[{label}] a mask helper outlived the run: {}",
            String::from_utf8_lossy(&helpers.stdout)
        );
        let end: i128 = out.value("end").unwrap().parse().unwrap();

        let cases = [
            (".env.local", "denied"),
            ("id_rsa", "denied"),
            ("db.dump", "denied"),
            ("new/deeper/.env", "denied"),
            (".aws/credentials", "missing"),
            ("notes.txt", "denied"),
        ];
        let mut windows = Vec::new();
        for ((path, hidden), at) in cases.iter().zip(&written) {
            windows.push(assert_masked(&out, &label, path, *at, hidden, end));
        }
        let early = timeline(&out.stdout, ".env.early");
        assert_eq!(
            early.last().map(|(s, _)| s.as_str()),
            Some("denied"),
            "[{label}] a secret written while the sandbox started: {early:?}"
        );
        let build = timeline(&out.stdout, "build/out.txt");
        assert_eq!(
            build.last().map(|(s, _)| s.as_str()),
            Some("readable:artifact"),
            "[{label}] the gitignored build output: {build:?}"
        );
        eprintln!(
            "[{label}] ms readable inside after the host's write: {:?} ({} reads)",
            windows
                .iter()
                .map(|w| format!("{:.2}", *w as f64 / 1e6))
                .collect::<Vec<_>>(),
            out.value("reads").unwrap_or("?")
        );

        // The audit log names each path and the rule that masked it.
        let audit = Out::from(p.aisb().args(["audit", "--json"]).output().unwrap());
        let events: Vec<serde_json::Value> = audit
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|e: &serde_json::Value| e["event"] == "late-mask")
            .collect();
        for (path, rule) in [
            (".env.local", "sensitive \".env.*\""),
            ("id_rsa", "sensitive \"id_rsa\""),
            ("db.dump", "block \"*.dump\""),
            ("new/deeper/.env", "sensitive \".env\""),
            (".aws", "sensitive \".aws/\""),
            (".env.alias", "sensitive \".env.*\""),
        ] {
            let want = p.proj().join(path);
            assert!(
                events
                    .iter()
                    .any(|e| e["path"] == want.to_str().unwrap() && e["rule"] == rule),
                "[{label}] no late-mask event for {path} ({rule}): {events:?}\n{}",
                audit.stderr
            );
        }
        assert!(
            !events
                .iter()
                .any(|e| e["path"].as_str().is_some_and(|p| p.contains("build"))),
            "[{label}] the build output was masked: {events:?}"
        );
    }
}

/// Named sandboxes are immune by construction: they work in a clone, which untracked files of
/// the host repository never enter. A `.env.local` written into the repository while one runs
/// is never visible inside (and there is nothing for the live layer to mask).
#[test]
fn a_named_sandbox_never_sees_what_the_host_writes_into_the_repository() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let who = user.map_or("root".to_string(), |(uid, _)| uid.to_string());
        let label = format!("{backend} {who}");
        let p = Project::new(user);
        let mut child = p
            .aisb()
            .args(["run", "--backend", backend, "--sandbox", "late", "--"])
            .args(["python3", "-c", MONITOR, ".env.local", "README"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "started\n", "[{label}] the sandbox did not start");
        p.host_write(".env.local", "LATE_SECRET=1\n");
        std::thread::sleep(Duration::from_millis(300));
        // The stop marker goes where the sandbox works: its clone (the repository is not it).
        let plan = Out::from(
            p.aisb()
                .args(["plan", "--json", "--sandbox", "late"])
                .output()
                .unwrap(),
        );
        let v: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();
        let clone = PathBuf::from(v["state_dir"].as_str().unwrap()).join("clone");
        std::fs::write(clone.join("live-stop"), "").unwrap();
        let status = child.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(0), "[{label}] {rest}\n{stderr}");
        let seen = timeline(&rest, ".env.local");
        assert!(
            seen.iter().all(|(s, _)| s == "missing"),
            "[{label}] the host's .env.local reached the named sandbox: {seen:?}"
        );
        // The same monitor does see the clone's own files.
        assert_eq!(
            timeline(&rest, "README").last().map(|(s, _)| s.as_str()),
            Some("readable:hello"),
            "[{label}] {rest}"
        );
    }
}

/// The tests of the tests: with the live layer deliberately off
/// (`AISB_TEST_BREAK_ISOLATION=late-secrets`), the same late `.env.local` stays readable, so
/// `late_secrets_are_masked_within_100ms` would fail on a build without the layer.
#[test]
fn without_the_live_layer_a_late_secret_stays_readable() {
    if !privileged() {
        return;
    }
    for backend in BACKENDS {
        let p = Project::new(None);
        let mut child = p
            .aisb()
            .env("AISB_TEST_BREAK_ISOLATION", "late-secrets")
            .args(["run", "--backend", backend, "--", "python3", "-c", MONITOR])
            .arg(".env.local")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "started\n", "[{backend}] the sandbox did not start");
        std::thread::sleep(Duration::from_millis(200));
        p.host_write(".env.local", "LATE_SECRET=1\n");
        std::thread::sleep(Duration::from_millis(300));
        p.host_write("live-stop", "");
        let out = Out::from(child.wait_with_output().unwrap());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        assert_eq!(out.code, 0, "[{backend}] {}", out.stderr);
        assert!(
            out.stderr.contains("late-secrets"),
            "[{backend}] no warning: {}",
            out.stderr
        );
        assert_eq!(
            timeline(&rest, ".env.local")
                .last()
                .map(|(s, _)| s.as_str()),
            Some("readable:LATE_SECRET=1"),
            "[{backend}] {rest}"
        );
    }
}
