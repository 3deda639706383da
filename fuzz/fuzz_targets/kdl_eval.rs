//! libFuzzer target: a generated sandbox.kdl project (a root file, files it imports, a dotenv
//! file; see aisb_fuzz::kdl_gen), loaded and evaluated as `aisb` does. The documents are valid
//! KDL made of the language's nodes, so the input reaches decode's checks, imports, profile
//! inheritance and evaluation rather than stopping in the lexer. Invariant: no panic.
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run -s none kdl_eval -- -max_total_time=60
#![no_main]

use aisb::config::Errors;
use aisb::eval::{self, Request, Root};
use aisb_fuzz::fixture::fixture;
use aisb_fuzz::kdl_gen::{Project, IMPORTED};
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: aisb_fuzz::overflow::install(), |p: Project| {
    let f = fixture();
    let root = f.proj.join("sandbox.kdl");
    std::fs::write(&root, p.root.render(false)).unwrap();
    for (i, name) in IMPORTED.iter().enumerate() {
        let path = f.proj.join(name);
        match p.imported.get(i) {
            Some(doc) => std::fs::write(&path, doc.render(name.starts_with("sub/"))).unwrap(),
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    std::fs::write(f.proj.join(".env.agent"), p.dotenv_text()).unwrap();
    let mut errors = Errors::default();
    let Ok(loaded) = eval::load(Root::File(root), &mut errors) else {
        return;
    };
    if errors.is_empty() {
        let req = Request {
            profile: p.profile_name(),
            ..Default::default()
        };
        let _ = eval::evaluate(&loaded, &f.host, &req);
    }
});
