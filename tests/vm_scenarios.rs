//! The scenarios of `vm-tests/` on this host, the same way the VM testbed runs them in each
//! kernel: every escape attempt on both backends, as root and as an ordinary user.

mod support;

use std::path::Path;
use std::process::Command;

fn results(extra_env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let (uid, gid) = support::test_user();
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .unwrap()
        .unwrap()
        .name;
    let work = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = Command::new("sh")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("vm-tests/run.sh"))
        .arg(env!("CARGO_BIN_EXE_aisb"))
        .arg(env!("CARGO_BIN_EXE_aisb-probe"))
        .arg(work.path())
        .arg("bwrap libcontainer")
        .arg(format!("root {name}:{uid}:{gid}"))
        .envs(extra_env.iter().copied())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("@@RESULT "))
        .map(|j| serde_json::from_str(j).unwrap())
        .collect()
}

fn scenarios() -> usize {
    std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("vm-tests/scenarios"))
        .unwrap()
        .count()
}

#[test]
fn every_scenario_holds_on_both_backends_for_root_and_a_user() {
    if !support::root_or_skip("the VM scenarios on this host") {
        return;
    }
    let r = results(&[]);
    assert_eq!(
        r.len(),
        scenarios() * 4,
        "one result per scenario, backend and caller"
    );
    let failed: Vec<_> = r.iter().filter(|v| v["outcome"] != "pass").collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// The harness can fail: a sandbox that leaks ~/.ssh is caught, on both backends.
#[test]
fn a_leaking_sandbox_is_caught() {
    if !support::root_or_skip("the VM scenarios on this host") {
        return;
    }
    let r = results(&[("AISB_TEST_BREAK_ISOLATION", "ssh")]);
    for backend in ["bwrap", "libcontainer"] {
        for user in ["root", "aisb-test"] {
            let leaked = r.iter().find(|v| {
                v["scenario"] == "read-ssh-key" && v["backend"] == backend && v["user"] == user
            });
            assert_eq!(
                leaked.map(|v| v["outcome"].clone()),
                Some(serde_json::json!("fail")),
                "[{backend} {user}] the leak went unnoticed: {leaked:?}"
            );
        }
    }
}
