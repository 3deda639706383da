//! Path patterns for `block`, `allow` and `secrets tool-dirs`. Syntax (close to .gitignore): relative to the project root; a pattern without `/`
//! matches a name at any depth (`.env`, `*.pem`); a pattern with `/` inside is anchored at the
//! project root (`config/prod.yml`, `./secrets.txt`); a trailing `/` matches directories only;
//! `*` and `?` never cross `/`, `**` does. Patterns starting with `/` or `~/` name paths outside
//! the project literally (no wildcards: we never walk outside the project).

use globset::{Glob, GlobBuilder};

/// Is this pattern acceptable? Returns a short reason when not.
pub fn validate(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("empty pattern".into());
    }
    if is_outside(p) {
        if p.contains(['*', '?', '[', '{']) {
            return Err("wildcards are only allowed in project-relative patterns".into());
        }
        return Ok(());
    }
    if p.split('/').any(|c| c == "..") {
        return Err("`..` may not appear in a pattern".into());
    }
    glob_for(p).map(|_| ()).map_err(|e| e.kind().to_string())
}

/// Patterns naming a path outside the project: `/abs/path`, `~/x`, `$HOME/x`, `${…}`.
pub fn is_outside(p: &str) -> bool {
    p.starts_with('/') || p.starts_with("~/") || p == "~" || p.starts_with('$')
}

pub fn glob_for(p: &str) -> Result<Glob, globset::Error> {
    let body = p.trim_end_matches('/');
    // A `/` anywhere but at the end anchors the pattern at the project root (`./x` too).
    let anchored = body.contains('/');
    let body = body.strip_prefix("./").unwrap_or(body);
    let full = if anchored {
        body.to_string()
    } else {
        format!("**/{body}")
    };
    GlobBuilder::new(&full)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

/// `*` (any run, also empty) and `?` (one byte) against `text`; greedy with backtracking to
/// the last `*`, linear in practice.
pub fn wildcard(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(validate("*.pem").is_ok());
        assert!(validate("~/.config/gcloud").is_ok());
        assert!(validate("~/.config/*").is_err());
        assert!(validate("../x").is_err());
        assert!(validate("a/[b").is_err());
        assert!(validate("").is_err());
    }
}
