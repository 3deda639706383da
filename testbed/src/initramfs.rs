//! The guest's root filesystem as a newc cpio archive, written by us. Two layers, concatenated
//! (the kernel unpacks them in order): a base per kernel (busybox, bwrap, git, newuidmap and
//! their libraries, the kernel's modules), cached by the hash of its inputs, and a small
//! per-run layer (the freshly built aisb binaries, vm-tests/, the init script).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::{run, Error};

/// Files of an archive: path inside -> (mode, content).
#[derive(Default)]
pub struct Tree {
    entries: BTreeMap<String, (u32, Vec<u8>)>,
}

const DIR: u32 = 0o040000;
const FILE: u32 = 0o100000;
const LINK: u32 = 0o120000;

impl Tree {
    pub fn dir(&mut self, path: &str) {
        let mut p = String::new();
        for part in path.trim_matches('/').split('/').filter(|s| !s.is_empty()) {
            p.push_str(part);
            self.entries
                .entry(p.clone())
                .or_insert((DIR | 0o755, Vec::new()));
            p.push('/');
        }
    }

    fn parent(&mut self, path: &str) {
        if let Some((parent, _)) = path.trim_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
    }

    pub fn file(&mut self, path: &str, mode: u32, content: Vec<u8>) {
        self.parent(path);
        self.entries
            .insert(path.trim_matches('/').to_string(), (FILE | mode, content));
    }

    pub fn symlink(&mut self, path: &str, target: &str) {
        self.parent(path);
        self.entries.insert(
            path.trim_matches('/').to_string(),
            (LINK | 0o777, target.as_bytes().to_vec()),
        );
    }

    /// A host file at the same path inside (its mode kept, setuid included).
    pub fn copy(&mut self, host: &Path, inside: &str) -> Result<(), Error> {
        use std::os::unix::fs::PermissionsExt;
        let data = std::fs::read(host).map_err(Error::io(host))?;
        let mode = std::fs::metadata(host)
            .map_err(Error::io(host))?
            .permissions()
            .mode()
            & 0o7777;
        self.file(inside, mode, data);
        Ok(())
    }

    /// A dynamically linked program and every library `ldd` names, at their host paths under
    /// the merged /usr layout.
    pub fn program(&mut self, host: &Path, inside: &str) -> Result<(), Error> {
        self.copy(host, inside)?;
        let out = run(Command::new("ldd").arg(host)).unwrap_or_default();
        for line in out.lines() {
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line
                    .split_whitespace()
                    .next()
                    .filter(|p| p.starts_with('/')),
            };
            let Some(path) = path.filter(|p| p.starts_with('/')) else {
                continue;
            };
            let real = std::fs::canonicalize(path).map_err(Error::io(Path::new(path)))?;
            let inside = usr_merged(path);
            if !self.entries.contains_key(inside.trim_matches('/')) {
                self.copy(&real, &inside)?;
            }
        }
        Ok(())
    }

    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        for (path, (mode, data)) in &self.entries {
            h.update(path.as_bytes());
            h.update(mode.to_le_bytes());
            h.update(Sha256::digest(data));
        }
        h.finalize()
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// newc cpio, uid/gid 0, mtime 0, ending in the trailer.
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        for (ino, (path, (mode, data))) in (1u32..).zip(self.entries.iter()) {
            header(out, ino, *mode, data.len(), path)?;
            out.write_all(data)?;
            pad(out, data.len())?;
        }
        header(out, 0, 0, 0, "TRAILER!!!")
    }
}

/// `/lib/x86_64-linux-gnu/…` -> `/usr/lib/x86_64-linux-gnu/…` (the guest has /lib -> usr/lib).
fn usr_merged(path: &str) -> String {
    for top in ["/lib64/", "/lib/", "/bin/", "/sbin/"] {
        if let Some(rest) = path.strip_prefix(top) {
            return format!("/usr{top}{rest}");
        }
    }
    path.to_string()
}

fn header(
    out: &mut impl Write,
    ino: u32,
    mode: u32,
    size: usize,
    name: &str,
) -> std::io::Result<()> {
    let namesize = name.len() + 1;
    write!(
        out,
        "070701{ino:08x}{mode:08x}{:08x}{:08x}{:08x}{:08x}{size:08x}{:08x}{:08x}{:08x}{:08x}{namesize:08x}{:08x}",
        0, 0, 1, 0, 0, 0, 0, 0, 0
    )?;
    out.write_all(name.as_bytes())?;
    out.write_all(&[0])?;
    pad(out, 110 + namesize)
}

fn pad(out: &mut impl Write, len: usize) -> std::io::Result<()> {
    let n = (4 - len % 4) % 4;
    out.write_all(&[0u8; 3][..n])
}

/// Module files as the guest loads them: decompressed (busybox insmod reads plain .ko).
pub fn module_bytes(path: &Path) -> Result<Vec<u8>, Error> {
    let tool = match path.extension().and_then(|e| e.to_str()) {
        Some("xz") => "xz",
        Some("zst") => "zstd",
        Some("gz") => "gzip",
        _ => return std::fs::read(path).map_err(Error::io(path)),
    };
    let out = Command::new(tool)
        .args(["-dc"])
        .arg(path)
        .output()
        .map_err(Error::io(Path::new(tool)))?;
    if !out.status.success() {
        return Err(Error::msg(
            format!("{tool} -dc {} failed", path.display()),
            "install xz-utils / zstd",
        ));
    }
    Ok(out.stdout)
}

/// Write `tree` to `path` unless a file with its hash is there already; returns the path.
pub fn cached(tree: &Tree, dir: &Path, name: &str) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let path = dir.join(format!("{name}-{}.cpio", tree.hash()));
    if !path.exists() {
        let tmp = path.with_extension("tmp");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(Error::io(&tmp))?);
        tree.write(&mut f).map_err(Error::io(&tmp))?;
        f.into_inner()
            .map_err(|e| Error::msg(e.to_string(), "check the disk"))?
            .sync_all()
            .map_err(Error::io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(Error::io(&path))?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout() {
        let mut t = Tree::default();
        t.file("etc/hostname", 0o644, b"vm\n".to_vec());
        t.symlink("bin", "usr/bin");
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert!(out.starts_with(b"070701"));
        assert_eq!(out.len() % 4, 0);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("etc\0")
                && text.contains("etc/hostname\0")
                && text.contains("TRAILER!!!\0")
        );
        assert_eq!(
            usr_merged("/lib/x86_64-linux-gnu/libc.so.6"),
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        );
        assert_eq!(
            usr_merged("/lib64/ld-linux-x86-64.so.2"),
            "/usr/lib64/ld-linux-x86-64.so.2"
        );
    }
}
