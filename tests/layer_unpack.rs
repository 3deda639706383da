//! Layer unpacking on inputs the fuzzer (fuzz/fuzz_targets/layer_unpack.rs) points at: what a
//! layer's names do once they are not plain UTF-8.

mod support;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;

/// A layer that deletes the file named by the bytes `\xff` writes the whiteout `.wh.\xff`; the
/// unpacker must turn it into a whiteout for exactly that name, so the lower layer's file is
/// hidden. (The name went through `to_string_lossy`: the whiteout was made for U+FFFD and the
/// deleted file stayed visible in the image; found by the layer fuzzer.)
#[test]
fn a_whiteout_of_a_non_utf8_name_hides_that_name() {
    if !support::root_or_skip("whiteouts (mknod)") {
        return;
    }
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(0);
    h.set_mode(0o644);
    tar.append_data(&mut h, OsStr::from_bytes(b"d/.wh.\xff"), &[][..])
        .unwrap();
    let bytes = tar.into_inner().unwrap();
    let dest = tempfile::tempdir().unwrap();
    aisb::image::layer::unpack(&bytes[..], dest.path()).unwrap();
    let names: Vec<Vec<u8>> = std::fs::read_dir(dest.path().join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    assert_eq!(names, vec![b"\xff".to_vec()], "the whiteout's name");
    let m = std::fs::symlink_metadata(dest.path().join(OsStr::from_bytes(b"d/\xff"))).unwrap();
    assert!(
        m.file_type().is_char_device(),
        "a whiteout is a 0/0 character device"
    );
}
