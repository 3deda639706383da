//! Blobs read from an OCI layout, an archive of one, or a registry, each verified against
//! its descriptor's digest and size.

use std::fs;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};

use oci_spec::image::Descriptor;
use sha2::{Digest, Sha256};

use super::reference::sha256_hex_of;
use super::registry::Registry;
use super::{fail, sha256_hex, FetchError};

/// Where blobs are read from.
pub enum Blobs {
    Layout(PathBuf),
    Archive(PathBuf),
    Registry(Registry),
}

/// The most a manifest, index or image config may weigh (real ones are a few KiB).
const MAX_JSON_BLOB: u64 = 16 << 20;
impl Blobs {
    pub(super) fn read_file(&self, name: &str) -> io::Result<Vec<u8>> {
        match self {
            Blobs::Layout(dir) => fs::read(dir.join(name)),
            Blobs::Archive(file) => {
                let mut f = fs::File::open(file)?;
                let mut out = Vec::new();
                archive_entry(&mut f, name)?.read_to_end(&mut out)?;
                Ok(out)
            }
            Blobs::Registry(_) => Err(io::ErrorKind::Unsupported.into()),
        }
    }

    pub(super) fn manifest_by_digest(
        &self,
        d: &Descriptor,
        what: &str,
    ) -> Result<Vec<u8>, FetchError> {
        match self {
            Blobs::Registry(r) => Ok(r.manifest(d.digest().as_ref())?.0),
            _ => self.blob_bytes(d, what),
        }
    }

    /// A manifest or config, read whole: never more than its descriptor's size, itself bounded.
    pub(super) fn blob_bytes(&self, d: &Descriptor, what: &str) -> Result<Vec<u8>, FetchError> {
        let digest: &str = d.digest().as_ref();
        if d.size() > MAX_JSON_BLOB {
            return Err(fail(
                format!("{what}: {digest} claims {} bytes, more than a manifest or config may have ({MAX_JSON_BLOB})", d.size()),
                "the source is corrupt or hostile; nothing of it was used",
            ));
        }
        let mut out = Vec::new();
        self.open(digest, d.size(), what)?
            .read_to_end(&mut out)
            .map_err(|e| {
                fail(
                    format!("{what}: reading {digest}: {e}"),
                    "is the source complete?",
                )
            })?;
        if sha256_hex(&out) != digest {
            return Err(fail(
                format!("{what}: blob {digest} does not match its digest"),
                "the source is corrupt or was tampered with; nothing of it was used",
            ));
        }
        Ok(out)
    }

    /// A reader of the blob's bytes (not verified: see [`Verified`]), cut one byte past the
    /// size its descriptor gives, so a source that sends more (forever) is stopped and caught.
    pub fn open(
        &self,
        digest: &str,
        size: u64,
        what: &str,
    ) -> Result<Box<dyn Read + '_>, FetchError> {
        Ok(Box::new(
            self.open_whole(digest, what)?.take(size.saturating_add(1)),
        ))
    }

    fn open_whole(&self, digest: &str, what: &str) -> Result<Box<dyn Read + '_>, FetchError> {
        let Some(hex) = sha256_hex_of(digest) else {
            return Err(fail(
                format!("{what}: `{digest}` is not a sha256 digest"),
                "aisb verifies blobs by sha256",
            ));
        };
        let rel = format!("blobs/sha256/{hex}");
        let err = |e: io::Error| {
            fail(
                format!("{what}: cannot read blob {digest}: {e}"),
                "is the image layout complete?",
            )
        };
        match self {
            Blobs::Layout(dir) => Ok(Box::new(fs::File::open(dir.join(rel)).map_err(err)?)),
            Blobs::Archive(file) => {
                let mut f = fs::File::open(file).map_err(err)?;
                let (start, len) = archive_span(&mut f, &rel).map_err(err)?;
                f.seek(io::SeekFrom::Start(start)).map_err(err)?;
                Ok(Box::new(f.take(len)))
            }
            Blobs::Registry(r) => r.blob(digest),
        }
    }
}
/// Where `name`'s data is inside an uncompressed tar.
fn archive_span(f: &mut fs::File, name: &str) -> io::Result<(u64, u64)> {
    f.seek(io::SeekFrom::Start(0))?;
    let mut a = tar::Archive::new(f);
    for e in a.entries_with_seek()? {
        let e = e?;
        let p = e.path()?.into_owned();
        let p = p.strip_prefix("./").unwrap_or(&p);
        if p == Path::new(name) {
            return Ok((e.raw_file_position(), e.size()));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("{name} is not in the archive"),
    ))
}

fn archive_entry<'f>(f: &'f mut fs::File, name: &str) -> io::Result<io::Take<&'f mut fs::File>> {
    let (start, len) = archive_span(f, name)?;
    f.seek(io::SeekFrom::Start(start))?;
    Ok(f.take(len))
}

/// A reader that hashes and counts what passes through; [`Verified::check`] compares at the
/// end.
pub struct Verified<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
}

impl<R: Read> Verified<R> {
    pub fn new(inner: R) -> Self {
        Verified {
            inner,
            hasher: Sha256::new(),
            read: 0,
        }
    }

    /// Read to the end (a tar reader may stop before the padding), then compare the size and
    /// the digest.
    pub fn check(mut self, digest: &str, size: u64) -> io::Result<()> {
        io::copy(&mut self, &mut io::sink())?;
        if self.read != size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "blob {digest} is not the {size} bytes its manifest says (read {}{}): corrupt or tampered with",
                    self.read,
                    if self.read > size { " or more" } else { "" }
                ),
            ));
        }
        let got = format!("sha256:{}", hex::encode(self.hasher.finalize()));
        if got != digest {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "blob {digest} does not match its digest (got {got}): corrupt or tampered with"
                ),
            ));
        }
        Ok(())
    }
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}
