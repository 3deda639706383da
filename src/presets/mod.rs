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
