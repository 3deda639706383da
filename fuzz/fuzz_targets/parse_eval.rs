//! libFuzzer target: parse + evaluate arbitrary bytes as sandbox.kdl. Run with
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run parse_eval -- -max_total_time=60
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use aisb::config::Errors;
use aisb::eval::{self, Host, Request, Root};
use libfuzzer_sys::fuzz_target;

fn fixture() -> &'static (tempfile_free::Dir, Host) {
    static F: OnceLock<(tempfile_free::Dir, Host)> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile_free::Dir::new();
        let home = dir.0.join("home");
        let proj = dir.0.join("proj");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&proj).unwrap();
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/usr/bin:/bin".to_string());
        let host = Host {
            env,
            cwd: proj.clone(),
            uid: 1000,
            gid: 1000,
            user: "fuzz".into(),
            home,
            agent_policies: aisb::eval::agents::host_policies(),
            system: aisb::graph::system::system_paths(&dir.0.join("cache/aisb/store")),
        };
        (dir, host)
    })
}

/// A fixed scratch dir under /tmp (no extra dependency).
mod tempfile_free {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir().join(format!("aisb-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
}

fuzz_target!(init: aisb_fuzz::overflow::install(), |data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (_, host) = fixture();
    let mut errors = Errors::default();
    let root = Root::Text {
        path: host.cwd.join("sandbox.kdl"),
        text: text.to_string(),
    };
    let Ok(loaded) = eval::load(root, &mut errors) else {
        return;
    };
    if errors.is_empty() {
        for profile in [None, Some("investigate".to_string())] {
            let _ = eval::evaluate(
                &loaded,
                host,
                &Request {
                    profile,
                    ..Default::default()
                },
            );
        }
    }
});
