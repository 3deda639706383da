//! Typed readers of a node's arguments, properties and children, each reporting a wrong
//! kind or range at the value's span.

use kdl::{KdlEntry, KdlNode, KdlValue};

use super::Decoder;
use crate::config::diag::{suggest, Spanned};
use crate::config::domain::DomainRule;

pub(super) fn kind_of(v: &KdlValue) -> &'static str {
    match v {
        KdlValue::String(_) => "a string",
        KdlValue::Integer(_) => "an integer",
        KdlValue::Float(_) => "a number",
        KdlValue::Bool(_) => "a boolean",
        KdlValue::Null => "#null",
    }
}

impl Decoder<'_> {
    pub(super) fn args<'n>(
        &mut self,
        node: &'n KdlNode,
        min: usize,
        max: usize,
        what: &str,
    ) -> Vec<&'n KdlEntry> {
        let args: Vec<&KdlEntry> = node
            .entries()
            .iter()
            .filter(|e| e.name().is_none())
            .collect();
        let name = node.name().value();
        if args.len() < min {
            self.err(
                node.span(),
                format!("`{name}` needs {what}"),
                "missing argument",
                Some(format!("write `{name}` followed by {what}")),
            );
        } else if args.len() > max {
            let extra = args[max];
            let message = if max == 0 {
                format!("`{name}` takes no arguments")
            } else {
                format!(
                    "`{name}` takes at most {max} argument{}",
                    if max == 1 { "" } else { "s" }
                )
            };
            self.err(
                extra.span(),
                message,
                "unexpected argument",
                (!what.is_empty()).then(|| format!("`{name}` expects {what}")),
            );
            return args[..max].to_vec();
        }
        args
    }

    pub(super) fn prop<'n>(&mut self, node: &'n KdlNode, key: &str) -> Option<&'n KdlEntry> {
        node.entries()
            .iter()
            .rev()
            .find(|e| e.name().is_some_and(|n| n.value() == key))
    }

    pub(super) fn prop_string(&mut self, node: &KdlNode, key: &str) -> Option<Spanned<String>> {
        let e = self.prop(node, key)?;
        self.string(e)
    }

    pub(super) fn only_props(&mut self, node: &KdlNode, allowed: &[&str]) {
        for e in node.entries() {
            if let Some(n) = e.name() {
                if !allowed.contains(&n.value()) {
                    let help = match suggest(n.value(), allowed.iter().copied()) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None if allowed.is_empty() => {
                            format!("`{}` takes no properties", node.name().value())
                        }
                        None => format!("known properties: {}", allowed.join(", ")),
                    };
                    self.err(
                        n.span(),
                        format!(
                            "unknown property `{}` on `{}`",
                            n.value(),
                            node.name().value()
                        ),
                        "unknown property",
                        Some(help),
                    );
                }
            }
        }
    }

    pub(super) fn no_children(&mut self, node: &KdlNode) {
        if let Some(c) = node.children() {
            self.err(
                c.span(),
                format!("`{}` takes no children block", node.name().value()),
                "unexpected block",
                Some("remove the braces and put the values on the node's line".into()),
            );
        }
    }

    /// Children of a block node, with unknown names reported.
    pub(super) fn children<'n>(&mut self, node: &'n KdlNode, known: &[&str]) -> Vec<&'n KdlNode> {
        let mut out = Vec::new();
        let Some(doc) = node.children() else {
            return out;
        };
        for child in doc.nodes() {
            let name = child.name().value();
            if known.contains(&name) {
                out.push(child);
            } else {
                let help = match suggest(name, known.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("`{}` accepts: {}", node.name().value(), known.join(", ")),
                };
                self.err(
                    child.name().span(),
                    format!("unknown node `{name}` in `{}`", node.name().value()),
                    "unknown node",
                    Some(help),
                );
            }
        }
        out
    }

    /// A name, a path, a pattern or any other one-line value: control characters (a newline,
    /// an escape, NUL, …) are refused with the span. They would reach the outputs that
    /// quote these values (Kubernetes YAML, editor task files, JetBrains XML, CI annotations,
    /// shell scripts, the terminal) as structure rather than text.
    pub(super) fn string(&mut self, e: &KdlEntry) -> Option<Spanned<String>> {
        let s = self.text(e)?;
        if let Some(c) = s.value.chars().find(|c| is_control(*c)) {
            self.err(
                e.span(),
                format!(
                    "a control character ({}) in a name or path",
                    c.escape_unicode()
                ),
                "control character",
                Some("names, paths and patterns are one line of printable text: remove it".into()),
            );
            return None;
        }
        Some(s)
    }

    /// A string that may hold control characters other than NUL (a command's arguments, an
    /// environment variable's value).
    pub(super) fn text(&mut self, e: &KdlEntry) -> Option<Spanned<String>> {
        if let KdlValue::String(s) = e.value() {
            if s.contains('\0') {
                self.err(
                    e.span(),
                    "a NUL character in a string".to_string(),
                    "NUL",
                    Some("remove it: no program can be given one".into()),
                );
                return None;
            }
        }
        match e.value() {
            KdlValue::String(s) => Some(Spanned::new(s.clone(), self.loc(e.span()))),
            other => {
                self.err(
                    e.span(),
                    format!("expected a string, found {}", kind_of(other)),
                    "not a string",
                    Some("quote the value: \"…\"".into()),
                );
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, e: &KdlEntry) -> Option<Spanned<bool>> {
        match e.value() {
            KdlValue::Bool(b) => Some(Spanned::new(*b, self.loc(e.span()))),
            other => {
                self.err(
                    e.span(),
                    format!("expected a boolean, found {}", kind_of(other)),
                    "not a boolean",
                    Some("write #true or #false".into()),
                );
                None
            }
        }
    }

    /// `read-only` alone means `read-only #true`.
    pub(super) fn bool_arg_default_true(&mut self, node: &KdlNode) -> Option<Spanned<bool>> {
        match self.args(node, 0, 1, "#true or #false").first() {
            Some(e) => self.boolean(e),
            None => Some(Spanned::new(true, self.loc(node.span()))),
        }
    }

    pub(super) fn enumerated<T>(
        &mut self,
        e: &KdlEntry,
        names: &[&str],
        parse: fn(&str) -> Option<T>,
    ) -> Option<Spanned<T>> {
        let s = self.string(e)?;
        match parse(&s.value) {
            Some(v) => Some(Spanned::new(v, s.loc)),
            None => {
                let help = match suggest(&s.value, names.iter().copied()) {
                    Some(h) => format!("did you mean `{h}`?"),
                    None => format!("expected one of: {}", names.join(", ")),
                };
                self.err(
                    e.span(),
                    format!("unknown value `{}`", s.value),
                    "unknown value",
                    Some(help),
                );
                None
            }
        }
    }

    pub(super) fn integer(
        &mut self,
        e: &KdlEntry,
        what: &str,
        min: i128,
        max: i128,
    ) -> Option<i128> {
        match e.value() {
            KdlValue::Integer(i) if (min..=max).contains(i) => Some(*i),
            KdlValue::Integer(i) => {
                self.err(
                    e.span(),
                    format!("{i} is out of range for {what}"),
                    "out of range",
                    Some(format!("use a value between {min} and {max}")),
                );
                None
            }
            other => {
                self.err(
                    e.span(),
                    format!("expected {what}, found {}", kind_of(other)),
                    "not an integer",
                    None,
                );
                None
            }
        }
    }

    pub(super) fn port(&mut self, e: &KdlEntry) -> Option<Spanned<u16>> {
        let p = self.integer(e, "a port", 1, 65535)?;
        Some(Spanned::new(p as u16, self.loc(e.span())))
    }

    pub(super) fn id(&mut self, e: &KdlEntry) -> Option<Spanned<u32>> {
        let v = self.integer(e, "an id", 0, u32::MAX as i128 - 1)?;
        Some(Spanned::new(v as u32, self.loc(e.span())))
    }

    pub(super) fn limit(&mut self, e: &KdlEntry) -> Option<u64> {
        if let KdlValue::String(s) = e.value() {
            if s == "unlimited" {
                return Some(u64::MAX);
            }
        }
        self.integer(e, "a limit", 0, u64::MAX as i128)
            .map(|v| v as u64)
    }

    /// A size: bytes as an integer or a string with a K/M/G suffix.
    pub(super) fn size(&mut self, e: &KdlEntry) -> Option<u64> {
        if let KdlValue::String(s) = e.value() {
            if let Some(v) = parse_size(s) {
                return Some(v);
            }
            self.err(
                e.span(),
                format!("invalid size `{s}`"),
                "bad size",
                Some("write a number of bytes, or e.g. \"512M\", \"2G\"".into()),
            );
            return None;
        }
        self.integer(e, "a size", 1, u64::MAX as i128)
            .map(|v| v as u64)
    }

    pub(super) fn domain(&mut self, e: &KdlEntry) -> Option<Spanned<String>> {
        let s = self.string(e)?;
        match DomainRule::parse(&s.value) {
            Ok(_) => Some(s),
            Err(err) => {
                self.err(
                    e.span(),
                    format!("invalid domain `{}`: {err}", s.value),
                    "bad domain",
                    Some(err.help().into()),
                );
                None
            }
        }
    }
}

pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let mult = match s[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return None,
            };
            (&s[..i], mult)
        }
    };
    num.parse::<u64>()
        .ok()?
        .checked_mul(mult)
        .filter(|v| *v > 0)
}

pub fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(super) fn is_env_glob(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '*' || c == '?')
}

/// C0 and C1 controls, DEL, and the Unicode line and paragraph separators.
pub(super) fn is_control(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}
