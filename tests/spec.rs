//! Plan -> OCI spec: a snapshot of a hand-built plan, and a bundle run by runc (a real OCI
//! runtime) where masked files must fail with "Permission denied", masked dirs must be empty
//! and unwritable, the home must be hidden and overlay writes must not reach the host.

mod support;

use std::path::PathBuf;
use std::process::Command;

use aisb::eval::plan::*;
use aisb::spec::{self, SpecPaths};
use support::Fixture;

fn sample_plan() -> Plan {
    Plan {
        rootfs: aisb::eval::plan::Rootfs::Host,
        memos: Vec::new(),
        build_network: Vec::new(),
        tools: Default::default(),
        config_digest: None,
        config_file: Some("/src/p/sandbox.kdl".into()),
        profile: "default".into(),
        backend: None,
        project: "/src/p".into(),
        project_access: Access::Rw,
        read_only: false,
        identity: Identity {
            uid: 1000,
            gid: 1000,
            name: "dev".into(),
            home: "/home/dev".into(),
        },
        state_dir: "/home/dev/.cache/aisb/p-abc/default".into(),
        store: "/home/dev/.cache/aisb/store".into(),
        system: vec![
            SystemPath::Bind {
                path: "/usr".into(),
            },
            SystemPath::Symlink {
                path: "/bin".into(),
                target: "usr/bin".into(),
            },
            SystemPath::Bind {
                path: "/etc/passwd".into(),
            },
        ],
        mounts: vec![
            Mount {
                target: "/home/dev".into(),
                kind: MountKind::Tmpfs {
                    size: None,
                    mode: 0o700,
                    owner: Some((1000, 1000)),
                },
                why: "home".into(),
            },
            Mount {
                target: "/tmp".into(),
                kind: MountKind::Tmpfs {
                    size: Some(1 << 20),
                    mode: 0o1777,
                    owner: None,
                },
                why: "tmp".into(),
            },
            Mount {
                target: "/src/p".into(),
                kind: MountKind::Bind {
                    source: "/src/p".into(),
                    writable: true,
                },
                why: "project".into(),
            },
            Mount {
                target: "/home/dev/.claude".into(),
                kind: MountKind::Overlay {
                    lower: "/home/dev/.claude".into(),
                    upper: "/s/upper".into(),
                    work: "/s/work".into(),
                    above: None,
                },
                why: "m".into(),
            },
            Mount {
                target: "/home/dev/.claude.json".into(),
                kind: MountKind::Copy {
                    source: "/home/dev/.claude.json".into(),
                    copy: "/s/copy/.claude.json".into(),
                },
                why: "m".into(),
            },
        ],
        masks: vec![
            Mask {
                path: "/src/p/.env".into(),
                dir: false,
                rule: "sensitive".into(),
            },
            Mask {
                path: "/src/p/node_modules".into(),
                dir: true,
                rule: "gitignored".into(),
            },
            Mask {
                path: "/elsewhere/not-mounted".into(),
                dir: false,
                rule: "block".into(),
            },
        ],
        live: None,
        protected: vec![],
        project_dirs: Default::default(),
        protect_covered: vec![],
        unprotected: vec![],
        made_for_run: vec![],
        exposures: vec![],
        kept_masked: vec![],
        scan: ScanSummary {
            git: true,
            cached: false,
            entries: 3,
            notes: vec![],
        },
        env: Env {
            vars: vec![
                ("HOME".into(), "/home/dev".into()),
                ("PATH".into(), "/usr/bin:/bin".into()),
            ],
            dropped: vec![],
        },
        network: Network {
            mode: NetMode::None,
            domains: DomainsMode::Merge,
            ignored: vec![],
            allow: vec![],
            deny: vec![],
            localhost_ports: vec![],
            transparent_ports: vec![],
        },
        process: Process {
            args: vec!["/bin/bash".into()],
            cwd: "/src/p".into(),
            shell: "/bin/bash".into(),
            hostname: "aisb".into(),
            rlimits: vec![Rlimit {
                kind: "RLIMIT_NOFILE".into(),
                soft: 1024,
                hard: 4096,
            }],
        },
        limits: Limits {
            memory: Some(1 << 30),
            cpus_milli: Some(1500),
            ..Limits::default()
        },
        tasks: vec![],
        profiles: vec![],
        credentials: vec![],
    }
}

fn paths() -> SpecPaths {
    SpecPaths {
        rootfs: "rootfs".into(),
        mask_file: "/b/masked".into(),
        cgroups_path: "/aisb/p-0123".into(),
        init: Some("/opt/aisb/bin/aisb".into()),
        terminal: false,
        proxy_dir: None,
        rootless: None,
        limits: spec::LimitsBy::Cgroup,
        mask_list: None,
    }
}

#[test]
fn spec_snapshot() {
    let spec = spec::build(&sample_plan(), &paths()).unwrap();
    insta::assert_snapshot!(spec::to_json(&spec).unwrap());
}

/// The limits reach the spec as the runtime applies them: `linux.resources` for a runtime
/// that makes the cgroup; nothing when aisb made it; the init's RLIMIT_NPROC without one.
#[test]
fn limits_by_cgroup_rlimit_or_aisb_s_own_cgroup() {
    let plan = sample_plan();
    let json = |by| {
        let spec = spec::build(
            &plan,
            &SpecPaths {
                limits: by,
                ..paths()
            },
        )
        .unwrap();
        serde_json::to_value(&spec).unwrap()
    };
    let cg = json(spec::LimitsBy::Cgroup);
    assert_eq!(
        cg["linux"]["resources"],
        serde_json::json!({
            "pids": {"limit": 4096},
            "memory": {"limit": 1u64 << 30, "swap": 1u64 << 30},
            "cpu": {"quota": 150000, "period": 100000},
        })
    );
    let nproc = "--rlimit=RLIMIT_NPROC=4096:4096";
    let has_nproc = |v: &serde_json::Value| {
        v["process"]["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == nproc)
    };
    assert!(!has_nproc(&cg));
    let own = json(spec::LimitsBy::OwnCgroup);
    assert!(own["linux"].get("resources").is_none(), "{}", own["linux"]);
    assert!(!has_nproc(&own));
    assert_eq!(own["linux"]["cgroupsPath"], "/aisb/p-0123");
    let rl = json(spec::LimitsBy::Rlimit);
    assert!(rl["linux"].get("resources").is_none());
    assert!(has_nproc(&rl), "{}", rl["process"]["args"]);
    let none = json(spec::LimitsBy::Nothing);
    assert!(none["linux"].get("resources").is_none() && !has_nproc(&none));
}

#[test]
fn host_network_has_no_network_namespace() {
    let mut plan = sample_plan();
    let has_netns = |plan: &Plan| {
        let v = serde_json::to_value(spec::build(plan, &paths()).unwrap()).unwrap();
        v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "network")
    };
    assert!(has_netns(&plan));
    plan.network.mode = NetMode::Host;
    assert!(!has_netns(&plan));
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Export a bundle for `text` in a fresh project and run `script` in it with runc.
fn run_in_runc(f: &Fixture, text: &str, script: &str) -> (String, String, i32) {
    let (loaded, errors) = f.load(text);
    errors.into_result().unwrap();
    let mut host = f.host();
    host.uid = nix::unistd::getuid().as_raw();
    host.gid = nix::unistd::getgid().as_raw();
    let req = aisb::eval::Request {
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    let plan = aisb::eval::evaluate(&loaded, &host, &req).unwrap();
    let bundle: PathBuf = f.root().join("bundle");
    let mask_file = aisb::graph::realise::realise(&plan).unwrap();
    aisb::spec::bundle::write(
        &plan,
        &bundle,
        &mask_file,
        Some(std::path::Path::new(env!("CARGO_BIN_EXE_aisb-init"))),
        false,
        None,
        None,
        aisb::spec::LimitsBy::Cgroup,
    )
    .unwrap();
    let id = format!(
        "aisb-test-{}-{}",
        std::process::id(),
        f.root()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace('.', "")
    );
    let out = Command::new("runc")
        .args([
            "--root",
            &f.root().join("runc-state").to_string_lossy(),
            "run",
            "--bundle",
        ])
        .arg(&bundle)
        .arg(&id)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runc");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

#[test]
fn bundle_runs_under_runc_with_masks_enforced() {
    if !is_root() {
        eprintln!("skipped: runc needs root here (CI runs as root)");
        return;
    }
    assert!(
        Command::new("runc").arg("--version").output().is_ok(),
        "runc is installed by scripts/setup-tests.sh"
    );
    let f = Fixture::new();
    f.write(".env", "SECRET=1");
    f.write("node_modules/pkg/index.js", "x");
    f.write("src/main.rs", "fn main() {}");
    f.write(".gitignore", "node_modules/\n");
    f.git(&["init", "-q"]);
    std::fs::create_dir_all(f.home().join(".ssh")).unwrap();
    std::fs::write(f.home().join(".ssh/id_ed25519"), "PRIVATE").unwrap();
    std::fs::create_dir_all(f.home().join(".claude")).unwrap();
    std::fs::write(f.home().join(".claude/settings.json"), "host").unwrap();
    let script = r#"
        cat .env; echo "env-read=$?"
        ls -A node_modules | wc -l | sed 's/^/nm-entries=/'
        touch node_modules/x 2>/dev/null; echo "nm-write=$?"
        cat src/main.rs >/dev/null; echo "src-read=$?"
        echo hi > src/new.txt; echo "src-write=$?"
        ls -A "$HOME" | tr '\n' ' ' | sed 's/^/home=/'; echo
        cat "$HOME/.ssh/id_ed25519" 2>/dev/null; echo "ssh-read=$?"
        echo sandbox > "$HOME/.claude/settings.json"; echo "claude-write=$?"
        cat "$HOME/.claude/settings.json"
        test -e /etc/shadow; echo "shadow=$?"
        grep -c . /proc/self/uid_map | sed 's/^/uid-map-lines=/'
        grep CapEff /proc/self/status
        grep NoNewPrivs /proc/self/status
        grep '^Seccomp:' /proc/self/status
        grep '^CapBnd' /proc/self/status
        python3 -c 'import socket; socket.socket(40, 1)' 2>/dev/null; echo "vsock=$?"
        unshare -U true 2>/dev/null; echo "userns=$?"
        cat /sys/class/net/lo/operstate 2>/dev/null | sed 's/^/lo=/'
        echo "hostname=$(cat /proc/sys/kernel/hostname)"
    "#;
    let (out, err, code) = run_in_runc(&f, "mount \"~/.claude\" access=\"overlay\"\n", script);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for expected in [
        "env-read=1",
        // A dependency directory: the host's content, written copy-on-write.
        "nm-entries=1",
        "nm-write=0",
        "src-read=0",
        "src-write=0",
        "home=.claude ",
        "ssh-read=1",
        "claude-write=0",
        "sandbox",
        "shadow=1",
        "uid-map-lines=1",
        "CapEff:\t0000000000000000",
        "NoNewPrivs:\t1",
        "hostname=aisb",
        "Seccomp:\t2",
        "CapBnd:\t0000000000000000",
        "vsock=1",
        "userns=1",
        "lo=unknown",
    ] {
        assert!(
            out.lines().any(|l| l == expected),
            "missing `{expected}` in:\n{out}\nstderr:\n{err}"
        );
    }
    assert!(
        err.contains("Permission denied"),
        "reading a masked file must fail loudly: {err}"
    );
    assert_eq!(
        std::fs::read_to_string(f.project().join("src/new.txt")).unwrap(),
        "hi\n",
        "project writes reach the host"
    );
    assert_eq!(
        std::fs::read_to_string(f.home().join(".claude/settings.json")).unwrap(),
        "host",
        "overlay writes stay inside"
    );
    assert_eq!(
        std::fs::read_to_string(f.project().join(".env")).unwrap(),
        "SECRET=1"
    );
}

#[test]
fn read_only_profile_is_read_only_under_runc() {
    if !is_root() {
        eprintln!("skipped: runc needs root here (CI runs as root)");
        return;
    }
    let f = Fixture::new();
    f.write("a.txt", "x");
    let (out, err, code) = run_in_runc(
        &f,
        "default-profile \"investigate\"\n",
        "if echo y > a.txt; then echo write=ok; else echo write=refused; fi; cat a.txt",
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.lines().any(|l| l == "write=refused") && out.lines().any(|l| l == "x"),
        "{out}\n{err}"
    );
    assert!(err.contains("Read-only file system"), "{err}");
}

fn bwrap_inputs() -> aisb_bwrap::Inputs {
    aisb_bwrap::Inputs {
        bundle: "/b".into(),
        rootfs_symlinks: vec![("/bin".into(), "usr/bin".into())],
        masked_kinds: vec![("/proc/acpi".into(), true), ("/proc/kcore".into(), false)],
        new_session: true,
        info_fd: Some(3),
        userns_block_fd: None,
        mask_file: Some("/b/masked".into()),
    }
}

#[test]
fn bwrap_argv_exact() {
    let mut plan = sample_plan();
    plan.mounts
        .retain(|m| !matches!(m.kind, MountKind::Overlay { .. }));
    let spec = spec::build(&plan, &paths()).unwrap();
    let argv = aisb_bwrap::argv(&spec, &bwrap_inputs()).unwrap();
    insta::assert_snapshot!(argv.join("\n"));
}

#[test]
fn bwrap_refuses_what_it_cannot_express() {
    // As an ordinary user: the init mounts the overlay (in a mount namespace of its own).
    let spec = spec::build(&sample_plan(), &paths()).unwrap();
    let argv = aisb_bwrap::argv(&spec, &bwrap_inputs()).unwrap();
    assert!(
        argv.iter()
            .any(|a| a.starts_with("--overlay=") && a.ends_with(":/home/dev/.claude")),
        "{argv:?}"
    );
    // A mask inside the overlay: the init's, after the overlay (bwrap's would be covered).
    let mut plan = sample_plan();
    plan.identity.uid = 0;
    plan.masks.push(Mask {
        path: "/home/dev/.claude/.credentials.json".into(),
        dir: false,
        rule: "test".into(),
    });
    let spec = spec::build(&plan, &paths()).unwrap();
    let argv = aisb_bwrap::argv(&spec, &bwrap_inputs()).unwrap();
    let overlay = argv
        .iter()
        .position(|a| a.starts_with("--overlay="))
        .unwrap();
    let mask = argv
        .iter()
        .position(|a| a == "--mask=/home/dev/.claude/.credentials.json")
        .unwrap_or_else(|| panic!("{argv:?}"));
    assert!(mask > overlay, "{argv:?}");
    assert!(
        !argv
            .windows(2)
            .any(|w| w[1] == "/home/dev/.claude/.credentials.json"),
        "bwrap itself must not mount it: {argv:?}"
    );
    // Not aisb's init: nobody could mount it.
    let mut plan = sample_plan();
    plan.identity.uid = 0;
    let mut spec = spec::build(&plan, &paths()).unwrap();
    let mut process = spec.process().clone().unwrap();
    process.set_args(Some(vec!["/bin/sh".into()]));
    spec.set_process(Some(process));
    assert!(aisb_bwrap::argv(&spec, &bwrap_inputs()).is_err());
}

/// As root, bwrap binds the layers under the staging dir and the init mounts the overlay
/// (`--overlay=…` after `__init`), with the capabilities it needs for that and no others.
#[test]
fn bwrap_lets_the_init_mount_overlays_as_root() {
    let mut plan = sample_plan();
    plan.identity.uid = 0;
    let spec = spec::build(&plan, &paths()).unwrap();
    let argv = aisb_bwrap::argv(&spec, &bwrap_inputs()).unwrap();
    let has = |seq: &[&str]| argv.windows(seq.len()).any(|w| w == seq);
    assert!(
        has(&[
            "--ro-bind",
            "/home/dev/.claude",
            "/run/aisb/overlay/0/lower"
        ]),
        "{argv:?}"
    );
    assert!(has(&["--dir", "/home/dev/.claude"]), "{argv:?}");
    let init = argv.iter().position(|a| a == "__init").unwrap();
    let overlay = argv[init + 1].clone();
    assert!(
        overlay.starts_with("--overlay=/run/aisb/overlay/0/lower:/run/aisb/overlay/0/rw/")
            && overlay.ends_with(":/home/dev/.claude"),
        "{overlay}"
    );
    let caps: Vec<&str> = argv
        .windows(2)
        .filter(|w| w[0] == "--cap-add")
        .map(|w| w[1].as_str())
        .collect();
    assert_eq!(caps, aisb_bwrap::OVERLAY_CAPS);
}

/// A layer of aisb's above the lower one (a git directory's objects without masked content):
/// the spec's `lowerdir` names it first; bwrap binds it apart and the init stacks both.
#[test]
fn an_overlay_with_a_layer_above_its_lower_keeps_both() {
    let mut plan = sample_plan();
    plan.identity.uid = 0;
    for m in &mut plan.mounts {
        if let MountKind::Overlay { above, .. } = &mut m.kind {
            *above = Some("/s/store/v-1".into());
        }
    }
    let spec = spec::build(&plan, &paths()).unwrap();
    let v = serde_json::to_value(&spec).unwrap();
    let overlay = v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["type"] == "overlay")
        .unwrap();
    assert!(
        overlay["options"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "lowerdir=/s/store/v-1:/home/dev/.claude"),
        "{overlay}"
    );
    let argv = aisb_bwrap::argv(&spec, &bwrap_inputs()).unwrap();
    let has = |seq: &[&str]| argv.windows(seq.len()).any(|w| w == seq);
    assert!(
        has(&["--ro-bind", "/s/store/v-1", "/run/aisb/overlay/0/lower-0"])
            && has(&[
                "--ro-bind",
                "/home/dev/.claude",
                "/run/aisb/overlay/0/lower"
            ]),
        "{argv:?}"
    );
    let init = argv.iter().position(|a| a == "__init").unwrap();
    assert!(
        argv[init + 1].starts_with(
            "--overlay=/run/aisb/overlay/0/lower-0:/run/aisb/overlay/0/lower:/run/aisb/overlay/0/rw/"
        ),
        "{}",
        argv[init + 1]
    );
}

/// A layer path with `:` would be read by overlayfs as two layers (its parent directory one of
/// them): refused, never split.
#[test]
fn an_overlay_layer_with_a_colon_is_refused() {
    for bad in ["/work/a:/b", "/work/a,b"] {
        let mut plan = sample_plan();
        for m in &mut plan.mounts {
            if let MountKind::Overlay { lower, .. } = &mut m.kind {
                *lower = bad.into();
            }
        }
        let e = spec::build(&plan, &paths()).unwrap_err();
        assert!(e.to_string().contains("has `:` or `,`"), "{e}");
    }
}

#[test]
fn a_block_on_a_mount_target_hides_the_mount() {
    let mut plan = sample_plan();
    plan.masks.push(Mask {
        path: "/home/dev/.claude".into(),
        dir: true,
        rule: "block \"~/.claude\"".into(),
    });
    let v = serde_json::to_value(spec::build(&plan, &paths()).unwrap()).unwrap();
    let mounts = v["mounts"].as_array().unwrap();
    let last = mounts
        .iter()
        .rposition(|m| m["destination"] == "/home/dev/.claude")
        .unwrap();
    let first = mounts
        .iter()
        .position(|m| m["destination"] == "/home/dev/.claude")
        .unwrap();
    assert!(last > first, "the mask must be mounted after the overlay");
    assert_eq!(mounts[last]["type"], "tmpfs");
    assert!(mounts[last]["options"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o == "ro"));
}

/// With a list (`SpecPaths::mask_list`), the masks are the init's: no OCI mount per mask, one
/// read-only bind of the list, the masking file bound for it, `--mask-list=` and the
/// capability to mount (which the init drops). bwrap's argv then grows by nothing per mask.
#[test]
fn the_init_mounts_the_masks_from_a_list() {
    let mut plan = sample_plan();
    plan.mounts
        .retain(|m| !matches!(m.kind, MountKind::Overlay { .. }));
    assert_eq!(
        spec::mask_list(&plan),
        b"/src/p/.env\0/src/p/node_modules\0".to_vec(),
        "visible masks only, each ended by NUL"
    );
    let listed = SpecPaths {
        mask_list: Some("/b/masks".into()),
        ..paths()
    };
    let v = serde_json::to_value(spec::build(&plan, &listed).unwrap()).unwrap();
    let mounts = v["mounts"].as_array().unwrap();
    let at = |p: &str| mounts.iter().find(|m| m["destination"] == p);
    assert!(at("/src/p/.env").is_none() && at("/src/p/node_modules").is_none());
    let list = at(aisb::vocab::MASK_LIST).expect("the list is bound");
    assert_eq!(list["source"], "/b/masks");
    assert!(list["options"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o == "ro"));
    assert_eq!(at(aisb::vocab::MASK_SOURCE).unwrap()["source"], "/b/masked");
    let args: Vec<&str> = v["process"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.contains(&"--mask-list=/run/aisb/mask-list"),
        "{args:?}"
    );
    assert!(v["process"]["capabilities"]["bounding"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "CAP_SYS_ADMIN"));
    let spec = spec::build(&plan, &listed).unwrap();
    let argv = aisb_bwrap::argv(&spec, &bwrap_inputs()).unwrap();
    assert!(!argv.iter().any(|a| a == "/src/p/.env"), "{argv:?}");
    assert!(argv.windows(2).any(|w| w == ["--cap-add", "CAP_SYS_ADMIN"]));
    // Without masks, no list and no capability.
    plan.masks.clear();
    let v = serde_json::to_value(spec::build(&plan, &listed).unwrap()).unwrap();
    assert!(!v["process"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a.as_str().unwrap().starts_with("--mask-list")));
    assert!(!v["process"]["capabilities"]["bounding"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "CAP_SYS_ADMIN"));
}
