//! The language: each node's decoding, each error class with its exact rendered diagnostic,
//! and the profile merge rules.

mod support;

use aisb::config::model::{Access, NetMode};
use aisb::eval::plan::{MountKind, Rootfs};
use std::path::Path;

use support::Fixture;

fn err(text: &str) -> String {
    let f = Fixture::new();
    f.eval(text, None).expect_err("expected an error")
}

fn err_profile(text: &str, profile: &str) -> String {
    let f = Fixture::new();
    f.eval(text, Some(profile)).expect_err("expected an error")
}

#[test]
fn example_file_is_valid_and_decodes_every_node() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.home().join(".claude")).unwrap();
    std::fs::write(f.home().join(".gitconfig"), "").unwrap();
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sandbox.kdl.example"))
        .unwrap();
    let plan = f.plan(&text, None);
    assert_eq!(
        (plan.limits.pids, plan.limits.memory, plan.limits.cpus_milli),
        (4096, Some(8 << 30), Some(2000))
    );
    assert_eq!(plan.project, f.project());
    assert_eq!(plan.project_access, Access::Rw);
    assert!(!plan.read_only);
    // mount with a target and variables, tmpfs with a size, home dirs.
    let scratch = plan
        .mounts
        .iter()
        .find(|m| m.target.ends_with("scratch"))
        .unwrap();
    assert!(matches!(
        scratch.kind,
        MountKind::Tmpfs {
            size: Some(268435456),
            ..
        }
    ));
    let claude = plan
        .mounts
        .iter()
        .find(|m| m.target == f.home().join(".claude"))
        .unwrap();
    assert!(
        matches!(&claude.kind, MountKind::Overlay { upper, .. } if upper.starts_with(f.root().join("cache/aisb")))
    );
    let gitconfig = plan
        .mounts
        .iter()
        .find(|m| m.target == f.home().join(".gitconfig"))
        .unwrap();
    assert!(matches!(
        gitconfig.kind,
        MountKind::Bind {
            writable: false,
            ..
        }
    ));
    // env: set with variables, pass, allow, secrets dropped by NAME.
    let names: Vec<&str> = plan.env.vars.iter().map(|(k, _)| k.as_str()).collect();
    assert!(names.contains(&"CI") && names.contains(&"NODE_ENV"));
    // The preset's key is brokered: not passed in, a placeholder made at start instead.
    assert!(!names.contains(&"ANTHROPIC_API_KEY"), "{names:?}");
    let brokered: Vec<(&str, &str)> = plan
        .credentials
        .iter()
        .map(|c| (c.name.as_str(), c.env.as_str()))
        .collect();
    assert!(
        brokered.contains(&("anthropic-api-key", "ANTHROPIC_API_KEY")),
        "{brokered:?}"
    );
    assert!(
        brokered.contains(&("example-api", "EXAMPLE_API_TOKEN")),
        "{brokered:?}"
    );
    assert!(!names.contains(&"OPENAI_API_KEY") && !names.contains(&"AWS_SECRET_ACCESS_KEY"));
    let cache_dir = plan
        .env
        .vars
        .iter()
        .find(|(k, _)| k == "CACHE_DIR")
        .unwrap();
    assert_eq!(cache_dir.1, format!("{}/cache/myapp", f.root().display()));
    assert_eq!(plan.identity.uid, 1000);
    assert_eq!(plan.identity.name, "dev");
    // network: allow mode with the preset's group, explicit rules, a named group, a port.
    assert_eq!(plan.network.mode, NetMode::Allow);
    for d in [
        "api.anthropic.com",
        "api.example.com",
        "*.githubusercontent.com",
        "registry.example.com:8443",
        "github.com",
    ] {
        assert!(
            plan.network.allow.iter().any(|a| a == d),
            "{d} missing from {:?}",
            plan.network.allow
        );
    }
    assert_eq!(plan.network.deny, ["gist.githubusercontent.com"]);
    assert_eq!(plan.network.localhost_ports, [5432]);
    // process
    assert_eq!(plan.process.args, ["bash", "-l"]);
    assert_eq!(plan.process.hostname, "sandbox");
    assert_eq!(plan.process.rlimits.len(), 2);
    assert_eq!(
        plan.tasks
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["lint", "test"]
    );
    assert_eq!(
        plan.tasks[1].args,
        ["/bin/sh", "-c", "cargo test --workspace"]
    );
    // profiles from the file and the built-in ones.
    for p in ["review", "deps", "investigate", "fix", "implement"] {
        assert!(plan.profiles.iter().any(|x| x == p), "{p}");
    }
    let review = f.plan(&text, Some("review"));
    assert!(review.read_only);
    assert_eq!(review.project_access, Access::Ro);
    assert!(review
        .mounts
        .iter()
        .all(|m| !matches!(m.kind, MountKind::Bind { writable: true, .. })));
}

#[test]
fn defaults_without_any_setting() {
    let f = Fixture::new();
    let plan = f.plan("", None);
    assert_eq!(plan.project_access, Access::Rw);
    assert_eq!(plan.network.mode, NetMode::None);
    let home = plan.mounts.iter().find(|m| m.target == f.home()).unwrap();
    assert!(
        matches!(
            home.kind,
            MountKind::Tmpfs {
                mode: 0o700,
                owner: Some((1000, 1000)),
                ..
            }
        ),
        "home hidden"
    );
    let names: Vec<&str> = plan.env.vars.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["HOME", "LOGNAME", "NODE_ENV", "PATH", "SHELL", "TERM", "USER"]
    );
}

#[test]
fn unknown_node_with_suggestion() {
    insta::assert_snapshot!(err("projet \".\"\n"));
}

#[test]
fn unknown_property_and_wrong_type_reported_together() {
    insta::assert_snapshot!(err(
        "mount \"/usr/share\" acess=\"ro\"\ntmpfs 12\nread-only \"yes\"\n"
    ));
}

#[test]
fn bad_values() {
    insta::assert_snapshot!(err("home \"emtpy\"\nblock \"a/[b\" \"~/x/*\"\nnetwork {\n    allow \"*\" \"*.com\" \"ok.com:99999\"\n    localhost-port 0\n}\nprocess {\n    rlimit \"nofiles\" 10\n}\n"));
}

/// Every bad `limits` value is an error at its own span with a help: a unit that does not
/// exist, zero, negative, absurdly large or small, the wrong type, an unknown key.
#[test]
fn bad_limits() {
    insta::assert_snapshot!(err("limits {\n    pids 0\n    memory \"8X\"\n    cpus -1\n    swap \"1G\"\n    disk \"lots\"\n}\nprofile \"p\" {\n    limits {\n        pids \"many\"\n        memory 0\n        cpus 5000\n        disk 1024\n    }\n}\nlimits pids=5 {\n    memory \"1K\"\n    pids 99999999\n}\n"));
}

/// Limits default to a pids limit and half the host's memory (which the runtime applies
/// where a memory cgroup can hold it); profiles change them like any scalar, and `"unlimited"` lifts a memory or CPU
/// limit a parent set.
#[test]
fn limits_default_and_merge_through_profiles() {
    let f = Fixture::new();
    let text = "limits {\n    memory \"8G\"\n    cpus 2\n}\nprofile \"small\" {\n    limits {\n        pids 256\n        memory \"512M\"\n        cpus 0.5\n    }\n}\nprofile \"free\" extends=\"small\" {\n    limits {\n        memory \"unlimited\"\n        cpus \"unlimited\"\n    }\n}\n";
    let d = f.plan("", None).limits;
    let default = aisb::eval::plan::Limits::default_memory();
    assert!(default.is_some_and(|m| m >= 1 << 30));
    assert_eq!((d.pids, d.memory, d.cpus_milli), (4096, default, None));
    assert!(d.set_at.is_empty());
    let top = f.plan(text, None).limits;
    assert_eq!(
        (top.pids, top.memory, top.cpus_milli),
        (4096, Some(8 << 30), Some(2000))
    );
    assert_eq!(
        top.set_at.get("memory").map(String::as_str),
        Some("sandbox.kdl:2")
    );
    assert!(!top.configured("pids"));
    let small = f.plan(text, Some("small")).limits;
    assert_eq!(
        (small.pids, small.memory, small.cpus_milli),
        (256, Some(512 << 20), Some(500))
    );
    assert_eq!(
        small.set_at.get("pids").map(String::as_str),
        Some("sandbox.kdl:7")
    );
    let free = f.plan(text, Some("free")).limits;
    assert_eq!((free.pids, free.memory, free.cpus_milli), (256, None, None));
}

#[test]
fn kdl_syntax_error() {
    insta::assert_snapshot!(err("network {\n    allow \"a.com\n"));
}

#[test]
fn kdl_v1_booleans_are_rejected_with_a_hint() {
    insta::assert_snapshot!(err("read-only true\n"));
}

#[test]
fn missing_arguments_and_children() {
    insta::assert_snapshot!(err(
        "mount\nproject \".\" { }\ntask \"t\" { profile \"x\" }\n"
    ));
}

#[test]
fn import_cycle() {
    let f = Fixture::new();
    f.write("a.kdl", "import \"b.kdl\"\n");
    f.write("b.kdl", "import \"a.kdl\"\n");
    let e = f.eval("import \"a.kdl\"\n", None).unwrap_err();
    // Long temp paths wrap; unwrap before redacting them.
    insta::assert_snapshot!(e
        .replace("\n  │ ", "")
        .replace(&f.project().display().to_string(), "<proj>"));
}

#[test]
fn unknown_preset_and_missing_import() {
    let f = Fixture::new();
    let e = f
        .eval("import \"preset:claud\"\nimport \"nope.kdl\"\n", None)
        .unwrap_err();
    insta::assert_snapshot!(e.replace(&f.project().display().to_string(), "<proj>"));
}

#[test]
fn extends_cycle_and_unknown_parent() {
    insta::assert_snapshot!(err_profile(
        "profile \"a\" extends=\"b\" { }\nprofile \"b\" extends=\"a\" { }\n",
        "a"
    ));
    insta::assert_snapshot!(err_profile(
        "profile \"a\" extends=\"investgate\" { }\n",
        "a"
    ));
}

#[test]
fn unknown_profile_on_the_command_line() {
    insta::assert_snapshot!(err_profile("", "investgate"));
}

#[test]
fn profile_cannot_turn_masking_off() {
    insta::assert_snapshot!(err_profile(
        "profile \"loose\" {\n    secrets { gitignored #false }\n}\n",
        "loose"
    ));
}

#[test]
fn undefined_variable_and_unknown_group() {
    insta::assert_snapshot!(err(
        "mount \"$NOPE_NOT_SET/x\"\nnetwork {\n    group \"registry\"\n}\n"
    ));
}

#[test]
fn missing_mount_source_is_an_error_unless_optional() {
    let f = Fixture::new();
    let e = f
        .eval(
            "mount \"/nonexistent/aisb\"\nmount \"/nonexistent/other\" optional=#true\n",
            None,
        )
        .unwrap_err();
    insta::assert_snapshot!(e);
}

#[test]
fn merge_rules_lists_append_scalars_override_block_stays() {
    let f = Fixture::new();
    f.write("keep.txt", "x");
    f.write("docs/internal/a.md", "x");
    f.write("notes.md", "x");
    let text = r#"
        block "notes.md"
        env { set "A" "base"; set "B" "base"; inherit "all" }
        network { allow "a.example.com" }
        process { hostname "base" }
        profile "p" {
            block "docs/internal/"
            env { set "A" "child" }
            network { allow "b.example.com" }
            process { hostname "child" }
        }
        profile "q" extends="p" {
            network "none"
        }
    "#;
    let base = f.plan(text, None);
    let p = f.plan(text, Some("p"));
    let q = f.plan(text, Some("q"));
    let get = |plan: &aisb::eval::Plan, k: &str| {
        plan.env
            .vars
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get(&base, "A").as_deref(), Some("base"));
    assert_eq!(
        get(&p, "A").as_deref(),
        Some("child"),
        "scalars (env set per name) override"
    );
    assert_eq!(
        get(&p, "B").as_deref(),
        Some("base"),
        "unrelated entries are inherited"
    );
    assert_eq!(base.network.allow, ["a.example.com"]);
    assert_eq!(
        p.network.allow,
        ["a.example.com", "b.example.com"],
        "lists append"
    );
    assert_eq!(p.process.hostname, "child");
    assert_eq!(q.network.mode, NetMode::None, "mode overrides");
    let masked = |plan: &aisb::eval::Plan| {
        plan.masks
            .iter()
            .map(|m| {
                m.path
                    .strip_prefix(f.project())
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(masked(&base), ["notes.md"]);
    assert_eq!(
        masked(&p),
        ["docs/internal", "notes.md"],
        "the child adds blocks; the parent's stay"
    );
    assert_eq!(
        masked(&q),
        ["docs/internal", "notes.md"],
        "grandchildren keep every block"
    );
}

#[test]
fn imports_merge_before_the_importer() {
    let f = Fixture::new();
    f.write("shared.kdl", "network { allow \"shared.example.com\" }\nprocess { hostname \"shared\" }\nprofile \"x\" { process { hostname \"from-import\" } }\n");
    let plan = f.plan("import \"shared.kdl\"\nprocess { hostname \"mine\" }\nnetwork { allow \"mine.example.com\" }\n", None);
    assert_eq!(plan.process.hostname, "mine");
    assert_eq!(
        plan.network.allow,
        ["mine.example.com", "shared.example.com"]
    );
    assert_eq!(
        f.plan("import \"shared.kdl\"\n", Some("x"))
            .process
            .hostname,
        "from-import"
    );
    // The importer redefines a profile: its definition wins.
    let plan = f.plan(
        "import \"shared.kdl\"\nprofile \"x\" { process { hostname \"mine\" } }\n",
        Some("x"),
    );
    assert_eq!(plan.process.hostname, "mine");
}

#[test]
fn builtin_profiles_match_seed_001() {
    let f = Fixture::new();
    let inv = f.plan("", Some("investigate"));
    assert!(inv.read_only);
    // No agent preset: nothing to allow, so no network at all.
    assert_eq!(inv.network.mode, NetMode::None);
    // With one, only that agent's API: the project's own domains are ignored (strict).
    let inv = f.plan(
        "import \"preset:claude\"\nnetwork { allow \"example.com\"; group \"github\" }\n",
        Some("investigate"),
    );
    assert!(inv.read_only);
    assert_eq!(inv.network.mode, NetMode::Allow);
    assert_eq!(
        inv.network.allow,
        [
            "api.anthropic.com",
            "console.anthropic.com",
            "statsig.anthropic.com"
        ]
    );
    let fix = f.plan("", Some("fix"));
    assert_eq!(fix.project_access, Access::Rw);
    assert!(fix.network.allow.contains(&"github.com".to_string()));
    assert!(!fix.network.allow.contains(&"pypi.org".to_string()));
    let imp = f.plan("", Some("implement"));
    for d in [
        "github.com",
        "registry.npmjs.org",
        "pypi.org",
        "files.pythonhosted.org",
    ] {
        assert!(imp.network.allow.contains(&d.to_string()), "{d}");
    }
}

#[test]
fn variables_home_project_xdg_defaults() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.home().join("data")).unwrap();
    let plan = f.plan("mount \"${AISB_TEST_UNSET:-~/data}\" \"$PROJECT/data\"\nenv { set \"C\" \"$XDG_CACHE_HOME|$XDG_CONFIG_HOME|$$HOME\" }\n", None);
    let m = plan
        .mounts
        .iter()
        .find(|m| m.target == f.project().join("data"))
        .unwrap();
    assert!(matches!(&m.kind, MountKind::Bind { source, .. } if *source == f.home().join("data")));
    let c = &plan.env.vars.iter().find(|(k, _)| k == "C").unwrap().1;
    assert_eq!(
        *c,
        format!(
            "{}/cache|{}/.config|$HOME",
            f.root().display(),
            f.home().display()
        )
    );
}

#[test]
fn fish_users_get_fish_and_their_config_read_only() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.home().join(".config/fish")).unwrap();
    let mut host = f.host();
    host.env.insert("SHELL".into(), "/usr/bin/fish".into());
    let (loaded, _) = f.load("process { shell \"/usr/bin/fish\" }\n");
    let plan = aisb::eval::evaluate(&loaded, &host, &Default::default()).unwrap();
    assert_eq!(plan.process.args, ["/usr/bin/fish"]);
    let m = plan
        .mounts
        .iter()
        .find(|m| m.target == f.home().join(".config/fish"))
        .expect("fish config mounted");
    assert!(matches!(
        m.kind,
        MountKind::Bind {
            writable: false,
            ..
        }
    ));
}

#[test]
fn project_root_may_not_be_home_or_slash() {
    let f = Fixture::new();
    let e = f.eval("project \"/\"\n", None).unwrap_err();
    assert!(e.contains("refusing to use / as the project root"), "{e}");
    let e = f.eval("project \"~\"\n", None).unwrap_err();
    assert!(e.contains("refusing to use"), "{e}");
}

#[test]
fn backend_preference() {
    let f = Fixture::new();
    assert_eq!(f.plan("", None).backend, None);
    assert_eq!(
        f.plan("backend \"bwrap\"\n", None).backend.as_deref(),
        Some("bwrap")
    );
    let p = f.plan(
        "backend \"bwrap\"\nprofile \"p\" { backend \"libcontainer\" }\n",
        Some("p"),
    );
    assert_eq!(p.backend.as_deref(), Some("libcontainer"));
    let e = f.eval("backend \"bwarp\"\n", None).unwrap_err();
    assert!(
        e.contains("unknown value `bwarp`") && e.contains("did you mean `bwrap`?"),
        "{e}"
    );
}

/// Seed 003's pass-list: only the named keys of a dotenv file the user names enter the
/// sandbox, whatever else the file holds; a key the file lacks is an error at its span.
#[test]
fn env_from_file_passes_only_the_named_keys() {
    let f = Fixture::new();
    f.write(
        ".env.agent",
        "# for the agent\nOPENAI_API_KEY=\"sk-from-file\"\nDATABASE_URL=postgres://x\n",
    );
    let plan = f.plan(
        "env {\n    from-file \".env.agent\" \"OPENAI_API_KEY\"\n}\n",
        None,
    );
    let vars: std::collections::BTreeMap<_, _> = plan.env.vars.iter().cloned().collect();
    assert_eq!(
        vars.get("OPENAI_API_KEY").map(String::as_str),
        Some("sk-from-file")
    );
    assert!(!vars.contains_key("DATABASE_URL"));
    let e = f
        .eval(
            "env {\n    from-file \".env.agent\" \"STRIPE_KEY\"\n}\n",
            None,
        )
        .unwrap_err();
    assert!(
        e.contains("`STRIPE_KEY` is not in") && e.contains("sandbox.kdl:2:"),
        "{e}"
    );
    let e = f
        .eval("env {\n    from-file \"missing.env\" \"A\"\n}\n", None)
        .unwrap_err();
    assert!(
        e.contains("cannot read") && e.contains("missing.env"),
        "{e}"
    );
}

/// A key assigned twice in the dotenv file enters with its last value, the one a shell
/// sourcing the file (and docker's env_file, python-dotenv) would see; it took the first.
#[test]
fn env_from_file_takes_a_repeated_keys_last_value() {
    let f = Fixture::new();
    f.write(".env.agent", "API_KEY=old\nexport API_KEY=\"new\"\n");
    let plan = f.plan("env {\n    from-file \".env.agent\" \"API_KEY\"\n}\n", None);
    let vars: std::collections::BTreeMap<_, _> = plan.env.vars.iter().cloned().collect();
    assert_eq!(vars.get("API_KEY").map(String::as_str), Some("new"));
}

/// The project is the sandbox's to write: a dotenv file there that is a link (or lies below a
/// directory that is one) is refused, never followed to the host file it names. Before, a
/// planted `.env.agent -> ~/.aws/credentials` handed the sandbox that file's values.
#[test]
fn env_from_file_follows_no_link_planted_in_the_project() {
    let f = Fixture::new();
    let secret = f.home().join("credentials");
    std::fs::write(&secret, "API_KEY=host-secret\n").unwrap();
    std::os::unix::fs::symlink(&secret, f.project().join(".env.agent")).unwrap();
    std::os::unix::fs::symlink(f.home(), f.project().join("conf")).unwrap();
    for file in [".env.agent", "conf/credentials"] {
        let e = f
            .eval(
                &format!("env {{\n    from-file \"{file}\" \"API_KEY\"\n}}\n"),
                None,
            )
            .unwrap_err();
        assert!(
            e.contains("cannot read")
                && e.contains("a symbolic link")
                && !e.contains("host-secret"),
            "{e}"
        );
    }
    // A file outside the project is the user's own path, read as it is.
    let plan = f.plan(
        &format!(
            "env {{\n    from-file \"{}\" \"API_KEY\"\n}}\n",
            secret.display()
        ),
        None,
    );
    let vars: std::collections::BTreeMap<_, _> = plan.env.vars.iter().cloned().collect();
    assert_eq!(vars.get("API_KEY").map(String::as_str), Some("host-secret"));
}

/// A checked-in sandbox.kdl is untrusted: blocks nested a few hundred deep made the KDL
/// parser overflow aisb's stack (an abort; found by the parse_eval fuzz target). Now an
/// error at the brace that goes too deep.
#[test]
fn deeply_nested_blocks_are_an_error_not_a_crash() {
    let f = Fixture::new();
    let text = "a{".repeat(100_000) + &"}".repeat(100_000);
    let e = f.eval(&text, None).unwrap_err();
    assert!(
        e.contains("blocks nested deeper than 32 levels") && e.contains("sandbox.kdl:1:"),
        "{}",
        &e[..e.len().min(2000)]
    );
}

/// Seed 003's network modes: how the presets' domain lists combine with the project's own.
#[test]
fn domain_modes_strict_merge_replace() {
    let f = Fixture::new();
    let text = "import \"preset:codex\"\nnetwork { allow \"example.com\" }\n";
    let with = |mode: &str| {
        f.plan(&format!("{text}network domains=\"{mode}\"\n"), None)
            .network
            .allow
    };
    assert_eq!(
        with("merge"),
        [
            "api.openai.com",
            "auth.openai.com",
            "chatgpt.com",
            "example.com"
        ]
    );
    assert_eq!(
        with("strict"),
        ["api.openai.com", "auth.openai.com", "chatgpt.com"]
    );
    assert_eq!(with("replace"), ["example.com"]);
    // Under strict a project cannot widen a shipped group by redefining its name.
    let plan = f.plan(
        "import \"preset:codex\"\ndomains \"openai\" \"evil.example\"\nnetwork domains=\"strict\"\n",
        None,
    );
    assert_eq!(
        plan.network.allow,
        ["api.openai.com", "auth.openai.com", "chatgpt.com"]
    );
    // A bad mode is an error at its span with the choices.
    let err = err("network domains=\"strictt\"\n");
    assert!(
        err.contains("unknown value `strictt`") && err.contains("strict"),
        "{err}"
    );
}

#[test]
fn xdg_sandbox_relocates_and_explains_what_it_cannot() {
    let f = Fixture::new();
    let plan = f.plan("xdg \"sandbox\"\n", None);
    let var = |n: &str| {
        plan.env
            .vars
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        var("XDG_CONFIG_HOME").unwrap(),
        f.home().join(".config").to_string_lossy()
    );
    assert!(plan
        .mounts
        .iter()
        .any(|m| m.target == f.home().join(".local/state")
            && matches!(&m.kind, MountKind::State { dir } if dir.starts_with(&plan.state_dir))));
    // A read-only home cannot get a missing mount point.
    let e = err("home \"ro\"\nxdg \"sandbox\"\n");
    assert!(
        e.contains("a read-only home cannot get it") && e.contains("mkdir -p"),
        "{e}"
    );
    let e = err("xdg \"elsewhere\"\n");
    assert!(e.contains("expected one of: home, sandbox"), "{e}");
}

/// `preset:claude` gets Claude Code's managed settings written to mirror the sandbox (seed 001).
#[test]
fn claude_managed_settings_mirror_the_sandbox() {
    let f = Fixture::new();
    std::fs::write(f.project().join(".env"), "K=v").unwrap();
    let settings = |text: &str, profile: Option<&str>| {
        let plan = f.plan(text, profile);
        let files = plan
            .mounts
            .iter()
            .find_map(|m| match &m.kind {
                MountKind::Generated { files, dir }
                    if m.target == Path::new("/etc/claude-code") =>
                {
                    assert!(dir.starts_with(&plan.store));
                    Some(files.clone())
                }
                _ => None,
            })
            .expect("a managed settings mount");
        assert_eq!(files[0].name, "managed-settings.json");
        serde_json::from_str::<serde_json::Value>(&files[0].content).unwrap()
    };
    let has = |v: &serde_json::Value, list: &str, rule: &str| {
        v["permissions"][list]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == rule)
    };
    let env = f.project().join(".env");
    let rw = settings("import \"preset:claude\"\n", None);
    assert!(
        has(&rw, "deny", &format!("Read(/{})", env.display())),
        "{rw}"
    );
    assert!(has(&rw, "deny", "Read(~/.ssh/**)"));
    assert!(has(&rw, "allow", "Bash") && has(&rw, "allow", "Edit"));
    assert!(has(&rw, "allow", "WebFetch(domain:api.anthropic.com)"));
    assert_eq!(rw["sandbox"]["enabled"], false);
    assert_eq!(
        rw["hooks"]["PreToolUse"][0]["hooks"][0]["command"],
        "/run/aisb/init agent-event claude"
    );
    let ro = settings("import \"preset:claude\"\n", Some("investigate"));
    assert!(
        has(&ro, "deny", "Edit(**)") && !has(&ro, "allow", "Edit"),
        "{ro}"
    );
    assert_eq!(
        ro["sandbox"]["network"]["allowedDomains"],
        serde_json::json!([
            "api.anthropic.com",
            "console.anthropic.com",
            "statsig.anthropic.com"
        ])
    );
    let none = settings("import \"preset:claude\"\nnetwork \"none\"\n", None);
    assert!(has(&none, "deny", "WebFetch") && has(&none, "deny", "WebSearch"));
    // Without the preset nothing is written.
    let plan = f.plan("", None);
    assert!(!plan
        .mounts
        .iter()
        .any(|m| m.target == Path::new("/etc/claude-code")));
}

#[test]
fn images_in_kdl_decode_with_their_lines_and_errors_point_at_the_node() {
    use aisb::config::instr::{Cmd, Instr};
    let f = Fixture::new();
    let plan = f.plan(
        "image \"dev\" {\n    from \"oci:base:1\"\n    arg \"USER_ID\" \"1000\"\n    run \"echo $USER_ID\"\n    run \"/bin/echo\" \"exec form\"\n    copy \"a\" \"b\" \"/dst/\" chown=\"1000:1000\" chmod=\"0640\"\n    env \"K\" \"V\"\n    workdir \"/w\"\n    user \"1000\"\n    shell \"/bin/bash\" \"-c\"\n}\nrootfs image=\"dev\"\n",
        None,
    );
    let Rootfs::Image { name, steps } = &plan.rootfs else {
        panic!("{:?}", plan.rootfs)
    };
    assert_eq!(name, "dev");
    assert_eq!(steps.len(), 9);
    assert_eq!(steps[0].instr, Instr::From("oci:base:1".into()));
    assert_eq!(
        steps[2].instr,
        Instr::Run(Cmd::Shell("echo $USER_ID".into()))
    );
    assert_eq!(steps[2].at, "sandbox.kdl:4");
    assert_eq!(
        steps[3].instr,
        Instr::Run(Cmd::Exec(vec!["/bin/echo".into(), "exec form".into()]))
    );
    assert_eq!(
        steps[4].instr,
        Instr::Copy {
            srcs: vec!["a".into(), "b".into()],
            dest: "/dst/".into(),
            chown: Some("1000:1000".into()),
            chmod: Some(0o640),
            add: false
        }
    );
    assert!(
        matches!(f.plan("rootfs dockerfile=\"docker/Dockerfile\"\n", None).rootfs, Rootfs::Dockerfile { ref path } if path.ends_with("docker/Dockerfile"))
    );
    assert_eq!(f.plan("rootfs \"host\"\n", None).rootfs, Rootfs::Host);

    for (text, want) in [
        ("image \"x\" {\n    run \"true\"\n}\n", "has no `from`"),
        (
            "image \"x\" {\n    from \"a\"\n    from \"b\"\n}\n",
            "one `from`",
        ),
        (
            "image \"x\" {\n    from \"a\"\n    expose \"80\"\n}\n",
            "expose",
        ),
        (
            "image \"x\" {\n    from \"a\"\n    copy \"a\" \"b\" chmod=\"9\"\n}\n",
            "not an octal mode",
        ),
        ("rootfs image=\"nope\"\n", "no image named `nope`"),
        ("rootfs dockerfile=\"D\" image=\"x\"\n", "exactly one of"),
        ("rootfs \"guest\"\n", "exactly one of"),
        (
            "rootfs dockerfile=\"D\" {\n    network \"host\"\n}\n",
            "cannot include the host's network",
        ),
        (
            "rootfs dockerfile=\"D\" {\n    network { localhost-port 5432; }\n}\n",
            "cannot include the host's loopback ports",
        ),
        (
            "rootfs dockerfile=\"D\" {\n    network { deny \"a.com\"; }\n}\n",
            "cannot include deny rules",
        ),
        (
            "rootfs dockerfile=\"D\" {\n    network { group \"gihub\"; }\n}\n",
            "did you mean `github`?",
        ),
        ("rootfs dockerfile=\"D\" {\n    mount \"/x\"\n}\n", "mount"),
        (
            "rootfs from=\"oci:base:1\" {\n    network \"none\"\n}\n",
            "nothing is built here",
        ),
        (
            "rootfs \"host\" {\n    network \"none\"\n}\n",
            "nothing is built here",
        ),
    ] {
        let e = err(text);
        assert!(e.contains(want), "{text}: {e}");
        assert!(e.contains("sandbox.kdl:"), "no location: {e}");
    }
}

/// What an image's RUN steps may reach: the package registries and distributions' archives
/// unless `rootfs … { network … }` says otherwise; only a widening is a loosening to trust.
#[test]
fn build_steps_network_defaults_to_the_registries_and_is_set_under_rootfs() {
    let f = Fixture::new();
    let default = f.plan("rootfs dockerfile=\"D\"\n", None);
    for d in [
        "registry.npmjs.org",
        "pypi.org",
        "deb.debian.org",
        "security.debian.org",
    ] {
        assert!(
            default.build_network.iter().any(|r| r == d),
            "{d}: {:?}",
            default.build_network
        );
    }
    assert!(!default.build_network.iter().any(|r| r == "github.com"));
    assert!(aisb::trust::loosenings(&default).is_empty());

    let none = f.plan("rootfs dockerfile=\"D\" {\n    network \"none\"\n}\n", None);
    assert!(none.build_network.is_empty());
    assert!(aisb::trust::loosenings(&none).is_empty());

    let wide = f.plan(
        "domains \"mine\" \"git.example.org\"\nrootfs dockerfile=\"D\" {\n    network { group \"github\" \"mine\"; allow \"*.Example.COM\"; }\n}\n",
        None,
    );
    for d in ["github.com", "git.example.org", "*.example.com"] {
        assert!(
            wide.build_network.iter().any(|r| r == d),
            "{d}: {:?}",
            wide.build_network
        );
    }
    assert!(
        !wide.build_network.iter().any(|r| r == "pypi.org"),
        "a build network is exactly what it says"
    );
    let l = aisb::trust::loosenings(&wide);
    assert!(
        l.iter()
            .any(|l| l.contains("image build steps reach") && l.contains("github.com")),
        "{l:?}"
    );
    // The sandbox's own network is not the build's.
    assert!(wide.network.allow.is_empty());
}

/// Issue 23: `tools` rules carry where they were written; profiles append to both lists, so a
/// child adds denials and never loses one; a repeated rule is cited where it was first said.
#[test]
fn tool_rules_merge_through_profiles_and_keep_their_place() {
    let f = Fixture::new();
    let text = "tools {\n    deny \"Write\"\n}\nprofile \"look\" {\n    tools {\n        deny \"Bash\" \"Write\"\n        allow \"Read\"\n    }\n}\nprofile \"looser\" extends=\"look\" {\n    tools {\n        allow \"Write\"\n    }\n}\n";
    let rules = |p: &aisb::tools::Policy| {
        (
            p.allow
                .iter()
                .map(|r| format!("{} {}", r.rule, r.at))
                .collect::<Vec<_>>(),
            p.deny
                .iter()
                .map(|r| format!("{} {}", r.rule, r.at))
                .collect::<Vec<_>>(),
        )
    };
    assert!(f.plan("", None).tools.is_empty());
    let top = f.plan(text, None).tools;
    assert_eq!(
        rules(&top),
        (vec![], vec!["Write sandbox.kdl:2".to_string()])
    );
    let looser = f.plan(text, Some("looser")).tools;
    assert_eq!(
        rules(&looser),
        (
            vec!["Read sandbox.kdl:7".into(), "Write sandbox.kdl:12".into()],
            vec!["Write sandbox.kdl:2".into(), "Bash sandbox.kdl:6".into()]
        )
    );
    // Allowing it again does not lift the denial.
    let call = aisb::tools::Call {
        agent: "claude",
        tool: "Write",
        input: &serde_json::json!({"file_path": "/p/x"}),
        cwd: Path::new("/p"),
        home: Path::new("/home/u"),
    };
    let refusal = looser.decide(&call).expect("Write stays denied");
    assert_eq!(
        (refusal.rule.as_str(), refusal.at.as_str()),
        ("deny \"Write\"", "sandbox.kdl:2")
    );
}

/// A rule that is not one is an error at its span, saying what is wrong and what a rule is.
#[test]
fn bad_tool_rules() {
    insta::assert_snapshot!(err("tools {\n    deny \"Bash(git push\" \"Read()\" 3\n    allow \"two words\"\n    block \"Write\"\n}\ntools \"x\"\n"));
}

/// Issue 23: the policy as each agent's own layer says it, in the formats the installed
/// clients read (checked against Claude Code 2.1, Gemini CLI 0.61, OpenCode 1.18, Codex 0.169).
#[test]
fn tool_policy_is_mirrored_into_each_agents_layer() {
    let f = Fixture::new();
    let text = "import \"preset:claude\"\nimport \"preset:gemini\"\nimport \"preset:opencode\"\nimport \"preset:codex\"\ntools {\n    allow \"Read\" \"Bash\" \"Write\"\n    deny \"Write\" \"Bash(git push:*)\" \"Read(//etc/**)\"\n}\n";
    let plan = f.plan(text, None);
    let file = |dir: &str| -> String {
        let m = plan
            .mounts
            .iter()
            .find(|m| m.target == Path::new(dir))
            .unwrap_or_else(|| panic!("no {dir}"));
        match &m.kind {
            MountKind::Generated { files, .. } => files[0].content.clone(),
            other => panic!("{dir}: {other:?}"),
        }
    };
    let json = |dir: &str| serde_json::from_str::<serde_json::Value>(&file(dir)).unwrap();
    let claude = json("/etc/claude-code");
    let allow = claude["permissions"]["allow"].as_array().unwrap();
    // Write is allowed and denied: the sandbox's own pre-approval of it is dropped.
    for a in ["\"Read\"", "\"Bash\""] {
        assert!(allow.iter().any(|v| v.to_string() == a), "{allow:?}");
    }
    assert!(
        !allow.iter().any(|v| v == "Edit"),
        "not in the allow list: {allow:?}"
    );
    // Denials are the hook's (Claude Code's own deny would refuse before it, unlogged).
    let deny = claude["permissions"]["deny"].as_array().unwrap();
    assert!(!deny.iter().any(|v| v == "Write"), "{deny:?}");
    assert_eq!(
        claude["hooks"]["PreToolUse"][0]["hooks"][0]["command"],
        "/run/aisb/init agent-event claude"
    );
    let gemini = json("/etc/gemini-cli");
    assert_eq!(
        gemini["tools"]["exclude"],
        serde_json::json!(["write_file", "run_shell_command(git push)"])
    );
    assert_eq!(
        gemini["tools"]["core"],
        serde_json::json!([
            "read_file",
            "read_many_files",
            "run_shell_command",
            "write_file"
        ])
    );
    assert_eq!(
        gemini["hooks"]["BeforeTool"][0]["hooks"][0],
        serde_json::json!({"type": "command", "command": "/run/aisb/init agent-event gemini", "timeout": 5000})
    );
    // After each call, what the sandbox refused during it (issue 32's feedback).
    assert_eq!(
        gemini["hooks"]["AfterTool"][0]["hooks"][0],
        serde_json::json!({"type": "command", "command": "/run/aisb/init agent-result gemini", "timeout": 5000})
    );
    for event in ["PostToolUse", "PostToolUseFailure", "PermissionDenied"] {
        assert_eq!(
            claude["hooks"][event][0]["hooks"][0]["command"], "/run/aisb/init agent-result claude",
            "{event}"
        );
    }
    assert_eq!(
        json("/etc/opencode")["permission"],
        serde_json::json!({
            "bash": {"*": "allow", "git push *": "deny"},
            "edit": "deny",
            "read": "allow",
            "webfetch": "deny",
            "websearch": "deny",
            "glob": "deny",
            "grep": "deny",
            "list": "deny",
        })
    );
    assert_eq!(
        file("/etc/codex"),
        "allowed_web_search_modes = [\"disabled\"]\n"
    );
    let policy: aisb::tools::Policy = serde_json::from_str(&file("/etc/aisb")).unwrap();
    assert_eq!(policy.deny.len(), 3);
    assert_eq!(policy.deny[2].at, "sandbox.kdl:7");
}

/// A `credential` says everything it needs, at its span: what is missing, a proxy to add it, a
/// host the network allows, a header that is one, exactly one source.
#[test]
fn credentials_are_checked_where_they_are_written() {
    let net = "network {\n    allow \"api.example.com\"\n}\n";
    let ok = "credential \"k\" env=\"K\" {\n    from env=\"K\"\n    hosts \"api.example.com\"\n    header \"x-api-key\"\n}\n";
    let f = Fixture::new();
    let plan = f.plan(&format!("{net}{ok}"), None);
    assert_eq!(plan.credentials.len(), 1);
    assert_eq!(plan.credentials[0].hosts, ["api.example.com"]);
    // No proxy: nothing brokered, and the variables stay out even when passed.
    let plan = f.plan(&format!("env {{\n    pass \"K\"\n}}\n{ok}"), None);
    assert!(plan.credentials.is_empty());
    assert!(!plan.env.vars.iter().any(|(k, _)| k == "K"));
    // A host the network does not allow (a profile narrowing it) is never added to.
    let narrowed = ok.replace("api.example.com", "other.example.com");
    let plan = f.plan(&format!("{net}{narrowed}"), None);
    assert!(
        plan.credentials[0].hosts.is_empty(),
        "{:?}",
        plan.credentials
    );
    for (text, want) in [
        (
            format!("{net}credential \"k\" env=\"K\" {{\n    from env=\"K\"\n}}\n"),
            "does not say hosts",
        ),
        (
            format!("{net}{}", ok.replace("x-api-key", "x-api\\nkey")),
            "control character",
        ),
        (
            format!("{net}{}", ok.replace("x-api-key", "x api key")),
            "not a header",
        ),
        (
            format!("{net}{}", ok.replace("x-api-key", "Host")),
            "not a header",
        ),
        (
            format!(
                "{net}{}",
                ok.replace("from env=\"K\"", "from env=\"K\" file=\"/k\"")
            ),
            "exactly one of",
        ),
        (
            format!(
                "{net}{}",
                ok.replace("api.example.com\"", "*.example.com\"")
            ),
            "is not a host name",
        ),
        (
            format!("{net}{}", ok.replace("env=\"K\" {", "env=\"1K\" {")),
            "not a valid variable name",
        ),
        (
            format!("{net}{ok}{}", ok.replace("\"k\"", "\"j\"")),
            "two credentials",
        ),
    ] {
        let e = err(&text);
        assert!(e.contains(want), "{text}\n{e}");
    }
}
