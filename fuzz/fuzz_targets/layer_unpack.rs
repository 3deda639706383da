//! libFuzzer target: a layer (a structured tar, gzip'd or not, or raw bytes) unpacked into a
//! scratch directory by `aisb::image::layer::unpack`. Invariants: no panic, and nothing
//! outside the scratch directory changes: a canary directory beside it (and the directory
//! around both) must be identical after every input, however the archive's names, links,
//! whiteouts and pax records aim at them.
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run -s none layer_unpack -- -max_total_time=60
#![no_main]

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;

use aisb_fuzz::tar_gen::{Aim, Layer};
use aisb_fuzz::tree::fingerprint;
use libfuzzer_sys::fuzz_target;

struct Scratch {
    /// Holds `box/` and a file of its own: a second canary, one level further out.
    outside: PathBuf,
    /// Holds `dest/` (the scratch dir, made anew for every input) and `canary/`.
    boxed: PathBuf,
    dest: PathBuf,
    canary: PathBuf,
    before: Vec<String>,
}

impl Scratch {
    /// Everything outside `dest`: the canary and the outer directory, with `box` itself
    /// reduced to its entries (making `dest` anew changes box's times, nothing else may).
    fn outside_dest(&self) -> Vec<String> {
        let mut v = fingerprint(&self.canary);
        v.push("--".into());
        let mut names: Vec<_> = fs::read_dir(&self.boxed)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.file_name())).collect())
            .unwrap_or_default();
        names.sort();
        v.push(format!("{names:?}"));
        for entry in fs::read_dir(&self.outside).into_iter().flatten().flatten() {
            if entry.file_name() != "box" {
                v.extend(fingerprint(&entry.path()));
            }
        }
        v
    }
}

fn scratch() -> &'static Scratch {
    static S: OnceLock<Scratch> = OnceLock::new();
    S.get_or_init(|| {
        let outside = std::env::temp_dir().join(format!("aisb-fuzz-layer-{}", std::process::id()));
        let _ = fs::remove_dir_all(&outside);
        let boxed = outside.join("box");
        let canary = boxed.join("canary");
        fs::create_dir_all(canary.join("dir")).unwrap();
        fs::create_dir(boxed.join("dest")).unwrap();
        fs::write(outside.join("outer-file"), b"outer").unwrap();
        fs::write(canary.join("file"), b"canary").unwrap();
        fs::write(canary.join("dir/file"), b"canary dir file").unwrap();
        std::os::unix::fs::symlink("file", canary.join("link")).unwrap();
        let mut s = Scratch {
            dest: boxed.join("dest"),
            outside,
            boxed,
            canary,
            before: Vec::new(),
        };
        s.before = s.outside_dest();
        s
    })
}

fuzz_target!(init: aisb_fuzz::overflow::install(), |layer: Layer| {
    let s = scratch();
    let _ = fs::remove_dir_all(&s.dest);
    fs::create_dir(&s.dest).unwrap();
    let bytes = layer.bytes(&Aim {
        canary: &s.canary,
        outside: &s.outside,
    });
    let _ = aisb::image::layer::unpack(&bytes[..], &s.dest);
    let after = s.outside_dest();
    if after != s.before {
        let diff: Vec<_> = after.iter().filter(|l| !s.before.contains(l)).collect();
        panic!("unpacking changed something outside the scratch dir: {diff:#?}\nlayer: {layer:#?}");
    }
});
