//! A project directory and host description for evaluating configurations, made once per
//! fuzzing process under the temporary directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use aisb::eval::Host;

pub struct Fixture {
    pub proj: PathBuf,
    pub host: Host,
}

pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("aisb-fuzz-eval-{}", std::process::id()));
        let home = dir.join("home");
        let proj = dir.join("proj");
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::create_dir_all(proj.join("sub")).unwrap();
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/usr/bin:/bin".to_string());
        env.insert("A".to_string(), "host-a".to_string());
        env.insert("GH_TOKEN".to_string(), "host-secret".to_string());
        // Gathered once, as aisb gathers them before evaluating.
        let system = aisb::graph::system::system_paths(&dir.join("cache/aisb/store"));
        let host = Host {
            env,
            cwd: proj.clone(),
            uid: 1000,
            gid: 1000,
            user: "fuzz".into(),
            home,
            agent_policies: aisb::eval::agents::host_policies(),
            system,
        };
        Fixture { proj, host }
    })
}
