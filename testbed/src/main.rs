//! The VM testbed: boots real kernels in QEMU and runs aisb's isolation scenarios (`vm-tests/`)
//! inside them, for both backends, as root and as uid 1000. One VM per kernel, in parallel up
//! to the core count, TCG unless KVM answers (it hangs on some hosts), a hard timeout, the
//! serial console kept as the artifact. Results come back as `@@RESULT {json}` lines.
//!
//!   cargo run -p testbed -- run                      the default matrix (Debian 6.1 and 6.12)
//!   cargo run -p testbed -- run --filter ssh --json
//!   cargo run -p testbed -- run --kernel /boot/vmlinuz-x:/lib/modules/x

mod initramfs;
mod kernel;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum Error {
    #[error("{what}")]
    #[diagnostic(help("{help}"))]
    Msg { what: String, help: String },
}

impl Error {
    pub fn msg(what: impl Into<String>, help: impl Into<String>) -> Error {
        Error::Msg {
            what: what.into(),
            help: help.into(),
        }
    }
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |e| {
            Error::msg(
                format!("{}: {e}", path.display()),
                "check the path and permissions",
            )
        }
    }
}

/// Run a command, returning stdout; a failure names the command and shows its stderr.
pub fn run(cmd: &mut Command) -> Result<String, Error> {
    let out = cmd.output().map_err(|e| {
        Error::msg(
            format!("cannot run {:?}: {e}", cmd.get_program()),
            "sh scripts/setup-tests.sh installs what the testbed needs",
        )
    })?;
    if !out.status.success() {
        return Err(Error::msg(
            format!(
                "{:?} failed: {}",
                cmd,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            "see the message above",
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[derive(Parser)]
#[command(
    name = "testbed",
    about = "Boot real kernels in QEMU and run aisb's isolation scenarios in them"
)]
enum Cli {
    /// Build, boot and report
    Run(RunArgs),
}

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  cargo run -p testbed -- run\n  cargo run -p testbed -- run --filter ssh --json\n  cargo run -p testbed -- run --kernel /boot/vmlinuz-6.1.0-56-amd64:/lib/modules/6.1.0-56-amd64"
)]
struct RunArgs {
    /// A kernel as IMAGE[:MODULES_DIR] (repeatable); default: Debian's newest 6.1 and 6.12
    #[arg(long)]
    kernel: Vec<String>,
    /// Only scenarios whose name contains this
    #[arg(long)]
    filter: Option<String>,
    /// JSON on stdout instead of the table
    #[arg(long)]
    json: bool,
    /// Seconds before a VM is killed (under TCG on 2 cores the matrix takes 550–600 s per
    /// kernel now: issue 33 is to bring it back down)
    #[arg(long, default_value_t = 1200)]
    timeout: u64,
    /// Test the testbed: boot sandboxes that leak ~/.ssh (every run must then FAIL)
    #[arg(long)]
    break_isolation: bool,
    /// The aisb binaries to test (default: build them with `cargo build --release`)
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Outcome {
    scenario: String,
    backend: String,
    user: String,
    outcome: String,
    detail: String,
    /// How long the scenario took inside the sandbox (the guest's uptime around it).
    #[serde(default)]
    seconds: f64,
    #[serde(default)]
    kernel: String,
}

struct VmRun {
    kernel: String,
    results: Vec<Outcome>,
    done: bool,
    boot_s: f64,
    total_s: f64,
    log: PathBuf,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

fn main() -> miette::Result<()> {
    let Cli::Run(a) = Cli::parse();
    let code = run_matrix(a)?;
    std::process::exit(code)
}

fn run_matrix(a: RunArgs) -> Result<i32, Error> {
    let root = workspace();
    let cache = root.join("target/testbed");
    for tool in [
        "qemu-system-x86_64",
        "busybox",
        "bwrap",
        "git",
        "newuidmap",
        "ldd",
    ] {
        which(tool).ok_or_else(|| {
            Error::msg(
                format!("`{tool}` is not installed"),
                "sh scripts/setup-tests.sh installs what the testbed needs",
            )
        })?;
    }
    let bins = match &a.bin_dir {
        Some(d) => d.clone(),
        None => {
            eprintln!("testbed: building aisb (release)");
            run(Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--release",
                    "-q",
                    "-p",
                    "aisb",
                    "--bins",
                    "--features",
                    "test-probe",
                ])
                .current_dir(&root))?;
            root.join("target/release")
        }
    };
    let kernels: Vec<kernel::Kernel> = if a.kernel.is_empty() {
        kernel::DEFAULT
            .iter()
            .map(|r| kernel::debian(&cache, r))
            .collect::<Result<_, _>>()?
    } else {
        a.kernel
            .iter()
            .map(|k| kernel::given(k))
            .collect::<Result<_, _>>()?
    };
    let run_layer = run_layer(&root, &bins, a.filter.as_deref(), a.break_isolation)?;
    let run_cpio = initramfs::cached(&run_layer, &cache.join("initramfs"), "run")?;
    let accel = accel(&kernels[0].image);
    eprintln!("testbed: {} kernel(s), accel {accel}", kernels.len());
    let started = Instant::now();
    let parallel = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .max(1);
    let mut runs: Vec<VmRun> = Vec::new();
    for chunk in kernels.chunks(parallel) {
        let handles: Vec<_> = chunk
            .iter()
            .map(|k| {
                let base = base_layer(k).and_then(|t| {
                    initramfs::cached(&t, &cache.join("initramfs"), &format!("base-{}", k.name))
                });
                let k = k.clone();
                let run_cpio = run_cpio.clone();
                let logs = cache.join("logs");
                let timeout = Duration::from_secs(a.timeout);
                std::thread::spawn(move || -> Result<VmRun, Error> {
                    boot(&k, &base?, &run_cpio, &logs, accel, timeout)
                })
            })
            .collect();
        for h in handles {
            runs.push(
                h.join()
                    .map_err(|_| Error::msg("a VM thread panicked", "this is a testbed bug"))??,
            );
        }
    }
    report(
        &runs,
        a.json,
        started.elapsed().as_secs_f64(),
        a.break_isolation,
    )
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// KVM when a kernel actually boots under it within seconds (on nested hosts it can hang or
/// abort); TCG otherwise. `TESTBED_TCG=1` skips the check.
fn accel(image: &Path) -> &'static str {
    if !Path::new("/dev/kvm").exists() || std::env::var_os("TESTBED_TCG").is_some() {
        return "tcg";
    }
    // No initramfs: the kernel boots, finds no root and panics; -no-reboot makes QEMU exit.
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "kvm",
            "-M",
            "pc",
            "-cpu",
            "max",
            "-m",
            "256M",
            "-nodefaults",
        ])
        .args([
            "-display",
            "none",
            "-no-reboot",
            "-serial",
            "stdio",
            "-kernel",
        ])
        .arg(image)
        .args(["-append", "console=ttyS0 panic=-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else { return "tcg" };
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            let booted = BufReader::new(out)
                .split(b'\n')
                .map_while(Result::ok)
                .any(|l| String::from_utf8_lossy(&l).contains("Kernel panic"));
            let _ = tx.send(booted);
        });
    }
    let ok = rx.recv_timeout(Duration::from_secs(15)).unwrap_or(false);
    let _ = child.kill();
    let _ = child.wait();
    if ok {
        "kvm"
    } else {
        "tcg"
    }
}

/// Busybox, the programs the sandboxes need, their libraries, the kernel's modules.
fn base_layer(k: &kernel::Kernel) -> Result<initramfs::Tree, Error> {
    let mut t = initramfs::Tree::default();
    for d in [
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
        "root",
        "home/tester",
        "newroot",
        "etc",
        "usr/lib64",
        "usr/sbin",
    ] {
        t.dir(d);
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        t.symlink(link, target);
    }
    let busybox = which("busybox")
        .ok_or_else(|| Error::msg("busybox is not installed", "apt-get install busybox-static"))?;
    t.copy(&busybox, "usr/bin/busybox")?;
    let applets = run(Command::new(&busybox).arg("--list"))?;
    for applet in applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        t.symlink(&format!("usr/bin/{applet}"), "busybox");
    }
    for (prog, inside) in [
        ("bwrap", "usr/bin/bwrap"),
        ("git", "usr/bin/git"),
        ("newuidmap", "usr/bin/newuidmap"),
        ("newgidmap", "usr/bin/newgidmap"),
        ("setpriv", "usr/bin/setpriv"),
    ] {
        let host = which(prog).ok_or_else(|| {
            Error::msg(
                format!("{prog} is not installed"),
                "sh scripts/setup-tests.sh",
            )
        })?;
        t.program(&host, inside)?;
    }
    // The dynamic loader at the path every program names.
    t.copy(
        Path::new("/lib64/ld-linux-x86-64.so.2"),
        "usr/lib64/ld-linux-x86-64.so.2",
    )?;
    // overlayfs, and FUSE for the reporting layer of masks (attempts on masked paths).
    for (i, m) in kernel::module_files(k, &["overlay", "fuse"])
        .iter()
        .enumerate()
    {
        let name = m
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let name = name
            .trim_end_matches(".xz")
            .trim_end_matches(".zst")
            .trim_end_matches(".gz");
        t.file(
            &format!("modules/{i:02}-{name}"),
            0o644,
            initramfs::module_bytes(m)?,
        );
    }
    t.file("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\ntester:x:1000:1000:tester:/home/tester:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec());
    t.file(
        "etc/group",
        0o644,
        b"root:x:0:\ntester:x:1000:\nnogroup:x:65534:\n".to_vec(),
    );
    t.file("etc/subuid", 0o644, b"tester:100000:65536\n".to_vec());
    t.file("etc/subgid", 0o644, b"tester:100000:65536\n".to_vec());
    t.file("etc/hosts", 0o644, b"127.0.0.1 localhost\n".to_vec());
    t.file(
        "etc/nsswitch.conf",
        0o644,
        // Debian's own: names are looked up in /etc/hosts, then by DNS (the sandbox's stub).
        b"passwd: files\ngroup: files\nhosts: files dns\n".to_vec(),
    );
    Ok(t)
}

/// What changes every run: the binaries under test, the scenarios, the init.
fn run_layer(
    root: &Path,
    bins: &Path,
    filter: Option<&str>,
    break_isolation: bool,
) -> Result<initramfs::Tree, Error> {
    let mut t = initramfs::Tree::default();
    for b in ["aisb", "aisb-init", "aisb-probe"] {
        let host = bins.join(b);
        if !host.is_file() {
            return Err(Error::msg(
                format!("{} is missing", host.display()),
                "build with `cargo build --release -p aisb --bins --features test-probe` or pass --bin-dir",
            ));
        }
        t.program(&host, &format!("usr/local/bin/{b}"))?;
    }
    let vt = root.join("vm-tests");
    for f in ["run.sh", "fixture.sh"] {
        t.copy(&vt.join(f), &format!("vm-tests/{f}"))?;
    }
    let scenarios = vt.join("scenarios");
    let mut n = 0;
    for e in std::fs::read_dir(&scenarios)
        .map_err(Error::io(&scenarios))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if filter.is_none_or(|f| name.contains(f)) {
            t.copy(&e.path(), &format!("vm-tests/scenarios/{name}"))?;
            n += 1;
        }
    }
    if n == 0 {
        return Err(Error::msg(
            "no scenario matches the filter",
            "see vm-tests/scenarios/",
        ));
    }
    let brk = if break_isolation {
        "export AISB_TEST_BREAK_ISOLATION=ssh\n"
    } else {
        ""
    };
    t.file("init", 0o755, INIT_STAGE1.as_bytes().to_vec());
    t.file(
        "init2",
        0o755,
        format!("{INIT_STAGE2_HEAD}{brk}{INIT_STAGE2_TAIL}").into_bytes(),
    );
    Ok(t)
}

/// The initramfs root cannot be pivot_root'ed away from (bwrap and libcontainer both do):
/// bind it onto itself as a real mount, move it to /, chroot, and carry on from there.
const INIT_STAGE1: &str = r#"#!/bin/sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount --bind / /newroot
cd /newroot
/bin/busybox mount --move . /
exec /bin/busybox chroot . /init2
"#;

const INIT_STAGE2_HEAD: &str = r#"#!/bin/sh
export PATH=/usr/local/bin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /sys/fs/cgroup
mount -t devpts devpts /dev/pts
mount -t tmpfs tmp /tmp
chmod 1777 /tmp
mount -t cgroup2 none /sys/fs/cgroup
mount --make-rprivate /
hostname vm
ip link set lo up
for m in /modules/*; do [ -e "$m" ] && insmod "$m" 2>/dev/null; done
# As udev makes it on a desktop: every user may mount FUSE in a namespace of their own.
[ -c /dev/fuse ] && chmod 0666 /dev/fuse
echo "@@BOOTED $(cut -d' ' -f1 /proc/uptime)"
probe() { # name command...
    n=$1; shift
    if "$@" >/dev/null 2>&1; then o=pass; else o=skip; fi
    echo "@@RESULT {\"scenario\":\"kernel:$n\",\"backend\":\"-\",\"user\":\"-\",\"outcome\":\"$o\",\"detail\":\"$(uname -r)\"}"
}
probe userns unshare -U true
probe overlay-in-userns unshare -Urm sh -c 'mkdir -p /tmp/o/l /tmp/o/u /tmp/o/w /tmp/o/m && mount -t overlay o -o lowerdir=/tmp/o/l,upperdir=/tmp/o/u,workdir=/tmp/o/w /tmp/o/m'
probe seccomp grep -q '^Seccomp:' /proc/self/status
probe cgroup2 test -e /sys/fs/cgroup/cgroup.controllers
"#;

const INIT_STAGE2_TAIL: &str = r#"SMALL_PIDS=1 sh /vm-tests/run.sh /usr/local/bin/aisb /usr/local/bin/aisb-probe /tmp/work "bwrap libcontainer" "root tester:1000:1000"
echo "@@DMESG"
dmesg
echo "@@DONE"
sync
poweroff -f
"#;

fn boot(
    k: &kernel::Kernel,
    base: &Path,
    run_cpio: &Path,
    logs: &Path,
    accel: &str,
    timeout: Duration,
) -> Result<VmRun, Error> {
    std::fs::create_dir_all(logs).map_err(Error::io(logs))?;
    // The two layers, concatenated: the kernel unpacks one after the other.
    let initrd = logs.join(format!("initrd-{}.cpio", k.name));
    {
        let mut out = std::fs::File::create(&initrd).map_err(Error::io(&initrd))?;
        for part in [base, run_cpio] {
            let mut f = std::fs::File::open(part).map_err(Error::io(part))?;
            std::io::copy(&mut f, &mut out).map_err(Error::io(&initrd))?;
        }
    }
    let log_path = logs.join(format!("{}.log", k.name));
    let start = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel", accel, "-M", "pc", "-cpu", "max", "-smp", "1", "-m", "1536M",
        ])
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(&k.image)
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Error::msg(
                format!("cannot start qemu: {e}"),
                "apt-get install qemu-system-x86",
            )
        })?;
    let pid = child.id();
    // The hard timeout: kill the VM whatever it is doing.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if rx.recv_timeout(timeout).is_err() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    });
    let mut log = String::new();
    let mut results = Vec::new();
    let mut done = false;
    let mut boot_s = 0.0;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).split(b'\n').map_while(Result::ok) {
            let line = String::from_utf8_lossy(&line).replace('\r', "");
            if let Some(j) = line.strip_prefix("@@RESULT ") {
                if let Ok(mut o) = serde_json::from_str::<Outcome>(j) {
                    o.kernel = k.name.clone();
                    results.push(o);
                }
            } else if line.starts_with("@@BOOTED") {
                boot_s = start.elapsed().as_secs_f64();
            } else if line.starts_with("@@DONE") {
                done = true;
            }
            log.push_str(&line);
            log.push('\n');
        }
    }
    let _ = child.wait();
    let _ = tx.send(());
    if let Some(mut e) = child.stderr.take() {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
        log.push_str(&s);
    }
    std::fs::write(&log_path, &log).map_err(Error::io(&log_path))?;
    let _ = std::fs::remove_file(&initrd);
    Ok(VmRun {
        kernel: k.name.clone(),
        results,
        done,
        boot_s,
        total_s: start.elapsed().as_secs_f64(),
        log: log_path,
    })
}

fn report(runs: &[VmRun], json: bool, wall: f64, expect_failures: bool) -> Result<i32, Error> {
    let all: Vec<&Outcome> = runs.iter().flat_map(|r| &r.results).collect();
    let failed = all.iter().filter(|o| o.outcome == "fail").count();
    let incomplete: Vec<&VmRun> = runs.iter().filter(|r| !r.done).collect();
    if json {
        let v = serde_json::json!({
            "results": all,
            "vms": runs.iter().map(|r| serde_json::json!({"kernel": r.kernel, "completed": r.done, "boot_s": r.boot_s, "total_s": r.total_s, "log": r.log})).collect::<Vec<_>>(),
            "failed": failed,
        });
        println!("{v}");
    } else {
        let mut kernels: Vec<&str> = runs.iter().map(|r| r.kernel.as_str()).collect();
        kernels.dedup();
        let mut rows: Vec<(String, String, String)> = all
            .iter()
            .map(|o| (o.scenario.clone(), o.backend.clone(), o.user.clone()))
            .collect();
        rows.sort();
        rows.dedup();
        print!("{:<36}{:<14}{:<8}", "scenario", "backend", "user");
        for k in &kernels {
            print!("{k:>12}");
        }
        println!();
        for (s, b, u) in &rows {
            print!("{s:<36}{b:<14}{u:<8}");
            for k in &kernels {
                let o = all.iter().find(|o| {
                    &o.scenario == s && &o.backend == b && &o.user == u && o.kernel == *k
                });
                print!("{:>12}", o.map_or("-", |o| o.outcome.as_str()));
            }
            println!();
        }
        for o in all.iter().filter(|o| o.outcome != "pass") {
            println!(
                "  {} {} {} on {}: {} ({})",
                o.outcome, o.scenario, o.backend, o.kernel, o.user, o.detail
            );
        }
        // Where the matrix's time goes: the slowest scenarios per kernel, summed over the
        // backends and callers (issue 33 keeps the matrix under 90 s).
        for k in &kernels {
            let mut by: std::collections::BTreeMap<&str, f64> = Default::default();
            for o in all.iter().filter(|o| o.kernel == *k) {
                *by.entry(o.scenario.as_str()).or_default() += o.seconds;
            }
            let total: f64 = by.values().sum();
            let mut slow: Vec<(&str, f64)> = by.into_iter().collect();
            slow.sort_by(|a, b| b.1.total_cmp(&a.1));
            let top: Vec<String> = slow
                .iter()
                .take(6)
                .map(|(s, t)| format!("{s} {t:.1} s"))
                .collect();
            println!(
                "{k}: scenarios took {total:.1} s inside the sandboxes; slowest: {}",
                top.join(", ")
            );
        }
        for r in runs {
            println!(
                "{}: {} results, boot {:.1} s, VM total {:.1} s, log {}",
                r.kernel,
                r.results.len(),
                r.boot_s,
                r.total_s,
                r.log.display()
            );
        }
        println!(
            "matrix wall time {wall:.1} s; {} scenario results, {failed} failed",
            all.len()
        );
    }
    for r in &incomplete {
        eprintln!(
            "testbed: the VM for {} did not finish (timeout or crash); see {}",
            r.kernel,
            r.log.display()
        );
    }
    let ok = if expect_failures {
        failed > 0
    } else {
        failed == 0 && incomplete.is_empty() && !all.is_empty()
    };
    Ok(if ok { 0 } else { 1 })
}
