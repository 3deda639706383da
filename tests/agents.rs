//! Real agent clients inside their presets (installed by scripts/setup-tests.sh from npm): they start,
//! read and write their config directories, and nothing they write reaches the host.

use std::path::Path;
use std::process::Command;

mod support;

use support::Out;

fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Every path below `dir` with its content (files) or kind, for before/after comparisons.
fn tree(dir: &Path) -> Vec<(String, String)> {
    walkdir::WalkDir::new(dir)
        .sort_by_file_name()
        .into_iter()
        .flatten()
        .map(|e| {
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            let what = if e.file_type().is_file() {
                std::fs::read_to_string(e.path()).unwrap_or_else(|_| "<binary>".into())
            } else {
                format!("{:?}", e.file_type())
            };
            (rel, what)
        })
        .collect()
}

/// The scripted model server (`tests/agents/mock_llm.py`) on a free loopback port, killed on
/// drop. Each request it served is a JSON line in `log`.
struct Mock {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Mock {
    fn start(dir: &Path, script: &[&str]) -> Mock {
        Mock::start_raw(dir, &serde_json::to_string(script).unwrap())
    }
    /// `script`: the JSON list of steps (commands, or `{"tool": …, "input": …}`).
    fn start_raw(dir: &Path, script: &str) -> Mock {
        Mock::start_with(dir, script, &[])
    }
    /// [`Mock::start`] over HTTPS with a certificate for every name of the agent presets'
    /// domains, from a CA of the test's own; its certificate is at `dir/mock-ca.pem`.
    fn start_tls(dir: &Path, script: &[&str]) -> Mock {
        let names: Vec<String> = aisb::eval::BUILTIN_GROUPS
            .iter()
            .filter(|(g, _)| ["anthropic", "openai", "google"].contains(g))
            .flat_map(|(_, domains)| domains.iter().map(|d| d.to_string()))
            .collect();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "aisb test model API CA");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = p.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        std::fs::write(dir.join("mock-ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.join("mock-cert.pem"), leaf.pem()).unwrap();
        std::fs::write(dir.join("mock-key.pem"), key.serialize_pem()).unwrap();
        let (cert, key) = (dir.join("mock-cert.pem"), dir.join("mock-key.pem"));
        Mock::start_with(
            dir,
            &serde_json::to_string(script).unwrap(),
            &[cert.as_path(), key.as_path()],
        )
    }
    fn start_with(dir: &Path, script: &str, tls: &[&Path]) -> Mock {
        let (port_file, log) = (dir.join("mock.port"), dir.join("mock.jsonl"));
        let _ = std::fs::remove_file(&port_file);
        let _ = std::fs::remove_file(&log);
        let child = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/agents/mock_llm.py"
            ))
            .arg(&port_file)
            .arg(&log)
            .arg(script)
            .args(tls)
            .spawn()
            .expect("python3");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break p;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the mock server did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        Mock { child, port, log }
    }
    /// `AISB_PROXY_PIN` sending every domain the agent presets allow to this server: no
    /// request of a test ever leaves the machine, whatever a client decides to call.
    fn pins(&self) -> String {
        aisb::eval::BUILTIN_GROUPS
            .iter()
            .filter(|(g, _)| ["anthropic", "openai", "google"].contains(g))
            .flat_map(|(_, domains)| domains.iter())
            .map(|d| format!("{d}=127.0.0.1:{}", self.port))
            .collect::<Vec<_>>()
            .join(",")
    }
    fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn needs(tool: &str) -> bool {
    if !support::root_or_skip("the agent suite") {
        return false;
    }
    if !installed(tool) {
        // CI runs scripts/setup-tests.sh, which installs them: there, missing is a failure.
        assert!(
            std::env::var_os("CI").is_none(),
            "{tool} is not installed: scripts/setup-tests.sh should have installed it"
        );
        eprintln!("skipped: {tool} is not installed (scripts/setup-tests.sh installs it)");
        return false;
    }
    true
}

/// A project with `sandbox.kdl` = `config` and a home holding an SSH key, in `t`.
fn project(t: &Path, config: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (home, proj) = (t.join("home"), t.join("proj"));
    for d in [home.join(".ssh"), home.join(".claude"), proj.clone()] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY MATERIAL\n").unwrap();
    std::fs::write(home.join(".claude.json"), "{}\n").unwrap();
    std::fs::write(proj.join("sandbox.kdl"), config).unwrap();
    std::fs::write(proj.join("README"), "hello\n").unwrap();
    support::git_in(&proj, &["init", "-q"]);
    support::git_in(&proj, &["add", "-A"]);
    support::git_in(&proj, &["commit", "-qm", "init"]);
    (home, proj)
}

fn aisb(t: &Path, home: &Path, proj: &Path) -> Command {
    aisb_at(Path::new(env!("CARGO_BIN_EXE_aisb")), t, home, proj)
}

/// [`aisb`] as root (`user` None) or as that (uid, gid), from a copy of the binary the user
/// can run (`t` handed to them).
fn aisb_as(user: Option<(u32, u32)>, t: &Path, home: &Path, proj: &Path) -> Command {
    let Some((uid, gid)) = user else {
        return aisb(t, home, proj);
    };
    let exe = support::hand_to_user(t, uid, gid);
    let mut c = aisb_at(&exe, t, home, proj);
    std::os::unix::process::CommandExt::uid(&mut c, uid);
    std::os::unix::process::CommandExt::gid(&mut c, gid);
    c
}

/// [`aisb`] from the binary `exe` (a copy an ordinary user can run).
fn aisb_at(exe: &Path, t: &Path, home: &Path, proj: &Path) -> Command {
    let mut c = Command::new(exe);
    c.current_dir(proj)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("XDG_CACHE_HOME", t.join("cache"))
        .env("XDG_CONFIG_HOME", t.join("config"))
        .stdin(std::process::Stdio::null());
    c
}

fn audit(t: &Path, home: &Path, proj: &Path) -> Vec<serde_json::Value> {
    let o = Out::from(
        aisb(t, home, proj)
            .args(["audit", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Seed 001's attack: a (scripted) model tells Claude Code, in the `investigate` profile, to
/// read the SSH key and to fetch from a host that is not allowed. Both fail, whether Claude
/// Code's own permission layer (aisb's managed settings) stops the first or, with that layer
/// bypassed, the sandbox does; the audit log has both attempts and the refused connection.
#[test]
fn claude_investigate_cannot_read_the_ssh_key_or_reach_other_hosts() {
    if !needs("claude") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (home, proj) = project(t.path(), "import \"preset:claude\"\n");
    // With its permission layer bypassed, Claude Code still applies the managed deny rules
    // to a `cat` it can parse; a read it cannot see through (python) then meets the sandbox.
    let sneaky = "python3 -c \"print(open('/'.join(['~', '.ssh', 'id_ed25519']).replace('~', __import__('os').environ['HOME'])).read())\"";
    for bypass in [false, true] {
        let read = if bypass {
            sneaky
        } else {
            "cat ~/.ssh/id_ed25519"
        };
        let mock = Mock::start(t.path(), &[read, "curl -sS https://blocked.test/x"]);
        let mut args = vec![
            "--trust",
            "run",
            "--backend",
            "libcontainer",
            "--profile",
            "investigate",
            "--",
            "claude",
            "-p",
            "do the task",
            "--output-format",
            "json",
        ];
        if bypass {
            args.push("--dangerously-skip-permissions");
        }
        let out = Out::from(
            aisb(t.path(), &home, &proj)
                .args(&args)
                .env("ANTHROPIC_API_KEY", "sk-ant-test")
                .env("ANTHROPIC_BASE_URL", "http://api.anthropic.com")
                .env("AISB_PROXY_PIN", mock.pins())
                .output()
                .unwrap(),
        );
        let tag = if bypass {
            "[permissions bypassed]"
        } else {
            "[managed settings]"
        };
        assert_eq!(out.code, 0, "{tag} {}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("MOCK-DONE"), "{tag} {}", out.stdout);
        assert!(!out.stdout.contains("PRIVATE KEY"), "{tag} {}", out.stdout);
        // What the client sent back to the model for the two commands.
        let results = mock
            .requests()
            .iter()
            .filter_map(|r| r["tool_results"].as_array().cloned())
            .max_by_key(Vec::len)
            .unwrap_or_default();
        assert_eq!(results.len(), 2, "{tag} {results:?}");
        for r in &results {
            assert_eq!(r["is_error"], true, "{tag} {results:?}");
            assert!(
                !r["content"].as_str().unwrap_or("").contains("PRIVATE"),
                "{tag}"
            );
        }
        let text = |i: usize| results[i]["content"].as_str().unwrap_or("").to_string();
        if bypass {
            // The read ran, inside: the sandbox's home has no ~/.ssh.
            assert!(text(0).contains("No such file"), "{tag} {}", text(0));
        } else {
            // Claude Code's layer, told by aisb's managed settings, refused to run it.
            assert!(text(0).contains("denied"), "{tag} {}", text(0));
        }
        assert!(text(1).contains("403"), "{tag} {}", text(1));
        // The model was reached through the proxy by the preset's own rule.
        assert!(mock
            .requests()
            .iter()
            .any(|r| r["host"] == "api.anthropic.com"
                && r["path"].as_str().unwrap_or("").starts_with("/v1/messages")));
    }
    let events = audit(t.path(), &home, &proj);
    let agent = |cmd: &str| {
        events
            .iter()
            .filter(|e| e["event"] == "agent" && e["tool"] == "Bash" && e["input"] == cmd)
            .count()
    };
    assert_eq!(agent("cat ~/.ssh/id_ed25519"), 1, "{events:#?}");
    assert_eq!(agent(sneaky), 1, "{events:#?}");
    assert_eq!(agent("curl -sS https://blocked.test/x"), 2, "{events:#?}");
    let blocked = events
        .iter()
        .filter(|e| e["event"] == "net" && e["action"] == "block" && e["host"] == "blocked.test")
        .count();
    assert_eq!(blocked, 2, "{events:#?}");
    assert!(events.iter().any(|e| e["event"] == "net"
        && e["action"] == "allow"
        && e["host"] == "api.anthropic.com"
        && e["rule"] == "allow \"api.anthropic.com\""));
}

/// One real client in its preset: where its config lives, what it needs to find the mock.
struct Client {
    preset: &'static str,
    /// Config files written in the home before the run (path, content).
    home: &'static [(&'static str, &'static str)],
    /// The config directories and files the preset mounts (compared before and after).
    config: &'static [&'static str],
    /// The API host, pinned to the mock server.
    api: &'static str,
    env: &'static [(&'static str, &'static str)],
    /// One non-interactive request to the model; it finds the mock through its config.
    ask: &'static str,
}

const CLIENTS: &[Client] = &[
    Client {
        preset: "claude",
        home: &[
            (".claude/settings.json", "{\"env\": {\"ANTHROPIC_BASE_URL\": \"http://api.anthropic.com\"}}\n"),
            (".claude.json", "{}\n"),
        ],
        config: &[".claude", ".claude.json"],
        api: "api.anthropic.com",
        env: &[("ANTHROPIC_API_KEY", "sk-ant-test")],
        ask: "claude -p 'say hi'",
    },
    Client {
        preset: "codex",
        home: &[(
            ".codex/config.toml",
            "model = \"mock\"\nmodel_provider = \"mock\"\n[model_providers.mock]\nname = \"mock\"\nbase_url = \"http://api.openai.com/v1\"\nenv_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\n",
        )],
        config: &[".codex"],
        api: "api.openai.com",
        env: &[("OPENAI_API_KEY", "sk-test")],
        ask: "codex exec --skip-git-repo-check 'say hi'",
    },
    Client {
        preset: "aider",
        home: &[
            (
                ".aider.conf.yml",
                "model: openai/gpt-4o\nopenai-api-base: http://api.openai.com/v1\ncheck-update: false\nanalytics-disable: true\nshow-model-warnings: false\n",
            ),
            (".aider/keep", "host\n"),
        ],
        config: &[".aider", ".aider.conf.yml"],
        api: "api.openai.com",
        env: &[("OPENAI_API_KEY", "sk-test")],
        ask: "aider --message 'say hi' --yes-always --no-git --no-pretty --no-stream",
    },
    Client {
        preset: "opencode",
        home: &[
            (
                ".config/opencode/opencode.json",
                "{\"provider\": {\"openai\": {\"options\": {\"baseURL\": \"http://api.openai.com/v1\"}}}, \"model\": \"openai/gpt-4o\", \"autoupdate\": false}\n",
            ),
            (".local/share/opencode/keep", "host\n"),
        ],
        config: &[".config/opencode", ".local/share/opencode"],
        api: "api.openai.com",
        env: &[("OPENAI_API_KEY", "sk-test")],
        ask: "opencode run 'say hi'",
    },
    Client {
        preset: "gemini",
        home: &[(
            ".gemini/settings.json",
            "{\"security\": {\"auth\": {\"selectedType\": \"gemini-api-key\"}}}\n",
        )],
        config: &[".gemini"],
        api: "generativelanguage.googleapis.com",
        env: &[
            ("GEMINI_API_KEY", "test"),
            ("GOOGLE_GEMINI_BASE_URL", "http://generativelanguage.googleapis.com"),
        ],
        ask: "gemini --skip-trust -m gemini-2.5-flash -p 'say hi'",
    },
];

/// Issue 7's clients, each installed from its package (scripts/setup-tests.sh): inside its preset it
/// starts, reads its config dir (which points it at the mock model), gets an answer through the
/// proxy by the preset's own rule, writes to its config dir without any of it reaching the
/// host, and cannot reach a host its preset does not list; the audit log shows both decisions.
#[test]
fn every_agent_client_works_in_its_preset_and_nothing_leaks() {
    if !CLIENTS.iter().all(|c| needs(c.preset)) {
        return;
    }
    for (c, backend) in CLIENTS
        .iter()
        .flat_map(|c| ["libcontainer", "bwrap"].map(|b| (c, b)))
    {
        let t = tempfile::tempdir().unwrap();
        let (home, proj) = project(t.path(), &format!("import \"preset:{}\"\n", c.preset));
        for (rel, content) in c.home {
            let p = home.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        let before: Vec<_> = c.config.iter().map(|d| tree(&home.join(d))).collect();
        let mock = Mock::start(t.path(), &[]);
        let first = c.config[0];
        let script = format!(
            "{tool} --version >/dev/null 2>&1 && echo version=ok; \
             timeout 90 {ask} </dev/null > /tmp/answer 2>&1; \
             grep -q MOCK-DONE /tmp/answer && echo answer=ok || cat /tmp/answer; \
             echo inside > ~/{first}/written-inside 2>/dev/null || echo inside > ~/{first}; \
             cat ~/{first}/written-inside 2>/dev/null || cat ~/{first}; \
             curl -sS -o /dev/null https://blocked.test/ 2>/dev/null; echo blocked=$?",
            tool = c.preset,
            ask = c.ask,
        );
        let mut cmd = aisb(t.path(), &home, &proj);
        cmd.args([
            "--trust",
            "run",
            "--backend",
            backend,
            "--",
            "/bin/sh",
            "-c",
            &script,
        ])
        .env("AISB_PROXY_PIN", mock.pins());
        for (k, v) in c.env {
            cmd.env(k, v);
        }
        let out = Out::from(cmd.output().unwrap());
        let tag = format!("[{} {backend}]", c.preset);
        assert_eq!(out.code, 0, "{tag} {}\n{}", out.stdout, out.stderr);
        out.expect("version", "ok");
        out.expect("answer", "ok");
        assert!(out.stdout.contains("inside\n"), "{tag} {}", out.stdout);
        // curl's exit code 56: the CONNECT was refused (403) by the proxy.
        out.expect("blocked", "56");
        let after: Vec<_> = c.config.iter().map(|d| tree(&home.join(d))).collect();
        assert_eq!(
            after, before,
            "{tag} a write inside reached the host's config"
        );
        assert!(
            mock.requests()
                .iter()
                .any(|r| r["host"] == c.api && r["method"] == "POST"),
            "{tag} {:?}",
            mock.requests()
        );
        let events = audit(t.path(), &home, &proj);
        assert!(
            events.iter().any(|e| e["event"] == "net"
                && e["action"] == "allow"
                && e["host"] == c.api
                && e["rule"] == format!("allow \"{}\"", c.api)),
            "{tag} {events:#?}"
        );
        assert!(
            events.iter().any(|e| e["event"] == "net"
                && e["action"] == "block"
                && e["host"] == "blocked.test"),
            "{tag} {events:#?}"
        );
    }
}

/// Gemini CLI's system settings mirror the sandbox: in `investigate` (read-only) the model is
/// not offered the editing tools, even with `--yolo`; in the default profile it is.
/// A project with `sandbox.kdl` = `config` whose home holds Gemini CLI's API-key login.
fn gemini_project(t: &Path, config: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (home, proj) = project(t, config);
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(
        home.join(".gemini/settings.json"),
        "{\"security\": {\"auth\": {\"selectedType\": \"gemini-api-key\"}}}\n",
    )
    .unwrap();
    (home, proj)
}

/// `aisb --trust run RUN_ARGS -- gemini`, headless, `--yolo` (headless Gemini otherwise
/// withholds the editing tools itself), asked `prompt`, its API pinned to `mock`.
fn run_gemini(
    t: &Path,
    (home, proj): (&Path, &Path),
    mock: &Mock,
    run_args: &[&str],
    prompt: &str,
) -> Out {
    Out::from(
        aisb(t, home, proj)
            .args(["--trust", "run"])
            .args(run_args)
            .args([
                "--",
                "gemini",
                "--skip-trust",
                "--yolo",
                "-m",
                "gemini-2.5-flash",
                "-p",
            ])
            .arg(prompt)
            .env("GEMINI_API_KEY", "test")
            .env(
                "GOOGLE_GEMINI_BASE_URL",
                "http://generativelanguage.googleapis.com",
            )
            .env("AISB_PROXY_PIN", mock.pins())
            .output()
            .unwrap(),
    )
}

/// The function responses Gemini CLI sent back to the mock, in order (the longest
/// conversation).
fn gemini_results(mock: &Mock) -> Vec<String> {
    mock.requests()
        .iter()
        .filter_map(|r| r["gemini_results"].as_array().cloned())
        .max_by_key(Vec::len)
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[test]
fn gemini_is_not_offered_tools_the_sandbox_refuses() {
    if !needs("gemini") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (home, proj) = gemini_project(t.path(), "import \"preset:gemini\"\n");
    for (profile, editing) in [("investigate", false), ("default", true)] {
        let mock = Mock::start(t.path(), &[]);
        let out = run_gemini(
            t.path(),
            (&home, &proj),
            &mock,
            &["--profile", profile],
            "say hi",
        );
        assert_eq!(out.code, 0, "[{profile}] {}\n{}", out.stdout, out.stderr);
        assert!(
            out.stdout.contains("MOCK-DONE"),
            "[{profile}] {}",
            out.stdout
        );
        let offered: Vec<String> = mock
            .requests()
            .iter()
            .filter_map(|r| r["tools"].as_array().cloned())
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        assert!(
            offered.iter().any(|t| t == "read_file"),
            "[{profile}] {offered:?}"
        );
        for tool in ["write_file", "replace"] {
            assert_eq!(
                offered.iter().any(|t| t == tool),
                editing,
                "[{profile}] {tool}: {offered:?}"
            );
        }
    }
}

/// The tool results a client sent back to the mock, in order (the longest conversation).
fn tool_results(mock: &Mock) -> Vec<serde_json::Value> {
    mock.requests()
        .iter()
        .filter_map(|r| r["tool_results"].as_array().cloned())
        .max_by_key(Vec::len)
        .unwrap_or_default()
}

/// Issue 23: a profile denying `Write` and `Edit`. The (scripted) model reads README, then
/// asks Claude Code to overwrite and to edit it, then cats it: both changes come back refused
/// with the rule and where it was written, the file is untouched, Read and Bash still work,
/// and the audit log has one agent-block event per refused call, shown by `--blocked-only`.
/// The same with Claude Code's permission layer bypassed: aisb's hook refuses them anyway.
#[test]
fn claude_denied_tools_are_refused_and_logged_even_with_permissions_bypassed() {
    if !needs("claude") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let config = "import \"preset:claude\"\ntools {\n    deny \"Write\" \"Edit\"\n}\n";
    let (home, proj) = project(t.path(), config);
    let readme = proj.join("README");
    let file = readme.to_str().unwrap();
    let script = serde_json::json!([
        {"tool": "Read", "input": {"file_path": file}},
        {"tool": "Write", "input": {"file_path": file, "content": "overwritten\n"}},
        {"tool": "Edit", "input": {"file_path": file, "old_string": "hello", "new_string": "pwned"}},
        "cat README",
    ]);
    // Each backend once: the hook is the same binary either way.
    for (bypass, backend) in [(false, "libcontainer"), (true, "bwrap")] {
        let tag = if bypass {
            "[bypassed, bwrap]"
        } else {
            "[managed, libcontainer]"
        };
        let mock = Mock::start_raw(t.path(), &serde_json::to_string(&script).unwrap());
        let mut args = vec![
            "--trust",
            "run",
            "--backend",
            backend,
            "--",
            "claude",
            "-p",
            "do the task",
            "--output-format",
            "json",
        ];
        if bypass {
            args.push("--dangerously-skip-permissions");
        }
        let out = Out::from(
            aisb(t.path(), &home, &proj)
                .args(&args)
                .env("ANTHROPIC_API_KEY", "sk-ant-test")
                .env("ANTHROPIC_BASE_URL", "http://api.anthropic.com")
                .env("AISB_PROXY_PIN", mock.pins())
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "{tag} {}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("MOCK-DONE"), "{tag} {}", out.stdout);
        let results = tool_results(&mock);
        assert_eq!(results.len(), 4, "{tag} {results:#?}");
        let text = |i: usize| results[i]["content"].as_str().unwrap_or("").to_string();
        assert_eq!(results[0]["is_error"], false, "{tag} Read: {results:#?}");
        assert!(text(0).contains("hello"), "{tag} Read: {}", text(0));
        for (i, tool) in [(1, "Write"), (2, "Edit")] {
            assert_eq!(results[i]["is_error"], true, "{tag} {tool}: {results:#?}");
            assert!(
                text(i).contains(&format!("deny \"{tool}\", sandbox.kdl:3")),
                "{tag} {tool}: {}",
                text(i)
            );
        }
        assert_eq!(results[3]["is_error"], false, "{tag} Bash: {results:#?}");
        assert!(text(3).contains("hello"), "{tag} Bash: {}", text(3));
        assert_eq!(
            std::fs::read_to_string(&readme).unwrap(),
            "hello\n",
            "{tag}"
        );
    }
    let events = audit(t.path(), &home, &proj);
    let blocks = |tool: &str| {
        events
            .iter()
            .filter(|e| {
                e["event"] == "agent-block"
                    && e["agent"] == "claude"
                    && e["tool"] == tool
                    && e["input"] == file
                    && e["rule"] == format!("deny \"{tool}\"")
                    && e["at"] == "sandbox.kdl:3"
            })
            .count()
    };
    assert_eq!(blocks("Write"), 2, "{events:#?}");
    assert_eq!(blocks("Edit"), 2, "{events:#?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| e["event"] == "agent-block")
            .count(),
        4,
        "only the refused calls are blocks: {events:#?}"
    );
    let o = Out::from(
        aisb(t.path(), &home, &proj)
            .args(["audit", "--blocked-only"])
            .output()
            .unwrap(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", o.stdout);
    assert!(
        lines.iter().all(|l| l.contains("AGENT-BLOCK claude ")),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains(&format!(
            "AGENT-BLOCK claude Write: {file} (rule deny \"Write\", sandbox.kdl:3)"
        )),
        "{}",
        o.stdout
    );
}

/// Issue 23 for Gemini CLI: denied tools are not offered to the model (its system settings'
/// `tools.exclude`), a call the model forces anyway is refused, and a rule Gemini's settings
/// cannot say (a path) is enforced by aisb's BeforeTool hook, refused with the rule and logged.
#[test]
fn gemini_denied_tools_are_not_offered_and_forced_calls_are_refused() {
    if !needs("gemini") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let config = "import \"preset:gemini\"\ntools {\n    deny \"Write\" \"Edit\"\n    deny \"Read(private.txt)\"\n}\n";
    let (home, proj) = gemini_project(t.path(), config);
    std::fs::write(proj.join("private.txt"), "PRIVATE NOTES\n").unwrap();
    let (readme, private) = (proj.join("README"), proj.join("private.txt"));
    let script = serde_json::json!([
        {"tool": "write_file", "input": {"file_path": readme, "content": "overwritten\n"}},
        {"tool": "read_file", "input": {"file_path": private}},
        {"tool": "read_file", "input": {"file_path": readme}},
    ]);
    let mock = Mock::start_raw(t.path(), &script.to_string());
    let out = run_gemini(
        t.path(),
        (&home, &proj),
        &mock,
        &["--backend", "bwrap"],
        "do the task",
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("MOCK-DONE"), "{}", out.stdout);
    let requests = mock.requests();
    let offered: Vec<String> = requests
        .iter()
        .filter_map(|r| r["tools"].as_array().cloned())
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    assert!(offered.iter().any(|t| t == "read_file"), "{offered:?}");
    for tool in ["write_file", "replace"] {
        assert!(!offered.iter().any(|t| t == tool), "{tool}: {offered:?}");
    }
    let results = gemini_results(&mock);
    assert_eq!(results.len(), 3, "{results:#?}");
    assert!(
        results[0].contains("not found"),
        "forced write_file: {}",
        results[0]
    );
    assert!(
        results[1].contains("deny \\\"Read(private.txt)\\\", sandbox.kdl:4"),
        "read_file private.txt: {}",
        results[1]
    );
    assert!(!results[1].contains("PRIVATE NOTES"), "{}", results[1]);
    assert!(
        results[2].contains("hello"),
        "read_file README: {}",
        results[2]
    );
    assert_eq!(std::fs::read_to_string(&readme).unwrap(), "hello\n");
    let events = audit(t.path(), &home, &proj);
    let blocks: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "agent-block")
        .collect();
    assert_eq!(blocks.len(), 1, "{events:#?}");
    assert_eq!(blocks[0]["agent"], "gemini");
    assert_eq!(blocks[0]["tool"], "read_file");
    assert_eq!(blocks[0]["input"], private.to_str().unwrap());
    assert_eq!(blocks[0]["rule"], "deny \"Read(private.txt)\"");
}

/// Issue 23, seed 001's investigate run without a shell: a profile extending `investigate`
/// denies `Bash`. Claude Code's Bash calls are refused and logged, with the permission layer
/// bypassed too; Read still works.
#[test]
fn claude_investigate_without_bash_refuses_bash_and_still_reads() {
    if !needs("claude") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let config = "import \"preset:claude\"\nprofile \"look\" extends=\"investigate\" {\n    tools { deny \"Bash\"; }\n}\n";
    let (home, proj) = project(t.path(), config);
    let readme = proj.join("README");
    let script = serde_json::json!([
        {"tool": "Read", "input": {"file_path": readme}},
        "cat README",
        "curl -sS https://blocked.test/",
    ]);
    let mock = Mock::start_raw(t.path(), &script.to_string());
    let out = Out::from(
        aisb(t.path(), &home, &proj)
            .args(["--trust", "run", "--profile", "look", "--", "claude"])
            .args(["-p", "do the task", "--output-format", "json"])
            .arg("--dangerously-skip-permissions")
            .env("ANTHROPIC_API_KEY", "sk-ant-test")
            .env("ANTHROPIC_BASE_URL", "http://api.anthropic.com")
            .env("AISB_PROXY_PIN", mock.pins())
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let results = tool_results(&mock);
    assert_eq!(results.len(), 3, "{results:#?}");
    let text = |i: usize| results[i]["content"].as_str().unwrap_or("").to_string();
    assert_eq!(results[0]["is_error"], false, "{results:#?}");
    assert!(text(0).contains("hello"), "{}", text(0));
    for i in [1, 2] {
        assert_eq!(results[i]["is_error"], true, "{results:#?}");
        assert!(
            text(i).contains("deny \"Bash\", sandbox.kdl:3"),
            "{}",
            text(i)
        );
    }
    let events = audit(t.path(), &home, &proj);
    let bash_blocks = events
        .iter()
        .filter(|e| e["event"] == "agent-block" && e["tool"] == "Bash")
        .count();
    assert_eq!(bash_blocks, 2, "{events:#?}");
    // Refused before it ran: the proxy never saw the curl.
    assert!(
        !events
            .iter()
            .any(|e| e["event"] == "net" && e["host"] == "blocked.test"),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "agent" && e["tool"] == "Read"),
        "{events:#?}"
    );
}

/// Issue 23 for the clients without a hook aisb can use: OpenCode resolves its `permission`
/// from the managed config aisb writes (a project's `opencode.json` and the caller's
/// `OPENCODE_PERMISSION` cannot loosen it), and Codex holds its web search to the
/// `requirements.toml` aisb writes, whatever the command line asks.
#[test]
fn opencode_and_codex_hold_to_the_tool_policy_in_their_own_config() {
    if !needs("opencode") || !needs("codex") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let config = "import \"preset:opencode\"\nimport \"preset:codex\"\ntools {\n    deny \"Edit\" \"Bash(git push:*)\" \"WebSearch\"\n}\n";
    let (home, proj) = project(t.path(), config);
    std::fs::write(
        proj.join("opencode.json"),
        "{\"permission\": {\"edit\": \"allow\", \"bash\": \"allow\", \"websearch\": \"allow\"}}\n",
    )
    .unwrap();
    let codex = &CLIENTS.iter().find(|c| c.preset == "codex").unwrap().home[0];
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::fs::write(home.join(codex.0), codex.1).unwrap();
    let mock = Mock::start(t.path(), &[]);
    let out = Out::from(
        aisb(t.path(), &home, &proj)
            .args(["--trust", "run", "--", "sh", "-c"])
            .arg(
                "opencode debug config > /tmp/oc.json 2>&1; \
                 python3 -c 'import json; print(\"permission=\" + json.dumps(json.load(open(\"/tmp/oc.json\"))[\"permission\"], sort_keys=True))'; \
                 timeout 90 codex exec --skip-git-repo-check -c 'web_search=\"live\"' 'say hi' </dev/null > /tmp/codex 2>&1; \
                 grep -q MOCK-DONE /tmp/codex && echo codex=ok; \
                 grep -c 'disallowed by requirements.*set by /etc/codex/requirements.toml' /tmp/codex | sed 's/^/refused=/'",
            )
            .env("OPENAI_API_KEY", "sk-test")
            .env("OPENCODE_PERMISSION", "{\"edit\": \"allow\"}")
            .env("AISB_PROXY_PIN", mock.pins())
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    out.expect(
        "permission",
        r#"{"bash": {"git push *": "deny"}, "edit": "deny", "websearch": "deny"}"#,
    );
    out.expect("codex", "ok");
    assert!(
        out.value("refused").is_some_and(|n| n != "0"),
        "{}",
        out.stdout
    );
}

/// Issue 23: `aisb test` hands each tool denial to aisb's hook inside, as each agent preset
/// with a hook would call it, on both backends: refused, and reported per agent. A sandbox
/// whose hook refuses nothing is reported (exit 1).
#[test]
fn aisb_test_reports_the_tool_policy_per_agent_preset() {
    if !support::root_or_skip("aisb test with agent presets") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let config = "import \"preset:claude\"\nimport \"preset:gemini\"\ntools {\n    deny \"Write\" \"Bash(git push:*)\"\n}\n";
    let (home, proj) = project(t.path(), config);
    for backend in ["libcontainer", "bwrap"] {
        let out = Out::from(
            aisb(t.path(), &home, &proj)
                .args(["--trust", "test", "--json", "--backend", backend])
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "[{backend}] {}\n{}", out.stdout, out.stderr);
        let checks: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let tool_checks: Vec<(String, String)> = checks
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["check"].as_str().unwrap().contains("(tools deny"))
            .map(|c| {
                (
                    c["check"].as_str().unwrap().to_string(),
                    c["observed"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want = |s: &str| (s.to_string(), "refused (2)".to_string());
        assert_eq!(
            tool_checks,
            [
                want("claude calls Write (tools deny \"Write\", sandbox.kdl:4)"),
                want("claude calls Bash (tools deny \"Bash(git push:*)\", sandbox.kdl:4)"),
                want("gemini calls write_file (tools deny \"Write\", sandbox.kdl:4)"),
                want("gemini calls run_shell_command (tools deny \"Bash(git push:*)\", sandbox.kdl:4)"),
            ],
            "[{backend}]"
        );
        let broken = Out::from(
            aisb(t.path(), &home, &proj)
                .args(["--trust", "test", "--backend", backend])
                .env("AISB_TEST_BREAK_ISOLATION", "tools")
                .output()
                .unwrap(),
        );
        assert_eq!(broken.code, 1, "[{backend}] {}", broken.stdout);
        let failed: Vec<&str> = broken
            .stdout
            .lines()
            .filter(|l| l.starts_with("FAIL"))
            .collect();
        assert_eq!(failed.len(), 4, "[{backend}] {}", broken.stdout);
        assert!(
            failed
                .iter()
                .all(|l| l.contains("(tools deny") && l.ends_with("SUCCEEDED")),
            "[{backend}] {}",
            broken.stdout
        );
        assert!(
            broken
                .stdout
                .contains("tool policy (`tools`), per agent preset:"),
            "{}",
            broken.stdout
        );
    }
}

/// Issue 23, from inside as the attacker: on both backends, as root and as an ordinary user,
/// aisb's hook refuses a denied call with the rule's reason and logs it, and the workload can
/// neither rewrite the policy the hook reads nor hide it with a file of its own.
#[test]
fn the_hook_holds_for_root_and_an_ordinary_user_on_both_backends() {
    if !support::root_or_skip("the tool policy hook suite") {
        return;
    }
    let user = support::test_user();
    for (backend, as_user) in ["libcontainer", "bwrap"]
        .iter()
        .flat_map(|b| [(*b, None), (*b, Some(user))])
    {
        let tag = format!(
            "[{backend} {}]",
            if as_user.is_some() { "user" } else { "root" }
        );
        let t = tempfile::tempdir().unwrap();
        let config = "import \"preset:claude\"\ntools {\n    deny \"Write\"\n}\n";
        let (home, proj) = project(t.path(), config);
        let mut cmd = match as_user {
            Some((uid, gid)) => {
                let exe = support::hand_to_user(t.path(), uid, gid);
                let mut u = Command::new(exe);
                std::os::unix::process::CommandExt::uid(&mut u, uid);
                std::os::unix::process::CommandExt::gid(&mut u, gid);
                u.current_dir(&proj)
                    .env_clear()
                    .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                    .env("HOME", &home)
                    .env("XDG_CACHE_HOME", t.path().join("cache"))
                    .env("XDG_CONFIG_HOME", t.path().join("config"))
                    .stdin(std::process::Stdio::null());
                u
            }
            None => aisb(t.path(), &home, &proj),
        };
        let call = r#"{"tool_name":"Write","tool_input":{"file_path":"README","content":"x"}}"#;
        let script = format!(
            "printf '%s' '{call}' | /run/aisb/init agent-event claude 2>/tmp/why; echo hook=$?; \
             sed 's/^/why=/' /tmp/why; \
             echo '{{\"allow\":[],\"deny\":[]}}' > /etc/aisb/tools.json 2>/dev/null; echo rewrite=$?; \
             rm -f /etc/aisb/tools.json 2>/dev/null; echo remove=$?; \
             mv /etc/aisb /etc/aisb2 2>/dev/null; echo rename=$?; \
             printf '%s' '{call}' | /run/aisb/init agent-event claude 2>/dev/null; echo again=$?"
        );
        let out = Out::from(
            cmd.args([
                "--trust",
                "run",
                "--backend",
                backend,
                "--",
                "/bin/sh",
                "-c",
                &script,
            ])
            .output()
            .unwrap(),
        );
        assert_eq!(out.code, 0, "{tag} {}\n{}", out.stdout, out.stderr);
        out.expect("hook", "2");
        out.expect(
            "why",
            "aisb: this tool call is refused by the sandbox's tool policy (deny \"Write\", sandbox.kdl:3)",
        );
        for attempt in ["rewrite", "remove", "rename"] {
            out.expect_failed(attempt, "change the policy the hook reads");
        }
        out.expect("again", "2");
        let mut audit_cmd = match as_user {
            Some((uid, gid)) => {
                let mut u = Command::new(t.path().join("bin/aisb"));
                std::os::unix::process::CommandExt::uid(&mut u, uid);
                std::os::unix::process::CommandExt::gid(&mut u, gid);
                u.current_dir(&proj)
                    .env_clear()
                    .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                    .env("HOME", &home)
                    .env("XDG_CACHE_HOME", t.path().join("cache"))
                    .env("XDG_CONFIG_HOME", t.path().join("config"));
                u
            }
            None => aisb(t.path(), &home, &proj),
        };
        let o = Out::from(
            audit_cmd
                .args(["audit", "--blocked-only"])
                .output()
                .unwrap(),
        );
        assert_eq!(o.code, 0, "{tag} {}", o.stderr);
        assert_eq!(
            o.stdout
                .lines()
                .filter(|l| l.ends_with(
                    "AGENT-BLOCK claude Write: README (rule deny \"Write\", sandbox.kdl:3)"
                ))
                .count(),
            2,
            "{tag} {}",
            o.stdout
        );
    }
}

/// Issue 28: an agent runs the project's tests. Claude Code in its preset, with the embedded
/// defaults for the project's files: the (scripted) model asks its Bash tool for `npm test`
/// in a Node project whose installed `node_modules/` git ignores, and gets the test's output
/// back, on both backends; the package's own `.env` stays masked all the same.
#[test]
fn claude_runs_the_projects_tests_through_its_shell_tool() {
    if !needs("claude") || !needs("npm") {
        return;
    }
    for backend in ["libcontainer", "bwrap"] {
        let t = tempfile::tempdir().unwrap();
        let (home, proj) = project(t.path(), "import \"preset:claude\"\n");
        let write = |rel: &str, content: &str| {
            let p = proj.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        };
        write(".gitignore", "node_modules/\n");
        write(
            "package.json",
            r#"{"name":"app","version":"1.0.0","scripts":{"test":"node test.js"}}"#,
        );
        write(
            "test.js",
            "const pad = require('left-pad');\n\
             if (pad('7', 3) !== '007') process.exit(1);\n\
             console.log('tests passed: ' + pad('7', 3));\n",
        );
        write(
            "node_modules/left-pad/index.js",
            "module.exports = (s, n) => s.padStart(n, '0');\n",
        );
        write("node_modules/left-pad/.env", "PKG_AUTHOR_TOKEN=leaked\n");
        support::git_in(&proj, &["add", "-A"]);
        support::git_in(&proj, &["commit", "-qm", "node project"]);
        let mock = Mock::start(
            t.path(),
            &[
                "npm test",
                "cat node_modules/left-pad/.env; echo env-read=$?",
            ],
        );
        let out = Out::from(
            aisb(t.path(), &home, &proj)
                .args([
                    "--trust",
                    "run",
                    "--backend",
                    backend,
                    "--",
                    "claude",
                    "-p",
                    "run the tests",
                    "--output-format",
                    "json",
                ])
                .env("ANTHROPIC_API_KEY", "sk-ant-test")
                .env("ANTHROPIC_BASE_URL", "http://api.anthropic.com")
                .env("AISB_PROXY_PIN", mock.pins())
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "[{backend}] {}\n{}", out.stdout, out.stderr);
        let results = tool_results(&mock);
        assert_eq!(results.len(), 2, "[{backend}] {results:?}");
        let text = |i: usize| results[i]["content"].as_str().unwrap_or("").to_string();
        assert!(
            text(0).contains("tests passed: 007"),
            "[{backend}] npm test through the Bash tool: {results:?}"
        );
        assert_ne!(results[0]["is_error"], true, "[{backend}] {results:?}");
        assert!(!text(1).contains("leaked"), "[{backend}] {}", text(1));
        assert!(text(1).contains("env-read=1"), "[{backend}] {}", text(1));
    }
}

/// Issue 31: Claude Code in its preset holds a placeholder, never the key; the proxy puts the
/// real key in `x-api-key` of its requests to its API (a TLS mock here, which checks it), on
/// both backends. What the model's command prints of the variable is the placeholder.
#[test]
fn claude_reaches_its_api_with_a_key_it_never_holds() {
    if !needs("claude") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (home, proj) = project(t.path(), "import \"preset:claude\"\n");
    let real = format!(
        "sk-ant-api03-{}",
        std::process::id()
            .to_string()
            .repeat(12)
            .chars()
            .take(40)
            .collect::<String>()
    );
    for backend in ["bwrap", "libcontainer"] {
        let mock = Mock::start_tls(t.path(), &["printenv ANTHROPIC_API_KEY"]);
        let out = Out::from(
            aisb(t.path(), &home, &proj)
                .args(["--trust", "run", "--backend", backend, "--"])
                .args(["claude", "-p", "do the task", "--output-format", "json"])
                .env("ANTHROPIC_API_KEY", &real)
                .env("AISB_PROXY_PIN", mock.pins())
                .env("SSL_CERT_FILE", t.path().join("mock-ca.pem"))
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "[{backend}] {}\n{}", out.stdout, out.stderr);
        assert!(
            out.stdout.contains("MOCK-DONE"),
            "[{backend}] {}",
            out.stdout
        );
        let requests = mock.requests();
        let messages: Vec<&serde_json::Value> = requests
            .iter()
            .filter(|r| r["path"].as_str().unwrap_or("").starts_with("/v1/messages"))
            .collect();
        assert!(!messages.is_empty(), "[{backend}] {requests:#?}");
        for r in &messages {
            assert_eq!(r["x-api-key"], real.as_str(), "[{backend}] {r}");
        }
        // What the command inside printed, sent back to the model: a placeholder of its shape.
        let results = messages
            .iter()
            .filter_map(|r| r["tool_results"].as_array().cloned())
            .max_by_key(Vec::len)
            .unwrap_or_default();
        let printed = results
            .first()
            .and_then(|r| r["content"].as_str())
            .unwrap_or("")
            .trim()
            .to_string();
        assert!(
            printed.starts_with("sk-ant-api03-") && printed.len() == real.len() && printed != real,
            "[{backend}] the sandbox's variable: {printed:?}"
        );
        assert!(
            !out.stdout.contains(&real) && !out.stderr.contains(&real),
            "[{backend}]"
        );
    }
    let events = audit(t.path(), &home, &proj);
    assert!(
        events.iter().any(|e| e["event"] == "credential"
            && e["credential"] == "anthropic-api-key"
            && e["host"] == "api.anthropic.com"),
        "{events:#?}"
    );
}

/// How aisb's post-tool hook's feedback starts (`proxy::feedback`).
const MARK: &str = "[aisb] The sandbox refused";

/// Issue 32's feedback: what the sandbox refused during a tool call goes back to the model
/// with that call's result (aisb's post-tool hook asks the proxy), in words that say it was
/// the sandbox and which host, so the agent stops retrying and can tell the user; a call
/// during which nothing was refused gets nothing added. Both backends, the real client.
#[test]
fn claude_hears_what_the_sandbox_refused_during_its_tool_call() {
    if !needs("claude") {
        return;
    }
    for backend in ["bwrap", "libcontainer"] {
        let t = tempfile::tempdir().unwrap();
        // A file the configuration masks, read in a way Claude Code's own permission layer
        // (which aisb gives the masks as deny rules) does not recognise, so the sandbox is
        // what refuses it.
        let (home, proj) = project(
            t.path(),
            "import \"preset:claude\"\nblock \"private.txt\"\n",
        );
        std::fs::write(proj.join("private.txt"), "TOKEN=hunter2\n").unwrap();
        let mock = Mock::start(
            t.path(),
            &[
                "echo fine",
                "curl -sS https://blocked.test/x",
                "python3 -c \"open('priv' + 'ate.txt').read()\"",
            ],
        );
        let out = Out::from(
            aisb(t.path(), &home, &proj)
                .args([
                    "--trust",
                    "run",
                    "--backend",
                    backend,
                    "--",
                    "claude",
                    "-p",
                    "do the task",
                    "--output-format",
                    "json",
                ])
                .env("ANTHROPIC_API_KEY", "sk-ant-test")
                .env("ANTHROPIC_BASE_URL", "http://api.anthropic.com")
                .env("AISB_PROXY_PIN", mock.pins())
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "[{backend}] {}\n{}", out.stdout, out.stderr);
        assert!(
            out.stdout.contains("MOCK-DONE"),
            "[{backend}] {}",
            out.stdout
        );
        // Everything the client sent the model after each tool result, by how many results.
        let seen = |results: usize| -> String {
            mock.requests()
                .iter()
                .filter(|r| r["tool_results"].as_array().map_or(0, Vec::len) == results)
                .map(|r| format!("{} {}", r["texts"], r["tool_results"]))
                .collect()
        };
        let after_echo = seen(1);
        let after_curl = seen(2);
        let after_cat = seen(3);
        assert!(
            !after_echo.is_empty() && !after_curl.is_empty(),
            "[{backend}] {:?}",
            mock.requests()
        );
        assert!(
            !after_echo.contains("blocked.test"),
            "[{backend}] a later call's refusal was told to an earlier one: {after_echo}"
        );
        // Nothing else refused (the client's own traffic neither): the first call heard
        // nothing at all.
        let events = audit(t.path(), &home, &proj);
        let other_blocks = events
            .iter()
            .filter(|e| {
                (e["event"] == "net" && e["action"] == "block" && e["host"] != "blocked.test")
                    || (e["event"] == "file"
                        && !e["command"]
                            .as_str()
                            .is_some_and(|c| c.starts_with("python3")))
            })
            .count();
        if other_blocks == 0 {
            assert!(
                !after_echo.contains(MARK),
                "[{backend}] a call with nothing refused was told something: {after_echo}"
            );
        }
        assert!(
            after_curl.contains(MARK) && after_curl.contains("blocked.test:443"),
            "[{backend}] the refusal did not reach the model: {after_curl}"
        );
        // A masked file's "Permission denied" is told too, with its rule (from the audit
        // log, where the reporting layer of masks wrote it).
        assert!(
            after_cat.contains("a read of `")
                && after_cat.contains("/private.txt`")
                && after_cat.contains("masked by block"),
            "[{backend}] the masked read did not reach the model: {after_cat}"
        );
        assert!(!after_cat.contains("hunter2"), "[{backend}] {after_cat}");
        // The audit line names the agent whose run it was.
        assert!(
            events.iter().any(|e| e["event"] == "file"
                && e["agent"] == "claude"
                && e["target"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("/private.txt"))),
            "[{backend}] {events:#?}"
        );
    }
}

/// The same feedback for Gemini CLI (its `AfterTool` hook; the call is matched to its
/// `BeforeTool` by session, tool and input, as Gemini gives calls no id).
#[test]
fn gemini_hears_what_the_sandbox_refused_during_its_tool_call() {
    if !needs("gemini") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (home, proj) = gemini_project(
        t.path(),
        "import \"preset:gemini\"\nblock \"private.txt\"\n",
    );
    std::fs::write(proj.join("private.txt"), "TOKEN=hunter2\n").unwrap();
    let script = serde_json::json!([
        {"tool": "run_shell_command", "input": {"command": "echo fine"}},
        {"tool": "run_shell_command", "input": {"command": "curl -sS https://blocked.test/x"}},
        {"tool": "run_shell_command", "input": {"command": "python3 -c \"open('priv' + 'ate.txt').read()\""}},
    ]);
    let mock = Mock::start_raw(t.path(), &script.to_string());
    let out = run_gemini(
        t.path(),
        (&home, &proj),
        &mock,
        &["--backend", "bwrap"],
        "do the task",
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("MOCK-DONE"), "{}", out.stdout);
    let results = gemini_results(&mock);
    assert_eq!(results.len(), 3, "{results:#?}");
    assert!(
        results[0].contains("fine") && !results[0].contains("blocked.test"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains(MARK) && results[1].contains("blocked.test:443"),
        "the refusal did not reach the model: {}",
        results[1]
    );
    // An attempt on a masked path too, with its rule.
    assert!(
        results[2].contains(MARK)
            && results[2].contains("/private.txt`")
            && results[2].contains("masked by block")
            && !results[2].contains("hunter2"),
        "the masked read did not reach the model: {}",
        results[2]
    );
}

/// Runs `script` under `config` with the agents' logins in the home, on each backend, as root
/// and as an ordinary user; with `env` added. Each login's file is unreadable inside, its
/// secret nowhere in the output; `hint` is said exactly when `env` is empty.
fn login_stays_home(config: &str, login: &str, content: &str, env: &[(&str, &str)], hint: &str) {
    for backend in ["bwrap", "libcontainer"] {
        for user in [None, Some(support::test_user())] {
            let who = format!(
                "[{backend} {}]",
                if user.is_some() { "user" } else { "root" }
            );
            let t = tempfile::tempdir().unwrap();
            let (home, proj) = project(t.path(), config);
            let file = home.join(login);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, content).unwrap();
            let mut cmd = aisb_as(user, t.path(), &home, &proj);
            let script = format!("cat ~/{login} 2>&1; echo read=$?");
            let o = Out::from(
                cmd.envs(env.iter().copied())
                    .args([
                        "--trust",
                        "run",
                        "--backend",
                        backend,
                        "--",
                        "sh",
                        "-c",
                        &script,
                    ])
                    .output()
                    .unwrap(),
            );
            assert_eq!(o.code, 0, "{who} {}", o.stderr);
            assert!(!o.stdout.contains("LOGIN-SECRET"), "{who} {}", o.stdout);
            assert_ne!(o.value("read"), Some("0"), "{who} {}", o.stdout);
            assert_eq!(
                o.stderr.contains(hint),
                env.is_empty(),
                "{who} {}",
                o.stderr
            );
        }
    }
}

/// A Claude subscription's login is a file that stays on the host (masked in the preset's
/// copy-on-write `~/.claude`): with no key to broker, the run says how to hand Claude Code one
/// (`claude setup-token`); with a key it says nothing.
#[test]
fn a_claude_login_stays_on_the_host_and_is_explained() {
    if !support::root_or_skip("the agents' logins") {
        return;
    }
    let login = ".claude/.credentials.json";
    let content = "{\"claudeAiOauth\":{\"refreshToken\":\"sk-ant-ort01-LOGIN-SECRET\"}}\n";
    let config = "import \"preset:claude\"\n";
    login_stays_home(config, login, content, &[], "claude setup-token");
    let token = [("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-FROM-SETUP-TOKEN")];
    login_stays_home(config, login, content, &token, "claude setup-token");
}

/// The same for Codex's ChatGPT login (`~/.codex/auth.json`).
#[test]
fn a_codex_login_stays_on_the_host_and_is_explained() {
    if !support::root_or_skip("the agents' logins") {
        return;
    }
    let content = "{\"tokens\":{\"refresh_token\":\"rt-LOGIN-SECRET\"}}\n";
    login_stays_home(
        "import \"preset:codex\"\n",
        ".codex/auth.json",
        content,
        &[],
        "OPENAI_API_KEY",
    );
}

/// Gemini CLI's Google login and OpenCode's logins, likewise.
#[test]
fn gemini_and_opencode_logins_stay_on_the_host_and_are_explained() {
    if !support::root_or_skip("the agents' logins") {
        return;
    }
    let content = "{\"refresh_token\":\"1//LOGIN-SECRET\"}\n";
    login_stays_home(
        "import \"preset:gemini\"\n",
        ".gemini/oauth_creds.json",
        content,
        &[],
        "GEMINI_API_KEY",
    );
    login_stays_home(
        "import \"preset:opencode\"\n",
        ".local/share/opencode/auth.json",
        content,
        &[],
        "ANTHROPIC_API_KEY",
    );
}

/// Claude Code keeps an API key saved by a console login in `~/.claude.json`
/// (`primaryApiKey`), which the preset copies in whole: the copy loses that field (the rest
/// stays), also a copy an earlier run made with it.
#[test]
fn the_key_claude_code_saved_in_its_config_stays_on_the_host() {
    if !support::root_or_skip("the agents' logins") {
        return;
    }
    for backend in ["bwrap", "libcontainer"] {
        let t = tempfile::tempdir().unwrap();
        let (home, proj) = project(t.path(), "import \"preset:claude\"\n");
        std::fs::write(
            home.join(".claude.json"),
            "{\"primaryApiKey\":\"sk-ant-api03-SAVED-SECRET\",\"theme\":\"dark\"}\n",
        )
        .unwrap();
        let run = || {
            Out::from(
                aisb(t.path(), &home, &proj)
                    .args(["--trust", "run", "--backend", backend, "--", "cat"])
                    .arg(home.join(".claude.json"))
                    .output()
                    .unwrap(),
            )
        };
        let o = run();
        assert_eq!(o.code, 0, "[{backend}] {}", o.stderr);
        assert!(
            !o.stdout.contains("SAVED-SECRET"),
            "[{backend}] {}",
            o.stdout
        );
        assert!(o.stdout.contains("\"theme\""), "[{backend}] {}", o.stdout);
        // A copy made before this fix, with the key: the next run scrubs it.
        let copy = walkdir::WalkDir::new(t.path().join("cache"))
            .into_iter()
            .flatten()
            .find(|e| e.file_name() == ".claude.json" && e.file_type().is_file())
            .expect("the private copy")
            .into_path();
        std::fs::write(
            &copy,
            "{\"primaryApiKey\":\"sk-ant-api03-OLD-COPY-SECRET\"}\n",
        )
        .unwrap();
        let o = run();
        assert_eq!(o.code, 0, "[{backend}] {}", o.stderr);
        assert!(
            !o.stdout.contains("OLD-COPY-SECRET"),
            "[{backend}] {}",
            o.stdout
        );
    }
}

/// A login the user makes on the host while the sandbox runs (`claude /login` in another
/// terminal) does not show through the preset's copy-on-write `~/.claude`: the file that does
/// not exist yet is masked over an empty one. Both backends, root and an ordinary user.
#[test]
fn a_login_made_while_the_sandbox_runs_stays_on_the_host() {
    if !support::root_or_skip("the agents' logins") {
        return;
    }
    for backend in ["bwrap", "libcontainer"] {
        for user in [None, Some(support::test_user())] {
            let who = format!(
                "[{backend} {}]",
                if user.is_some() { "user" } else { "root" }
            );
            let t = tempfile::tempdir().unwrap();
            let (home, proj) = project(t.path(), "import \"preset:claude\"\n");
            let mut cmd = aisb_as(user, t.path(), &home, &proj);
            let script = format!(
                "touch {p}/ready; i=0; while [ ! -e {p}/go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done\n\
                 cat ~/.claude/.credentials.json 2>&1; echo read=$?",
                p = proj.display()
            );
            let child = cmd
                .args([
                    "--trust",
                    "run",
                    "--backend",
                    backend,
                    "--",
                    "sh",
                    "-c",
                    &script,
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !proj.join("ready").exists() {
                assert!(std::time::Instant::now() < deadline, "{who} not ready");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            std::fs::write(
                home.join(".claude/.credentials.json"),
                "{\"claudeAiOauth\":{\"refreshToken\":\"sk-ant-ort01-LATE-LOGIN-SECRET\"}}\n",
            )
            .unwrap();
            std::fs::write(proj.join("go"), "").unwrap();
            let o = Out::from(child.wait_with_output().unwrap());
            assert_eq!(o.code, 0, "{who} {}", o.stderr);
            assert!(
                !o.stdout.contains("LATE-LOGIN-SECRET"),
                "{who} {}",
                o.stdout
            );
            assert_ne!(o.value("read"), Some("0"), "{who} {}", o.stdout);
        }
    }
}

/// Claude Code's backups of `~/.claude.json` (with the key a console login saved) are masked,
/// and quietly: the agent lists them at every save of its configuration, which is no news for
/// the audit log or the model. A masked login is still reported.
#[test]
fn claude_codes_backups_are_masked_without_reports() {
    if !support::root_or_skip("the agents' logins") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (home, proj) = project(t.path(), "import \"preset:claude\"\n");
    std::fs::create_dir_all(home.join(".claude/backups")).unwrap();
    std::fs::write(
        home.join(".claude/backups/.claude.json.backup.1700000000000"),
        "{\"primaryApiKey\":\"sk-ant-api03-BACKUP-SECRET\"}\n",
    )
    .unwrap();
    std::fs::write(home.join(".claude/.credentials.json"), "{}\n").unwrap();
    // The reporting layer lands just after the start: each read is tried for 3 s.
    let script = "i=0; while [ $i -lt 30 ]; do cat ~/.claude/backups/* 2>&1; \
                  ls ~/.claude/backups 2>&1; cat ~/.claude/.credentials.json >/dev/null 2>&1; \
                  sleep 0.1; i=$((i+1)); done; sleep 0.5";
    let o = Out::from(
        aisb(t.path(), &home, &proj)
            .args([
                "--trust",
                "run",
                "--backend",
                "bwrap",
                "--",
                "sh",
                "-c",
                script,
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.contains("BACKUP-SECRET"), "{}", o.stdout);
    let files: Vec<String> = audit(t.path(), &home, &proj)
        .iter()
        .filter(|e| e["event"] == "file")
        .map(|e| e["target"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        !files.iter().any(|f| f.contains("backups")),
        "the backups' mask was reported: {files:?}"
    );
    assert!(
        files.iter().any(|f| f.ends_with(".credentials.json")),
        "the login's mask was not reported: {files:?}"
    );
}
