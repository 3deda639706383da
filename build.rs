//! The identity of the sources this build is made of (`AISB_SOURCE_ID`): `aisb` mounts the
//! `aisb-init` beside it as the sandbox's init only when that one was built from the same
//! sources (a `cargo run` after an edit rebuilds `aisb` alone, and an old init would harden
//! the sandbox as the old sources did). Hashes `src/` and `Cargo.lock`, in path order;
//! reruns only when they change.
use std::hash::Hasher;
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => files(&p, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let mut paths = vec![PathBuf::from("Cargo.lock")];
    files(Path::new("src"), &mut paths);
    paths.sort();
    // Equality within one toolchain is all that is asked of it: SipHash of every path and
    // its bytes, lengths first.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in &paths {
        let bytes = std::fs::read(p).unwrap_or_default();
        let name = p.to_string_lossy();
        h.write_usize(name.len());
        h.write(name.as_bytes());
        h.write_usize(bytes.len());
        h.write(&bytes);
    }
    println!("cargo:rustc-env=AISB_SOURCE_ID={:016x}", h.finish());
}
