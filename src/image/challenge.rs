//! `WWW-Authenticate` challenges as RFC 7235 §4.1 (with RFC 7230's quoted strings) defines
//! them: a header holds one or more challenges, commas separate both the challenges and a
//! challenge's parameters, and a quoted value may hold commas, `=` and `\`-escaped quotes
//! (`scope="repository:a:pull,push"` is one parameter). Schemes and parameter names are
//! case-insensitive: both come back lowercase.
//!
//! ```text
//! challenge  = auth-scheme [ 1*SP ( token68 / #auth-param ) ]
//! auth-param = token BWS "=" BWS ( token / quoted-string )
//! token68    = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
//! ```

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Lowercase (`bearer`, `basic`).
    pub scheme: String,
    /// Names lowercase, values unquoted and unescaped, in the order given.
    pub params: Vec<(String, String)>,
    pub token68: Option<String>,
}

impl Challenge {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed WWW-Authenticate header at character {at}: {problem}")]
pub struct ChallengeError {
    pub at: usize,
    pub problem: &'static str,
}

/// Every challenge in `header`, in order.
pub fn parse(header: &str) -> Result<Vec<Challenge>, ChallengeError> {
    let mut p = Parser {
        chars: header.chars().collect(),
        at: 0,
    };
    let mut out = Vec::new();
    loop {
        // A list may hold empty elements (`, ,`).
        p.skip_while(|c| c == ',' || is_ows(c));
        if p.done() {
            break;
        }
        let scheme = p
            .token()
            .ok_or(p.error("expected an authentication scheme"))?;
        let mut challenge = Challenge {
            scheme: scheme.to_ascii_lowercase(),
            params: Vec::new(),
            token68: None,
        };
        if p.peek() == Some(' ') {
            p.skip_while(|c| c == ' ');
            if let Some(t) = p.try_token68() {
                challenge.token68 = Some(t);
            } else {
                p.params(&mut challenge)?;
            }
        }
        p.skip_while(is_ows);
        match p.peek() {
            None | Some(',') => {}
            Some(_) => return Err(p.error("expected `,` between challenges")),
        }
        out.push(challenge);
    }
    Ok(out)
}

struct Parser {
    chars: Vec<char>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn done(&self) -> bool {
        self.at >= self.chars.len()
    }

    fn error(&self, problem: &'static str) -> ChallengeError {
        ChallengeError {
            at: self.at,
            problem,
        }
    }

    fn skip_while(&mut self, f: impl Fn(char) -> bool) {
        while self.peek().is_some_and(&f) {
            self.at += 1;
        }
    }

    fn token(&mut self) -> Option<String> {
        let start = self.at;
        self.skip_while(is_tchar);
        (self.at > start).then(|| self.chars[start..self.at].iter().collect())
    }

    /// A token68 credential, when what follows is one and not a parameter list (it ends at
    /// the end of the header or at a `,`).
    fn try_token68(&mut self) -> Option<String> {
        let start = self.at;
        self.skip_while(|c| c.is_ascii_alphanumeric() || "-._~+/".contains(c));
        if self.at == start {
            return None;
        }
        self.skip_while(|c| c == '=');
        let end = self.at;
        self.skip_while(is_ows);
        if self.done() || self.peek() == Some(',') {
            return Some(self.chars[start..end].iter().collect());
        }
        self.at = start;
        None
    }

    /// `#auth-param`. After a comma, a token not followed by `=` starts the next challenge:
    /// the position is left before it.
    fn params(&mut self, challenge: &mut Challenge) -> Result<(), ChallengeError> {
        loop {
            let before = self.at;
            self.skip_while(|c| c == ',' || is_ows(c));
            let Some(name) = self.token() else {
                self.at = before;
                return Ok(());
            };
            self.skip_while(is_ows);
            if self.peek() != Some('=') {
                self.at = before;
                return Ok(());
            }
            self.at += 1;
            self.skip_while(is_ows);
            let value = if self.peek() == Some('"') {
                self.quoted()?
            } else {
                self.token()
                    .ok_or(self.error("expected a token or a quoted string after `=`"))?
            };
            let name = name.to_ascii_lowercase();
            if challenge.param(&name).is_some() {
                return Err(self.error("a parameter is given twice in one challenge"));
            }
            challenge.params.push((name, value));
            self.skip_while(is_ows);
            match self.peek() {
                Some(',') => {}
                _ => return Ok(()),
            }
        }
    }

    fn quoted(&mut self) -> Result<String, ChallengeError> {
        self.at += 1; // the opening quote
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("a quoted string is not closed")),
                Some('"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some('\\') => {
                    self.at += 1;
                    match self.peek() {
                        Some(c) if is_qchar(c) => out.push(c),
                        _ => return Err(self.error("a `\\` escapes nothing")),
                    }
                    self.at += 1;
                }
                Some(c) if is_qchar(c) => {
                    out.push(c);
                    self.at += 1;
                }
                Some(_) => return Err(self.error("a control character in a quoted string")),
            }
        }
    }
}

fn is_ows(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// qdtext and what a quoted-pair may escape: HTAB, SP, visible ASCII, obs-text.
fn is_qchar(c: char) -> bool {
    c == '\t' || c == ' ' || (c.is_ascii_graphic()) || !c.is_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(c: &Challenge) -> Vec<(&str, &str)> {
        c.params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn a_quoted_comma_is_part_of_the_value() {
        let c = parse(r#"Bearer realm="https://auth.example/token",service="reg",scope="repository:a/b:pull,push""#).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].scheme, "bearer");
        assert_eq!(
            params(&c[0]),
            [
                ("realm", "https://auth.example/token"),
                ("service", "reg"),
                ("scope", "repository:a/b:pull,push")
            ]
        );
    }

    #[test]
    fn several_challenges_escapes_and_any_case() {
        let c = parse(
            "Basic realm=\"x, y\", BEARER Realm = \"https://a/t\" ,Service=svc,scope=\"q\\\"uote\\\\d\", Negotiate abc+/==",
        )
        .unwrap();
        assert_eq!(
            c.iter().map(|c| c.scheme.as_str()).collect::<Vec<_>>(),
            ["basic", "bearer", "negotiate"]
        );
        assert_eq!(params(&c[0]), [("realm", "x, y")]);
        assert_eq!(
            params(&c[1]),
            [
                ("realm", "https://a/t"),
                ("service", "svc"),
                ("scope", "q\"uote\\d")
            ]
        );
        assert_eq!(c[2].token68.as_deref(), Some("abc+/=="));
        assert_eq!(parse("Bearer").unwrap()[0].params, []);
        // By the grammar, `x=` alone is a token68 (base64 padding), not an empty parameter.
        assert_eq!(
            parse("Bearer x=").unwrap()[0].token68.as_deref(),
            Some("x=")
        );
    }

    #[test]
    fn malformed_headers_are_errors() {
        for bad in [
            "Bearer realm=\"open",
            "Bearer realm=\"a\", =x",
            "Bearer realm=\"a\" junk",
            "Bearer realm=\"a\",realm=\"b\"",
            "=x",
            "Bearer realm=\"a\u{1}\"",
            "Bearer realm=\"a\\",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed: {:?}", parse(bad));
        }
    }
}
