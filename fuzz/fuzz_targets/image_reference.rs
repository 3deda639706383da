//! libFuzzer target: image references (the text after `FROM`), which end up in registry URLs.
//! Invariants: no panic; an accepted reference prints as text that parses back to itself; its
//! URL path holds only the grammar's characters; plain HTTP only for an exactly loopback
//! registry; and where `oci_spec::distribution::Reference` (the same grammar, by regex) also
//! accepts the text, both read the same repository, tag and digest. Run with
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run image_reference -- -max_total_time=300
#![no_main]

use aisb::image::oci::reference::{is_loopback_host, split_authority};
use aisb::image::oci::Reference;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(r) = Reference::parse(text) else {
        return;
    };
    assert_eq!(Reference::parse(&r.to_string()).as_ref(), Ok(&r), "{text}");
    let url = r.base_url();
    let path = url.split_once("/v2/").map(|(_, p)| p).unwrap_or_default();
    assert!(
        path.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b)),
        "{url}"
    );
    for part in r.tag.iter().chain(r.digest.iter()) {
        assert!(
            part.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-:".contains(&b)),
            "{part}"
        );
    }
    if url.starts_with("http://") {
        assert!(
            is_loopback_host(split_authority(r.api_authority()).0),
            "{text}"
        );
    }
    if let Ok(theirs) = oci_spec::distribution::Reference::try_from(text) {
        // Docker Hub's API host is Docker Hub to aisb and a registry of its own to oci-spec;
        // and oci-spec's domain split predates the rule that an uppercase first component
        // is a registry (`dockerSio/l` is `dockerSio` + `l`), so it reads that one as an
        // uppercase repository, which the grammar forbids.
        let theirs_valid = !theirs.repository().bytes().any(|b| b.is_ascii_uppercase());
        if theirs_valid
            && !theirs
                .registry()
                .eq_ignore_ascii_case("registry-1.docker.io")
        {
            assert_eq!(r.repo, theirs.repository(), "{text}");
            assert_eq!(r.tag.as_deref(), theirs.tag(), "{text}");
            assert_eq!(r.digest.as_deref(), theirs.digest(), "{text}");
        }
    }
});
