//! libFuzzer target: the dotenv file that `env { from-file FILE KEYS… }` reads. The file is in
//! the project, which the sandbox writes. Through `aisb::eval::env::parse_dotenv` and through
//! a whole evaluation that names keys from it. Invariants: no panic; every line written as
//! `KEY="value"` comes back as exactly that value; and the sandbox's environment holds, for
//! each key named, the value the file gives it (the last assignment, as a shell sourcing the
//! file would), or evaluation fails naming the missing key.
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run -s none dotenv -- -max_total_time=60
#![no_main]

use aisb::config::Errors;
use aisb::eval::env::parse_dotenv;
use aisb::eval::{self, Request, Root};
use aisb_fuzz::fixture::fixture;
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

const KEYS: [&str; 6] = ["A", "B", "API_KEY", "export", "_x1", "PATH"];

#[derive(Arbitrary, Debug)]
enum Line {
    /// `KEY="value"` (value without a newline): must come back exactly.
    Quoted {
        export: bool,
        key: u8,
        value: String,
    },
    /// Anything else: comments, blank lines, `KEY=value` with odd spacing, junk.
    Any(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    lines: Vec<Line>,
    /// Keys `from-file` names (indices into KEYS).
    named: Vec<u8>,
}

fuzz_target!(init: aisb_fuzz::overflow::install(), |input: Input| {
    let mut text = String::new();
    let mut quoted = Vec::new();
    for line in input.lines.iter().take(32) {
        match line {
            Line::Quoted { export, key, value } => {
                let key = KEYS[*key as usize % KEYS.len()];
                let value: String = value.chars().filter(|&c| c != '\n').collect();
                let export = if *export { "export " } else { "" };
                text.push_str(&format!("{export}{key}=\"{value}\"\n"));
                quoted.push((key.to_string(), value));
            }
            Line::Any(s) => {
                text.push_str(s);
                text.push('\n');
            }
        }
    }
    let parsed = parse_dotenv(&text);
    for (k, v) in &parsed {
        assert!(!k.contains('\n') && !v.contains('\n'), "{k:?}={v:?}");
        assert_eq!(k.trim(), k);
    }
    // Each quoted line is one parsed pair, in order, among the others.
    let mut rest = parsed.iter();
    for q in &quoted {
        assert!(
            rest.any(|p| p == q),
            "{q:?} was written but not parsed back from {text:?}: {parsed:?}"
        );
    }

    let f = fixture();
    std::fs::write(f.proj.join(".env.fuzz"), &text).unwrap();
    let mut named: Vec<&str> = input
        .named
        .iter()
        .take(6)
        .map(|&i| KEYS[i as usize % KEYS.len()])
        .collect();
    named.dedup();
    if named.is_empty() {
        return;
    }
    let keys: Vec<String> = named.iter().map(|k| format!("\"{k}\"")).collect();
    let config = format!(
        "env {{\n    from-file \".env.fuzz\" {}\n}}\n",
        keys.join(" ")
    );
    let mut errors = Errors::default();
    let root = Root::Text {
        path: f.proj.join("sandbox.kdl"),
        text: config,
    };
    let loaded = eval::load(root, &mut errors).expect("a text root always loads");
    assert!(errors.is_empty(), "the fixed configuration is valid");
    let result = eval::evaluate(&loaded, &f.host, &Request::default());
    let last = |k: &str| {
        parsed
            .iter()
            .rev()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v)
    };
    match result {
        Ok(plan) => {
            for k in &named {
                let want = last(k)
                    .unwrap_or_else(|| panic!("{k} is not in the file, yet evaluation passed"));
                let got = plan
                    .env
                    .vars
                    .iter()
                    .find(|(name, _)| name == k)
                    .map(|(_, v)| v);
                assert_eq!(
                    got,
                    Some(want),
                    "{k} in the sandbox's environment, from {text:?}"
                );
            }
        }
        Err(_) => assert!(
            named.iter().any(|k| last(k).is_none()),
            "evaluation failed although every key is in the file"
        ),
    }
});
