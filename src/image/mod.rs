//! Sandbox images built without a daemon: a `Dockerfile` (a subset) or the same steps written
//! in KDL, on a base from an OCI image layout, an archive of one, or a registry. Every step is
//! a node of a graph, hashed from its inputs and realised into the store only when missing
//! (see [`graph`] for what each hash covers). Layers are overlay upper directories; a sandbox's
//! root is an overlay of them, mounted read-only, nothing copied.

pub mod challenge;
pub mod dockerfile;
pub mod egress;
pub mod graph;
pub mod layer;
pub mod lock;
pub mod oci;
pub mod progress;
pub mod reference;
pub mod rootmount;
pub mod sandbox;
pub mod statcache;
pub mod step;

/// The instructions are decoded by `config` (from KDL) and by [`dockerfile`]; an image is
/// built from them.
pub use crate::config::instr::{Cmd, Instr, Step};

use std::collections::BTreeMap;

use serde::Serialize;

/// Where an image's base comes from (the text after `FROM`, variables expanded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Source {
    /// `FROM scratch`: no layers.
    Scratch,
    /// `oci:DIR[:TAG]`: an OCI image layout directory.
    Layout {
        dir: std::path::PathBuf,
        tag: Option<String>,
    },
    /// `oci-archive:FILE[:TAG]`: a tar of an OCI image layout.
    Archive {
        file: std::path::PathBuf,
        tag: Option<String>,
    },
    /// A registry reference: `[HOST[:PORT]/]REPO[:TAG][@DIGEST]` (`docker://` optional).
    Registry(oci::Reference),
}

impl Source {
    /// Parse `text`; relative paths are relative to `base` (the build context).
    pub fn parse(text: &str, base: &std::path::Path) -> Result<Source, String> {
        let split_tag = |rest: &str| -> (std::path::PathBuf, Option<String>) {
            // A tag is what follows the last `:` after the last `/`.
            let (path, tag) = match rest.rsplit_once(':') {
                Some((p, t)) if !t.contains('/') && !t.is_empty() => (p, Some(t.to_string())),
                _ => (rest, None),
            };
            (base.join(path), tag)
        };
        if text == "scratch" {
            Ok(Source::Scratch)
        } else if let Some(rest) = text.strip_prefix("oci:") {
            let (dir, tag) = split_tag(rest);
            Ok(Source::Layout { dir, tag })
        } else if let Some(rest) = text.strip_prefix("oci-archive:") {
            let (file, tag) = split_tag(rest);
            Ok(Source::Archive { file, tag })
        } else {
            let r = text.strip_prefix("docker://").unwrap_or(text);
            oci::Reference::parse(r)
                .map(Source::Registry)
                .map_err(|e| e.to_string())
        }
    }
}

/// Expand `$NAME`, `${NAME}`, `${NAME:-default}` and `${NAME:+alt}` from `vars` the way the
/// Dockerfile's builder does (unset names become empty; `\$` is a literal `$`).
pub fn expand(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if b.get(i + 1) == Some(&b'$') => {
                out.push('$');
                i += 2;
            }
            b'$' if b.get(i + 1) == Some(&b'{') => {
                let Some(end) = s[i + 2..].find('}') else {
                    out.push_str(&s[i..]);
                    break;
                };
                let inner = &s[i + 2..i + 2 + end];
                let value = if let Some((name, default)) = inner.split_once(":-") {
                    vars.get(name)
                        .filter(|v| !v.is_empty())
                        .cloned()
                        .unwrap_or_else(|| expand(default, vars))
                } else if let Some((name, alt)) = inner.split_once(":+") {
                    if vars.get(name).is_some_and(|v| !v.is_empty()) {
                        expand(alt, vars)
                    } else {
                        String::new()
                    }
                } else {
                    vars.get(inner).cloned().unwrap_or_default()
                };
                out.push_str(&value);
                i += 3 + end;
            }
            b'$' if b
                .get(i + 1)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') =>
            {
                let len = s[i + 1..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(s.len() - i - 1);
                out.push_str(vars.get(&s[i + 1..i + 1 + len]).map_or("", |v| v));
                i += 1 + len;
            }
            _ => {
                let c = s[i..].chars().next().unwrap_or('\u{fffd}');
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// The build arguments aisb passes to every image so that its user matches the caller (seed
/// 004): `USER_NAME`, `USER_ID`, `GROUP_ID`, and the other spellings Dockerfiles use. Only
/// those an `ARG` line declares are visible to the build.
pub fn identity_args(id: &crate::eval::plan::Identity) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for k in ["USER_NAME", "USERNAME"] {
        m.insert(k.to_string(), id.name.clone());
    }
    for k in ["USER_ID", "USER_UID", "UID"] {
        m.insert(k.to_string(), id.uid.to_string());
    }
    for k in ["GROUP_ID", "USER_GID", "GID"] {
        m.insert(k.to_string(), id.gid.to_string());
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_the_dockerfile_rules() {
        let vars: BTreeMap<String, String> = [("A", "1"), ("E", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(expand("$A-${A}-$B-\\$A", &vars), "1-1--$A");
        assert_eq!(
            expand("${B:-x$A}|${E:-d}|${A:+y}|${B:+y}", &vars),
            "x1|d|y|"
        );
        assert_eq!(expand("a$", &vars), "a$");
        assert_eq!(expand("ünï$A", &vars), "ünï1");
    }

    #[test]
    fn sources() {
        let base = std::path::Path::new("/p");
        assert_eq!(Source::parse("scratch", base), Ok(Source::Scratch));
        assert_eq!(
            Source::parse("oci:img:v1", base),
            Ok(Source::Layout {
                dir: "/p/img".into(),
                tag: Some("v1".into())
            })
        );
        assert_eq!(
            Source::parse("oci-archive:/a/b.tar", base),
            Ok(Source::Archive {
                file: "/a/b.tar".into(),
                tag: None
            })
        );
        assert!(matches!(
            Source::parse("127.0.0.1:5000/base:1", base),
            Ok(Source::Registry(_))
        ));
    }
}
