//! Property test: parse + eval never panic, whatever the input. Three generators: arbitrary
//! text, random edits of the example file, and random sequences of the language's own nodes.
//! `PROPTEST_CASES` sets the count (scripts/test.sh runs 1000 per generator in CI).

mod support;

use proptest::prelude::*;
use support::Fixture;

const EXAMPLE: &str = include_str!("../sandbox.kdl.example");

const WORDS: &[&str] = &[
    "project",
    "read-only",
    "mount",
    "tmpfs",
    "home",
    "block",
    "allow",
    "secrets",
    "env",
    "network",
    "process",
    "import",
    "profile",
    "task",
    "domains",
    "default-profile",
    "defaults",
    "gitignored",
    "git-crypt",
    "tool-dirs",
    "inherit",
    "filter-secrets",
    "pass",
    "set",
    "deny",
    "group",
    "localhost-port",
    "command",
    "cwd",
    "shell",
    "user",
    "rlimit",
    "hostname",
    "run",
    "extends=",
    "access=",
    "optional=",
    "size=",
    "uid=",
    "soft=",
    "\"preset:claude\"",
    "\"preset:profiles\"",
    "\"investigate\"",
    "\"fix\"",
    "\"$HOME\"",
    "\"${X:-~/y}\"",
    "\"~/.claude\"",
    "\"*.pem\"",
    "\"a/[b\"",
    "\"*\"",
    "\"*.com\"",
    "\"x.com:0\"",
    "\"overlay\"",
    "\"ro\"",
    "\"all\"",
    "\"none\"",
    "\"host\"",
    "#true",
    "#false",
    "#null",
    "0",
    "-1",
    "99999999999999999999999",
    "1.5",
    "{",
    "}",
    ";",
    "\n",
    "\"registries\"",
    "\"p\"",
    "\"/\"",
    "\"..\"",
    "\"$$\"",
    "\"${\"",
    "\"ünï\"",
    "\"nofile\"",
    "\"unlimited\"",
    "/-",
];

fn check(f: &Fixture, text: &str, profile: Option<&str>) {
    // Any Ok or Err is fine; a panic fails the property. On a thread with the stack aisb
    // parses with (its main thread's): a test thread's 2 MiB is less than the KDL parser's
    // recovery takes from some malformed texts in a debug build (tests/fixtures/fuzz).
    std::thread::scope(|s| {
        let parsed = std::thread::Builder::new()
            .stack_size(aisb::config::PARSE_STACK)
            .spawn_scoped(s, || {
                let _ = f.eval(text, profile);
            })
            .expect("a thread to parse on");
        if let Err(panic) = parsed.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let f = Fixture::new();
        check(&f, &text, None);
    }

    #[test]
    fn edited_example_never_panics(edits in prop::collection::vec((0usize..EXAMPLE.len(), 0usize..8, "[a-z\"{}=#;*$~/ \n.-]{0,4}"), 1..6),
                                   profile in prop::option::of(prop::sample::select(vec!["review", "deps", "investigate", "nope"]))) {
        let mut text = EXAMPLE.to_string();
        for (pos, del, ins) in edits {
            let mut pos = pos.min(text.len());
            while !text.is_char_boundary(pos) { pos -= 1; }
            let mut end = (pos + del).min(text.len());
            while !text.is_char_boundary(end) { end += 1; }
            text.replace_range(pos..end, &ins);
        }
        let f = Fixture::new();
        check(&f, &text, profile);
    }

    #[test]
    fn random_nodes_never_panic(words in prop::collection::vec(prop::sample::select(WORDS.to_vec()), 0..40),
                                profile in prop::option::of(prop::sample::select(vec!["p", "investigate", "fix"]))) {
        let text = words.join(" ");
        let f = Fixture::new();
        check(&f, &text, profile);
    }
}

/// A text the edited-example property found: a stray `*/` and an unclosed raw string (`#"`)
/// send the KDL parser's recovery deeper than 2 MiB of stack in a debug build. On aisb's
/// stack it is an error with a span, like any other.
#[test]
fn a_text_whose_recovery_goes_deep_is_an_error() {
    let text = include_str!("fixtures/fuzz/deep-recovery.kdl");
    let f = Fixture::new();
    check(&f, text, None);
    std::thread::scope(|s| {
        let r = std::thread::Builder::new()
            .stack_size(aisb::config::PARSE_STACK)
            .spawn_scoped(s, || f.eval(text, None).is_err())
            .unwrap()
            .join()
            .unwrap();
        assert!(r, "the text is not a valid sandbox.kdl");
    });
}
