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

/// Characters that mean something to YAML, shells and the exporters' formats (no control
/// characters: those are refused at decode).
const AWKWARD: &str = "[a-z0-9 :#'\"{}\\[\\],&*!|>%@`$\\\\=?/.-]{1,12}";

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever names, paths and values a configuration holds, `export k8s` prints exactly
    /// its documents: the YAML parses back to as many documents as it made, each equal to the
    /// one it meant (a value never becomes structure, a comment never ends early), for every
    /// flavour.
    #[test]
    fn k8s_export_holds_exactly_its_documents(
        target in AWKWARD,
        value in AWKWARD,
        domain in "[a-z]{1,8}",
        task in "[a-z][a-z0-9-]{0,8}",
        description in AWKWARD,
    ) {
        let f = Fixture::new();
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let text = format!(
            "tmpfs \"/w/{}\"\nenv {{\n    set \"NOTE\" \"{}\"\n}}\nnetwork {{\n    allow \"{domain}.example.com\"\n}}\ntask \"{task}\" description=\"{}\" {{\n    run \"echo\" \"{}\"\n}}\n",
            esc(&target), esc(&value), esc(&description), esc(&value)
        );
        let Ok(plan) = f.eval(&text, None) else {
            // Refused at decode (a path that normalises away, …): nothing to export.
            return Ok(());
        };
        for flavor in [
            aisb::spec::k8s::Flavor::Pod,
            aisb::spec::k8s::Flavor::Job,
            aisb::spec::k8s::Flavor::AgentSandbox,
        ] {
            let o = aisb::spec::k8s::Options {
                flavor,
                image: format!("registry.example/img@sha256:{}", "a".repeat(64)),
                proxy_image: format!("registry.example/img@sha256:{}", "a".repeat(64)),
                clone_image: format!("registry.example/img@sha256:{}", "a".repeat(64)),
                namespace: "ns".into(),
                runtime_class: None,
                seccomp_localhost: None,
                repo: None,
                env_origin: Default::default(),
                replicas: 1,
                proxy_replicas: 1,
            };
            let Ok(e) = aisb::spec::k8s::export(&plan, &o) else { continue };
            let yaml = aisb::spec::k8s::to_yaml(&plan, &e);
            let parsed: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&yaml)
                .map(|d| serde::Deserialize::deserialize(d).expect("each document parses"))
                .filter(|v: &serde_json::Value| !v.is_null())
                .collect();
            prop_assert_eq!(&parsed, &e.documents, "{}", yaml);
        }
    }
}
