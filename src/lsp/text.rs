//! What the language server reads from a sandbox.kdl text that may not parse (the user is
//! typing): where the cursor is in the nesting, the word or string under it, where names are
//! defined, and the documentation of each node from `sandbox.kdl.example`.

use std::collections::HashMap;

use lsp_types::Position;

/// The byte offset of an LSP position (UTF-16 columns), clamped to the text.
pub fn offset(text: &str, pos: Position) -> usize {
    let mut line_start = 0;
    for _ in 0..pos.line {
        match text[line_start..].find('\n') {
            Some(i) => line_start += i + 1,
            None => return text.len(),
        }
    }
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let mut units = 0;
    for (i, c) in text[line_start..line_end].char_indices() {
        if units >= pos.character as usize {
            return line_start + i;
        }
        units += c.len_utf16();
    }
    line_end
}

/// The LSP position of a byte offset.
pub fn position(text: &str, offset: usize) -> Position {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count();
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let character: usize = before[start..].chars().map(char::len_utf16).sum();
    Position::new(line as u32, character as u32)
}

/// Where the cursor is: the names of the blocks around it (outermost first), and what it is
/// typing.
#[derive(Debug, PartialEq, Eq)]
pub struct Cursor {
    pub path: Vec<String>,
    /// The node the cursor is on, when it is past that node's name.
    pub node: Option<String>,
    /// The property being given a value (`access=` at the cursor).
    pub prop: Option<String>,
    /// The partial word at the cursor.
    pub word: String,
}

/// Scan `text` up to `at`: strings, comments and braces tracked, so an unclosed block or a
/// half-typed node still gives the right context. Bounded by the text's length.
pub fn cursor(text: &str, at: usize) -> Cursor {
    let at = at.min(text.len());
    let b = text.as_bytes();
    let mut path: Vec<String> = Vec::new();
    // The tokens of the statement being read.
    let mut stmt: Vec<String> = Vec::new();
    let mut tok = String::new();
    let mut i = 0;
    let flush = |tok: &mut String, stmt: &mut Vec<String>| {
        if !tok.is_empty() {
            stmt.push(std::mem::take(tok));
        }
    };
    while i < at {
        let c = b[i];
        match c {
            b'"' => {
                let start = i;
                i += 1;
                while i < at && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                tok.push_str(&text[start..(i + 1).min(at).min(text.len())]);
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < at && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < at && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 1;
            }
            b'{' => {
                flush(&mut tok, &mut stmt);
                path.push(stmt.first().cloned().unwrap_or_default());
                stmt.clear();
            }
            b'}' => {
                flush(&mut tok, &mut stmt);
                path.pop();
                stmt.clear();
            }
            b'\n' | b';' => {
                flush(&mut tok, &mut stmt);
                stmt.clear();
            }
            b' ' | b'\t' | b'\r' => flush(&mut tok, &mut stmt),
            _ => {
                let len = text[i..].chars().next().map_or(1, char::len_utf8);
                tok.push_str(&text[i..(i + len).min(text.len())]);
                i += len;
                continue;
            }
        }
        i += 1;
    }
    let (node, prop, word) = match stmt.first() {
        None => (None, None, tok),
        Some(first) => {
            let (prop, word) = match tok.split_once('=') {
                Some((p, v)) => (Some(p.to_string()), v.to_string()),
                None => (None, tok),
            };
            (Some(first.clone()), prop, word)
        }
    };
    Cursor {
        path,
        node,
        prop,
        word,
    }
}

/// The word or quoted string at `at` (its text without quotes, and its byte range).
pub fn word_at(text: &str, at: usize) -> Option<(String, std::ops::Range<usize>)> {
    let at = at.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let line = &text[line_start..line_end];
    let rel = at - line_start;
    // Inside a string?
    let mut in_str = None;
    let mut i = 0;
    let lb = line.as_bytes();
    while i < lb.len() {
        if lb[i] == b'"' {
            let s = i;
            i += 1;
            while i < lb.len() && lb[i] != b'"' {
                i += if lb[i] == b'\\' { 2 } else { 1 };
            }
            if (s..=i.min(lb.len())).contains(&rel) {
                in_str = Some((s + 1, i.min(lb.len())));
                break;
            }
        } else if lb[i] == b'/' && lb.get(i + 1) == Some(&b'/') {
            break;
        }
        i += 1;
    }
    let (s, e) = match in_str {
        Some(r) => r,
        None => {
            let is_word = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
            let s = line[..rel]
                .char_indices()
                .rev()
                .take_while(|(_, c)| is_word(*c))
                .last()
                .map_or(rel, |(i, _)| i);
            let e = line[rel..]
                .char_indices()
                .find(|(_, c)| !is_word(*c))
                .map_or(line.len(), |(i, _)| rel + i);
            (s, e)
        }
    };
    (s < e).then(|| (line[s..e].to_string(), line_start + s..line_start + e))
}

/// The nodes that define a name: `profile "N"`, `domains "N"`, `task "N"`, `image "N"`.
pub const DEFINERS: [&str; 4] = ["profile", "domains", "task", "image"];

/// Where `name` is defined in `text` by one of `kinds`: the byte range of the name.
pub fn definition(text: &str, kinds: &[&str], name: &str) -> Option<std::ops::Range<usize>> {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        for kind in kinds {
            let Some(rest) = trimmed.strip_prefix(kind) else {
                continue;
            };
            let quoted = format!("\"{name}\"");
            let rest_t = rest.trim_start();
            if rest.len() != rest_t.len() && rest_t.starts_with(&quoted) {
                let start = at + indent + kind.len() + (rest.len() - rest_t.len()) + 1;
                return Some(start..start + name.len());
            }
        }
        at += line.len();
    }
    None
}

/// Each node's documentation: the comment block above its first appearance in
/// `sandbox.kdl.example` (commented-out examples count), that line, and its trailing comment.
pub fn docs(example: &str, names: &[&str]) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = HashMap::new();
    let lines: Vec<&str> = example.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let code = t.strip_prefix("// ").unwrap_or(t);
        let first = code.split([' ', '{', '=']).next().unwrap_or("");
        if !names.contains(&first) || out.contains_key(first) {
            continue;
        }
        // A commented-out example inside a comment block counts only as a line of its own.
        if t.starts_with("//") && !code.contains('"') && !code.contains('{') && !code.contains('#')
        {
            continue;
        }
        let mut above = Vec::new();
        let mut j = i;
        while j > 0 {
            let p = lines[j - 1].trim_start();
            if !p.starts_with("//") || p.starts_with("// ----") {
                break;
            }
            above.push(p.trim_start_matches('/').trim());
            j -= 1;
        }
        above.reverse();
        let mut doc = String::new();
        if !above.is_empty() {
            doc.push_str(&above.join("\n"));
            doc.push_str("\n\n");
        }
        doc.push_str("```kdl\n");
        doc.push_str(code.trim_end());
        doc.push_str("\n```");
        out.insert(first.to_string(), doc);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_in_utf16() {
        let t = "a\n é𝄞x\n";
        for off in [0, 1, 2, 3, 5, 9, 10] {
            assert_eq!(offset(t, position(t, off)), off, "{off}");
        }
        assert_eq!(position(t, 9), Position::new(1, 4));
    }

    #[test]
    fn the_cursor_knows_its_block_even_unclosed() {
        let t = "profile \"x\" {\n    network {\n        al";
        let c = cursor(t, t.len());
        assert_eq!(c.path, ["profile", "network"]);
        assert_eq!(c.node, None);
        assert_eq!(c.word, "al");
        let t = "mount \"/a\" access=r";
        let c = cursor(t, t.len());
        assert_eq!(c.node.as_deref(), Some("mount"));
        assert_eq!(c.prop.as_deref(), Some("access"));
        assert_eq!(c.word, "r");
        let t = "env { // {\n set \"A\" \"}\" }\nho";
        assert_eq!(cursor(t, t.len()).path, Vec::<String>::new());
    }

    #[test]
    fn definitions_are_found_by_kind_and_name() {
        let t = "task \"t\" {\n}\nprofile \"review\" extends=\"x\" {\n}\n";
        let r = definition(t, &["profile"], "review").unwrap();
        assert_eq!(&t[r], "review");
        assert!(definition(t, &["profile"], "t").is_none());
    }
}
