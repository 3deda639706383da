//! `aisb export`: what other runtimes get. The seccomp profile (`aisb export seccomp`) must
//! refuse, under a real OCI runtime (runc, through libseccomp), exactly what aisb's init refuses:
//! each attempt runs three times in the same runc bundle — under aisb's init (its own filter),
//! with the init left out and the exported profile as `linux.seccomp`, and with neither (so the
//! comparison cannot pass because nothing was ever possible).

mod support;

use std::path::Path;
use std::process::Command;

use support::Fixture;

const PROBES: &[&str] = &[
    "io-uring",
    "pidfd-getfd",
    "personality",
    "personality-query",
    "memfd-secret",
    "netlink-audit",
    "netlink-route",
    "vsock",
    "keyctl",
    "bpf",
    "userns",
    "mountns",
    "mount",
];

/// Runs the probes in `bundle` with runc; `name outcome-line` per probe.
fn run_probes(bundle: &Path, state: &Path, id: &str) -> Vec<(String, String)> {
    let out = Command::new("runc")
        .arg("--root")
        .arg(state)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runc");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "runc failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("@@"))
        .map(|l| {
            let (name, rest) = l.split_once(' ').unwrap();
            (name.to_string(), rest.trim().to_string())
        })
        .collect()
}

#[test]
fn exported_seccomp_profile_refuses_what_the_init_refuses_under_runc() {
    if !support::root_or_skip("the runc seccomp comparison") {
        return;
    }
    if !support::tool_or_skip("runc", "the runc seccomp comparison") {
        return;
    }
    let f = Fixture::new();
    let probe = f.project().join("aisb-probe");
    std::fs::copy(env!("CARGO_BIN_EXE_aisb-probe"), &probe).unwrap();
    let script = format!(
        "for p in {}; do out=$({} $p 2>&1); echo \"@@$p $? $out\"; done",
        PROBES.join(" "),
        probe.display()
    );
    let (loaded, errors) = f.load("");
    errors.into_result().unwrap();
    let mut host = f.host();
    host.uid = 0;
    host.gid = 0;
    let req = aisb::eval::Request {
        command: vec!["/bin/sh".into(), "-c".into(), script.clone()],
        ..Default::default()
    };
    let plan = aisb::eval::evaluate(&loaded, &host, &req).unwrap();
    let bundle = f.root().join("bundle");
    let mask_file = aisb::graph::realise::realise(&plan).unwrap();
    aisb::spec::bundle::write(
        &plan,
        &bundle,
        &mask_file,
        Some(Path::new(env!("CARGO_BIN_EXE_aisb-init"))),
        false,
        None,
        None,
        aisb::spec::LimitsBy::Cgroup,
    )
    .unwrap();
    let config_path = bundle.join("config.json");
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    let args: Vec<String> = original["process"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let at = args
        .iter()
        .position(|a| a == "/bin/sh")
        .expect("the workload follows the init's own arguments");
    assert!(at > 0, "the init runs first: {args:?}");
    let state = f.root().join("runc-state");
    let id = |what: &str| format!("aisb-export-{}-{what}", std::process::id());

    let init = run_probes(&bundle, &state, &id("init"));

    let profile = Command::new(env!("CARGO_BIN_EXE_aisb"))
        .args(["export", "seccomp"])
        .output()
        .unwrap();
    assert!(profile.status.success());
    let profile: serde_json::Value = serde_json::from_slice(&profile.stdout).unwrap();
    let mut direct = original.clone();
    direct["process"]["args"] = serde_json::json!(args[at..]);
    let mut exported = direct.clone();
    exported["linux"]["seccomp"] = profile;

    std::fs::write(&config_path, serde_json::to_vec(&exported).unwrap()).unwrap();
    let with_profile = run_probes(&bundle, &state, &id("profile"));
    std::fs::write(&config_path, serde_json::to_vec(&direct).unwrap()).unwrap();
    let without = run_probes(&bundle, &state, &id("none"));

    assert_eq!(init.len(), PROBES.len(), "{init:?}");
    assert_eq!(
        with_profile, init,
        "the exported profile answers differently from the init's filter"
    );
    // The comparison proves something: without any filter, as root in the container, most of
    // these attempts succeed.
    let succeeded: Vec<&str> = without
        .iter()
        .filter(|(_, r)| r == "0" || r.starts_with("0 "))
        .map(|(n, _)| n.as_str())
        .collect();
    for must in [
        "io-uring",
        "personality",
        "userns",
        "vsock",
        "keyctl",
        "netlink-audit",
    ] {
        assert!(
            succeeded.contains(&must),
            "`{must}` should succeed with no filter at all: {without:?}"
        );
    }
    let query = init.iter().find(|(n, _)| n == "personality-query").unwrap();
    assert!(
        query.1.starts_with("0 "),
        "the persona query stays allowed: {query:?}"
    );
}
