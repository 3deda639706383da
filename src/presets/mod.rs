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

/// The agent preset for a command line (`claude -p …` -> `claude`), if its program is one.
pub fn agent_for(command: &[String]) -> Option<&'static str> {
    let program = std::path::Path::new(command.first()?)
        .file_name()?
        .to_str()?;
    AGENTS.iter().copied().find(|a| *a == program)
}
