//! libFuzzer target: what a registry or an image layout sends aisb, parsed as aisb parses it:
//! manifests and indexes (and the platform chosen from an index), image configs, the store's
//! base records, `WWW-Authenticate` challenges, and `sandbox.lock`. Invariants: no panic;
//! what parses as valid holds only sha256 digests and hashes. Run with
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run oci_documents -- -max_total_time=300
#![no_main]

use aisb::image::{challenge, lock, oci};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match oci::parse_document(data) {
        Ok(oci::Document::Index(index)) => {
            if let Some(d) = oci::pick_platform(&index) {
                let _ = oci::descriptor_hex(d);
            }
        }
        Ok(oci::Document::Manifest(m)) => {
            let _ = oci::descriptor_hex(m.config());
            for l in m.layers() {
                if let Some(hex) = oci::descriptor_hex(l) {
                    assert!(hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
                }
            }
        }
        Err(_) => {}
    }
    let _ = oci::parse_config(data);
    if let Ok(base) = serde_json::from_slice::<oci::Base>(data) {
        if base.is_valid() {
            assert!(oci::is_digest(&base.digest));
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(challenges) = challenge::parse(text) {
        for c in &challenges {
            assert_eq!(c.scheme, c.scheme.to_ascii_lowercase());
            assert!(c.params.iter().all(|(k, _)| *k == k.to_ascii_lowercase()));
        }
    }
    if let Ok(l) = lock::Lock::parse(text, std::path::Path::new("sandbox.lock")) {
        for locked in l.images.values() {
            assert_eq!(locked.graph.len(), 64);
            assert!(locked.bases.values().all(|p| oci::is_digest(p)));
        }
    }
});
