//! Variable expansion in paths and values: `$NAME`, `${NAME}`, `${NAME:-default}`, `$$` for a
//! literal `$`, and a leading `~` / `~/` for the home directory.
//!
//! Built-in names (`HOME`, `PROJECT`, `USER`, `UID`, `GID`, `XDG_CACHE_HOME`, `XDG_CONFIG_HOME`,
//! `XDG_DATA_HOME`, `XDG_STATE_HOME`) win over the caller's environment; any other name is
//! looked up in the caller's environment. An unknown name without a default is an error.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VarError {
    #[error("undefined variable `${0}`")]
    Undefined(String),
    #[error("unterminated `${{` in `{0}`")]
    Unterminated(String),
    #[error("invalid variable name `{0}`")]
    BadName(String),
}

impl VarError {
    pub fn help(&self) -> String {
        match self {
            VarError::Undefined(n) => {
                format!("set {n} in the environment, or give a default: ${{{n}:-value}}")
            }
            VarError::Unterminated(_) => "close it: ${NAME} or ${NAME:-default}".into(),
            VarError::BadName(_) => {
                "names are letters, digits and `_`; write `$$` for a literal `$`".into()
            }
        }
    }
}

pub struct Vars<'a> {
    pub builtins: BTreeMap<&'static str, String>,
    pub env: &'a BTreeMap<String, String>,
    /// The caller's variables (not the built-ins) expansions have read, in order: a
    /// configuration that copies one into the sandbox is handing it the caller's value.
    pub used: std::cell::RefCell<Vec<String>>,
}

impl Vars<'_> {
    fn lookup(&self, name: &str) -> Option<&str> {
        if let Some(v) = self.builtins.get(name) {
            return Some(v);
        }
        let v = self.env.get(name).map(String::as_str);
        if v.is_some() {
            self.used.borrow_mut().push(name.to_string());
        }
        v
    }

    pub fn expand(&self, input: &str) -> Result<String, VarError> {
        let mut out = String::with_capacity(input.len());
        let rest = if input == "~" {
            out.push_str(self.lookup("HOME").unwrap_or(""));
            ""
        } else if let Some(r) = input.strip_prefix("~/") {
            out.push_str(
                self.lookup("HOME")
                    .ok_or_else(|| VarError::Undefined("HOME".into()))?,
            );
            out.push('/');
            r
        } else {
            input
        };
        let mut chars = rest.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '$' {
                out.push(c);
                continue;
            }
            match chars.peek().map(|&(_, c)| c) {
                Some('$') => {
                    chars.next();
                    out.push('$');
                }
                Some('{') => {
                    let body_start = i + 2;
                    let Some(close) = rest[body_start..].find('}') else {
                        return Err(VarError::Unterminated(input.to_string()));
                    };
                    let body = &rest[body_start..body_start + close];
                    let (name, default) = match body.split_once(":-") {
                        Some((n, d)) => (n, Some(d)),
                        None => (body, None),
                    };
                    if !crate::config::decode::is_env_name(name) {
                        return Err(VarError::BadName(name.to_string()));
                    }
                    match (
                        self.lookup(name)
                            .filter(|v| !v.is_empty() || default.is_none()),
                        default,
                    ) {
                        (Some(v), _) => out.push_str(v),
                        (None, Some(d)) => out.push_str(&self.expand_default(d)?),
                        (None, None) => return Err(VarError::Undefined(name.to_string())),
                    }
                    while chars.peek().is_some_and(|&(j, _)| j <= body_start + close) {
                        chars.next();
                    }
                }
                Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                    let start = i + 1;
                    let mut end = start;
                    while let Some(&(j, c)) = chars.peek() {
                        if c.is_ascii_alphanumeric() || c == '_' {
                            end = j + c.len_utf8();
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    let name = &rest[start..end];
                    out.push_str(
                        self.lookup(name)
                            .ok_or_else(|| VarError::Undefined(name.to_string()))?,
                    );
                }
                _ => return Err(VarError::BadName(rest[i..].chars().take(8).collect())),
            }
        }
        Ok(out)
    }

    /// Defaults may themselves use variables (`${XDG_CACHE_HOME:-$HOME/.cache}`).
    fn expand_default(&self, d: &str) -> Result<String, VarError> {
        self.expand(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(env: &BTreeMap<String, String>) -> Vars<'_> {
        let mut builtins = BTreeMap::new();
        builtins.insert("HOME", "/home/u".to_string());
        builtins.insert("PROJECT", "/src/p".to_string());
        Vars {
            builtins,
            env,
            used: Default::default(),
        }
    }

    #[test]
    fn expands() {
        let env = BTreeMap::from([
            ("FOO".to_string(), "bar".to_string()),
            ("EMPTY".to_string(), String::new()),
        ]);
        let v = vars(&env);
        assert_eq!(v.expand("~/.claude").unwrap(), "/home/u/.claude");
        assert_eq!(v.expand("$PROJECT/x").unwrap(), "/src/p/x");
        assert_eq!(v.expand("${FOO}baz").unwrap(), "barbaz");
        assert_eq!(v.expand("${NOPE:-$HOME/d}").unwrap(), "/home/u/d");
        assert_eq!(v.expand("${EMPTY:-dflt}").unwrap(), "dflt");
        assert_eq!(v.expand("a$$b").unwrap(), "a$b");
        assert_eq!(v.expand("pre~/x").unwrap(), "pre~/x");
        assert_eq!(v.expand("ünï$FOO").unwrap(), "ünïbar");
    }

    #[test]
    fn errors() {
        let env = BTreeMap::new();
        let v = vars(&env);
        assert_eq!(v.expand("$NOPE"), Err(VarError::Undefined("NOPE".into())));
        assert_eq!(
            v.expand("${HOME"),
            Err(VarError::Unterminated("${HOME".into()))
        );
        assert_eq!(v.expand("${1x}"), Err(VarError::BadName("1x".into())));
        assert!(matches!(v.expand("$ x"), Err(VarError::BadName(_))));
    }
}
