//! A fingerprint of a directory tree that changes when anything in it changes: names, types,
//! modes, owners, sizes, contents, link targets, link counts, xattrs and ctimes (a chmod,
//! chown, new hard link or xattr moves the ctime even when everything else is restored).
//! Nothing is followed: a symlink is recorded as a symlink.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub fn fingerprint(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    walk(root, Path::new(""), &mut out);
    out
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
    let path = root.join(rel);
    let m = match fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) => {
            out.push(format!("{}: {e}", rel.display()));
            return;
        }
    };
    let what = if m.file_type().is_symlink() {
        format!("-> {:?}", fs::read_link(&path).ok())
    } else if m.is_file() {
        format!("{:?}", fs::read(&path).ok())
    } else {
        String::new()
    };
    out.push(format!(
        "{} mode={:o} uid={} gid={} size={} nlink={} ino={} mtime={}.{} ctime={}.{} xattrs={:?} {what}",
        rel.display(),
        m.mode(),
        m.uid(),
        m.gid(),
        m.size(),
        m.nlink(),
        m.ino(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        xattrs(&path),
    ));
    if m.is_dir() {
        let mut names: Vec<_> = match fs::read_dir(&path) {
            Ok(d) => d.filter_map(|e| e.ok().map(|e| e.file_name())).collect(),
            Err(e) => {
                out.push(format!("{}: {e}", rel.display()));
                return;
            }
        };
        names.sort();
        for n in names {
            walk(root, &rel.join(n), out);
        }
    }
}

fn xattrs(path: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(p) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Vec::new();
    };
    let mut names = vec![0u8; 4096];
    // SAFETY: a valid C string and a buffer of the given length.
    let n = unsafe { libc::llistxattr(p.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return Vec::new();
    }
    names.truncate(n as usize);
    names
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| {
            let name = std::ffi::CString::new(n).expect("no NUL inside a split name");
            let mut v = vec![0u8; 4096];
            // SAFETY: valid C strings and a buffer of the given length.
            let r = unsafe {
                libc::lgetxattr(p.as_ptr(), name.as_ptr(), v.as_mut_ptr().cast(), v.len())
            };
            v.truncate(r.max(0) as usize);
            (String::from_utf8_lossy(n).into_owned(), v)
        })
        .collect()
}
