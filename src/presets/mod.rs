//! Built-in presets, embedded in the binary: `import "preset:NAME"`.

const PRESETS: &[(&str, &str)] = &[
    ("default", include_str!("default.kdl")),
    ("profiles", include_str!("profiles.kdl")),
    ("claude", include_str!("claude.kdl")),
    ("codex", include_str!("codex.kdl")),
    ("aider", include_str!("aider.kdl")),
    ("opencode", include_str!("opencode.kdl")),
    ("gemini", include_str!("gemini.kdl")),
];

pub fn get(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

pub fn names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|(n, _)| *n)
}

/// The presets that describe an agent, by the name of its program.
pub const AGENTS: &[&str] = &["claude", "codex", "aider", "opencode", "gemini"];

/// The packages that install an agent's program, for the package runners (`npx
/// @anthropic-ai/claude-code`).
const PACKAGES: &[(&str, &str)] = &[
    ("@anthropic-ai/claude-code", "claude"),
    ("@openai/codex", "codex"),
    ("aider-chat", "aider"),
    ("aider-install", "aider"),
    ("opencode-ai", "opencode"),
    ("@google/gemini-cli", "gemini"),
];

/// How many wrappers (`env`, `npx`, `nice`, …) are looked through before giving up: a
/// command line is the user's, but its length is not bounded otherwise.
const WRAPPERS_MAX: usize = 8;

/// The agent preset for a command line (`claude -p …` -> `claude`), if its program is one,
/// directly or through the usual wrappers: `env X=1 claude`, `npx -y @anthropic-ai/claude-code`,
/// `pnpm dlx`, `bunx`, `uvx --from aider-chat aider`, `pipx run`, `python3 -m aider`, `nice`,
/// `nohup`, `timeout 1h`, `setsid`, `stdbuf -oL`.
pub fn agent_for(command: &[String]) -> Option<&'static str> {
    let mut rest = command;
    for _ in 0..WRAPPERS_MAX {
        let program = std::path::Path::new(rest.first()?).file_name()?.to_str()?;
        if let Some(a) = AGENTS.iter().copied().find(|a| *a == program) {
            return Some(a);
        }
        let args = &rest[1..];
        // Options of a wrapper that take a value as the next word.
        let (valued, after): (&[&str], usize) = match program {
            "env" => (
                &["-u", "--unset", "-C", "--chdir", "-S", "--split-string"],
                0,
            ),
            "nice" => (&["-n", "--adjustment"], 0),
            "timeout" => (&["-s", "--signal", "-k", "--kill-after"], 1),
            "stdbuf" => (&["-i", "-o", "-e"], 0),
            "nohup" | "setsid" | "time" | "exec" => (&[], 0),
            "npx" | "bunx" | "pnpx" => (&["-p", "--package", "-c", "--call"], 0),
            "uvx" => (&["--from", "--with", "--python", "-p"], 0),
            "pnpm" | "yarn" | "bun" | "pipx" | "uv" => {
                // `pnpm dlx X`, `yarn dlx X`, `bun x X`, `pipx run X`, `uv tool run X`.
                let sub = match (program, args.first().map(String::as_str)) {
                    ("pnpm" | "yarn", Some("dlx")) | ("bun", Some("x")) | ("pipx", Some("run")) => {
                        1
                    }
                    ("uv", Some("tool")) if args.get(1).is_some_and(|a| a == "run") => 2,
                    _ => return None,
                };
                rest = &args[sub..];
                continue;
            }
            "python" | "python3" => {
                // `python3 -m aider`: the module is the program.
                let m = args.iter().position(|a| a == "-m")?;
                let module = args.get(m + 1)?;
                return AGENTS.iter().copied().find(|a| a == module);
            }
            // A package runner's package (`@anthropic-ai/claude-code`: the whole word).
            _ => return package_agent(&rest[0]),
        };
        let mut i = 0;
        while let Some(a) = args.get(i) {
            if valued.contains(&a.as_str()) {
                // A package named by its option is the program's package.
                if matches!(a.as_str(), "-p" | "--package" | "--from") {
                    if let Some(found) = args.get(i + 1).and_then(|p| package_agent(p)) {
                        return Some(found);
                    }
                }
                i += 2;
            } else if (a.starts_with('-') && a.len() > 1) || (program == "env" && a.contains('=')) {
                // An option, or one of env's assignments.
                i += 1;
            } else {
                break;
            }
        }
        rest = args.get(i + after..)?;
    }
    None
}

/// The agent a package (or program) name stands for, its version stripped
/// (`@anthropic-ai/claude-code@1.2.3`, `aider-chat==0.80`).
fn package_agent(spec: &str) -> Option<&'static str> {
    let name = match spec.strip_prefix('@') {
        Some(scoped) => &spec[..1 + scoped.find('@').unwrap_or(scoped.len())],
        None => spec.split(['@', '=', '<', '>', '~', '[']).next()?,
    };
    PACKAGES
        .iter()
        .find(|(p, _)| *p == name)
        .map(|(_, a)| *a)
        .or_else(|| AGENTS.iter().copied().find(|a| *a == name))
}

#[cfg(test)]
mod agent_tests {
    use super::agent_for;

    fn of(line: &str) -> Option<&'static str> {
        agent_for(&line.split(' ').map(str::to_string).collect::<Vec<_>>())
    }

    #[test]
    fn agents_are_found_through_their_wrappers() {
        for (line, agent) in [
            ("claude -p hi", Some("claude")),
            ("/usr/local/bin/codex exec x", Some("codex")),
            ("env ANTHROPIC_LOG=debug claude", Some("claude")),
            ("env -i -u HOME X=1 gemini", Some("gemini")),
            ("npx -y @anthropic-ai/claude-code -p hi", Some("claude")),
            ("npx @anthropic-ai/claude-code@1.0.3", Some("claude")),
            ("npx -p @openai/codex codex", Some("codex")),
            ("pnpm dlx @google/gemini-cli", Some("gemini")),
            ("bunx opencode-ai run", Some("opencode")),
            ("bun x opencode-ai", Some("opencode")),
            ("uvx --from aider-chat aider", Some("aider")),
            ("uv tool run aider-chat", Some("aider")),
            ("pipx run aider-chat==0.80", Some("aider")),
            ("python3 -m aider --yes", Some("aider")),
            ("nice -n 5 timeout -s KILL 1h nohup claude", Some("claude")),
            ("stdbuf -o L setsid aider", Some("aider")),
            // Not agents: the agent's name as an argument, another package, a bare wrapper.
            ("echo claude", None),
            ("npx prettier claude", None),
            ("python3 aider.py", None),
            ("pnpm install claude", None),
            ("env", None),
            ("timeout 5", None),
            ("npx", None),
        ] {
            assert_eq!(of(line), agent, "{line}");
        }
        // Bounded: a hundred wrappers are not looked through.
        let deep = format!("{}claude", "env ".repeat(100));
        assert_eq!(of(&deep), None);
        assert_eq!(of(&format!("{}claude", "env ".repeat(3))), Some("claude"));
    }
}
