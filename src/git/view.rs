//! The sandbox's view of a repository's configuration: the host's `.git/config` without the
//! credentials git keeps there. A remote URL's `user:token@`, an `http.<url>.extraheader`
//! (what `actions/checkout` persists by default), any `credential.*` setting, a `url.<base>`
//! rewrite whose base carries a token, and `include`/`includeIf` (which would name a host
//! file) never reach the sandbox. Everything else is kept byte for byte, so git inside reads
//! the same remotes, branches and settings.
//!
//! A line parser, never git: git would follow the file's includes, and this file is one the
//! sandbox may have written in an earlier run.

/// Section names whose every key is dropped (lower case; `includeIf` folds to `includeif`).
const DROPPED_SECTIONS: &[&str] = &["credential", "include", "includeif"];

/// Key names (lower case, the last dotted part) dropped in any section: headers and tokens.
const DROPPED_KEYS: &[&str] = &["extraheader", "token", "password", "passwd", "oauthtoken"];

/// At most this much of a configuration file is read; a longer one is cut (git's own
/// configuration is never near it).
pub const MAX_CONFIG: usize = 1 << 20;

/// `text` without credentials (see the module's documentation).
pub fn credential_free(text: &[u8]) -> Vec<u8> {
    let text = &text[..text.len().min(MAX_CONFIG)];
    let mut out = Vec::with_capacity(text.len());
    let mut dropping_section = false;
    // The previous key line ended in a backslash: this line continues its value.
    let mut continued: Option<bool> = None;
    for line in text.split_inclusive(|b| *b == b'\n') {
        if let Some(keep) = continued {
            continued = ends_continued(line).then_some(keep);
            if keep {
                out.extend_from_slice(&strip_userinfo(line));
            }
            continue;
        }
        let trimmed = trim_start(line);
        let rest = if trimmed.first() == Some(&b'[') {
            let Some((name, sub, after)) = header(trimmed) else {
                // Not a header git would read either: dropped.
                dropping_section = true;
                continue;
            };
            dropping_section =
                DROPPED_SECTIONS.contains(&name.as_str()) || (name == "url" && has_userinfo(&sub));
            if dropping_section {
                continue;
            }
            let head_len = line.len() - after.len();
            out.extend_from_slice(&line[..head_len]);
            if trim_start(after).iter().all(|b| b.is_ascii_whitespace()) {
                out.extend_from_slice(after);
                continue;
            }
            after
        } else {
            line
        };
        let body = trim_start(rest);
        if body.is_empty() || body[0] == b'#' || body[0] == b';' {
            if !dropping_section {
                out.extend_from_slice(rest);
            }
            continue;
        }
        let key: String = body
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'-' || **b == b'.')
            .map(|b| b.to_ascii_lowercase() as char)
            .collect();
        let last = key.rsplit('.').next().unwrap_or_default();
        let keep = !dropping_section && !DROPPED_KEYS.contains(&last);
        continued = ends_continued(rest).then_some(keep);
        if keep {
            out.extend_from_slice(&strip_userinfo(rest));
        }
    }
    out
}

fn trim_start(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| **c == b' ' || **c == b'\t').count();
    &b[n..]
}

/// A line whose value goes on: it ends (before its newline) in an odd number of backslashes.
fn ends_continued(line: &[u8]) -> bool {
    let mut end = line;
    while let [rest @ .., b'\n' | b'\r'] = end {
        end = rest;
    }
    end.iter().rev().take_while(|b| **b == b'\\').count() % 2 == 1
}

/// `[name]`, `[name "sub"]` or `[name.sub]`: (name lower-cased, subsection, what follows the
/// closing bracket). None when the bracket never closes.
fn header(line: &[u8]) -> Option<(String, Vec<u8>, &[u8])> {
    let mut i = 1;
    let mut name = String::new();
    while i < line.len() && (line[i].is_ascii_alphanumeric() || line[i] == b'-' || line[i] == b'.')
    {
        name.push(line[i].to_ascii_lowercase() as char);
        i += 1;
    }
    let mut sub = Vec::new();
    while i < line.len() && (line[i] == b' ' || line[i] == b'\t') {
        i += 1;
    }
    if line.get(i) == Some(&b'"') {
        i += 1;
        while i < line.len() && line[i] != b'"' {
            if line[i] == b'\\' {
                i += 1;
            }
            if let Some(b) = line.get(i) {
                sub.push(*b);
            }
            i += 1;
        }
        i += 1;
    }
    if line.get(i) != Some(&b']') {
        return None;
    }
    if let Some((n, s)) = name.split_once('.') {
        // `[url.https://…]`, the old form: the rest is the subsection.
        sub.extend_from_slice(s.as_bytes());
        name = n.to_string();
    }
    Some((name, sub, &line[i + 1..]))
}

/// Whether `b` holds a URL with userinfo (`scheme://user[:secret]@host`).
fn has_userinfo(b: &[u8]) -> bool {
    strip_userinfo(b).len() != b.len()
}

/// Every `scheme://userinfo@` in `b` made `scheme://`.
fn strip_userinfo(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"://") {
            out.extend_from_slice(b"://");
            i += 3;
            // The authority ends at the first `/`, `?`, `#`, quote, space or line end.
            let end = b[i..]
                .iter()
                .position(|c| matches!(c, b'/' | b'?' | b'#' | b'"' | b' ' | b'\t' | b'\n' | b'\r'))
                .map_or(b.len(), |p| i + p);
            let authority = &b[i..end];
            let host = match authority.iter().rposition(|c| *c == b'@') {
                Some(at) => &authority[at + 1..],
                None => authority,
            };
            out.extend_from_slice(host);
            i = end;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::credential_free;

    fn view(s: &str) -> String {
        String::from_utf8(credential_free(s.as_bytes())).unwrap()
    }

    #[test]
    fn credentials_are_dropped_and_the_rest_kept() {
        let host = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\
            [remote \"origin\"]\n\turl = https://x-access-token:ghs_SECRET@github.com/o/r.git\n\
            \tfetch = +refs/heads/*:refs/remotes/origin/*\n\
            [http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic SECRET\n\
            [credential]\n\thelper = store\n[credential \"https://example.com\"]\n\tusername = me\n\
            [include]\n\tpath = /home/me/secret.inc\n[includeIf \"gitdir:~/w/\"]\n\tpath = x\n\
            [url \"https://me:SECRET@github.com/\"]\n\tinsteadOf = https://github.com/\n\
            [url \"git@github.com:\"]\n\tinsteadOf = gh:\n\
            [branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n";
        let v = view(host);
        assert!(!v.contains("SECRET"), "{v}");
        assert!(!v.contains("helper"), "{v}");
        assert!(!v.contains("/home/me"), "{v}");
        assert!(!v.contains("username"), "{v}");
        assert!(v.contains("url = https://github.com/o/r.git\n"), "{v}");
        assert!(
            v.contains("fetch = +refs/heads/*:refs/remotes/origin/*"),
            "{v}"
        );
        assert!(
            v.contains("[url \"git@github.com:\"]\n\tinsteadOf = gh:\n"),
            "{v}"
        );
        assert!(v.contains("[branch \"main\"]\n\tremote = origin\n"), "{v}");
        assert!(
            v.starts_with("[core]\n\trepositoryformatversion = 0\n"),
            "{v}"
        );
    }

    #[test]
    fn the_odd_forms_are_covered_too() {
        // A key on the header's line, the old dotted form, case, continuation lines.
        let v = view(
            "[Credential] Helper = store\n\
             [HTTP] ExtraHeader = a \\\n  SECRET\n\tsslVerify = true\n\
             [remote \"o\"] url = ssh://git:SECRET@host/r\n[github]\n\ttoken = SECRET\n\
             [lfs]\n\turl = \"https://u:SECRET@lfs.example/r\"\n[bad\n\tx = SECRET\n",
        );
        assert!(!v.contains("SECRET"), "{v}");
        assert!(!v.to_lowercase().contains("helper"), "{v}");
        assert!(v.contains("sslVerify = true"), "{v}");
        assert!(v.contains("[remote \"o\"] url = ssh://host/r\n"), "{v}");
        assert!(v.contains("url = \"https://lfs.example/r\""), "{v}");
    }

    #[test]
    fn nothing_to_drop_is_the_same_bytes() {
        let host = "[core]\n\tbare = false\n# a comment\n; another\n[remote \"o\"]\n\turl = git@github.com:o/r.git\n";
        assert_eq!(view(host), host);
    }
}
