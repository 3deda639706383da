//! How deeply a KDL text nests its children blocks, found before the KDL parser sees it: the
//! parser recurses once per level, and a sandbox.kdl (checked in, so untrusted) of a few
//! hundred `a{` overflowed aisb's stack (an abort, not an error). The language nests three
//! levels at most (`profile { network { allow … } }`), so a text past [`MAX_DEPTH`] is refused
//! with a diagnostic at the brace that goes too deep.
//!
//! The scan skips what may hold a brace without opening a block: quoted and raw strings and
//! comments. Where it cannot tell (text the parser would reject anyway), it may count a brace
//! that is none; with a limit this far above any real file, that never refuses a valid one.

/// Deeper than any configuration needs, far below where the parser runs out of stack (about
/// 300 levels on an 8 MiB stack in a debug build).
pub const MAX_DEPTH: usize = 32;

/// The byte offset of the first `{` that opens level `MAX_DEPTH + 1`, if there is one.
pub fn too_deep(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(i);
                }
                i += 1;
            }
            b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |n| i + n);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => i = skip_block_comment(b, i),
            b'"' => i = skip_quoted(b, i),
            b'#' => i = skip_raw(b, i),
            _ => i += 1,
        }
    }
    None
}

/// Past a `/* … */` comment (they nest) starting at `i`.
fn skip_block_comment(b: &[u8], mut i: usize) -> usize {
    let mut open = 0usize;
    while i < b.len() {
        if b[i..].starts_with(b"/*") {
            open += 1;
            i += 2;
        } else if b[i..].starts_with(b"*/") {
            open -= 1;
            i += 2;
            if open == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// Past a quoted string starting at `i` (backslash escapes; a multi-line `"""` string reads
/// as an empty string, its text, and another empty string).
fn skip_quoted(b: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Past a raw string `#"…"#` (any number of `#`) starting at `i`; past the `#`s alone when
/// they start something else (`#true`, `#null`).
fn skip_raw(b: &[u8], i: usize) -> usize {
    let hashes = b[i..].iter().take_while(|&&c| c == b'#').count();
    let open = i + hashes;
    if b.get(open) != Some(&b'"') {
        return open;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = open + 1;
    b[body..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map_or(b.len(), |n| body + n + close.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_blocks_not_braces_in_strings_or_comments() {
        let nested = |n: usize| "a{".repeat(n) + &"}".repeat(n);
        assert_eq!(too_deep(&nested(MAX_DEPTH)), None);
        assert_eq!(too_deep(&nested(MAX_DEPTH + 1)), Some(2 * MAX_DEPTH + 1));
        let braces = "{".repeat(100);
        for hidden in [
            format!("run \"{braces}\"\n"),
            format!("run \"\\\"{braces}\"\n"),
            format!("run #\"\"{braces}\"#\n"),
            format!("run ##\"\"#{braces}\"##\n"),
            format!("// {braces}\nx\n"),
            format!("/* /* */ {braces} */ x\n"),
            format!("run \"\"\"\n{braces}\n\"\"\"\n"),
        ] {
            assert_eq!(too_deep(&hidden), None, "{hidden}");
        }
        assert_eq!(too_deep(&format!("#true {braces}")), Some(6 + MAX_DEPTH));
    }
}
