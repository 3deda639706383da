//! `aisb build --push REF`: the built image to a registry through the OCI distribution API,
//! so a cluster (`aisb export k8s`) or another machine runs it by digest.
//!
//! Each layer entry of the store (a directory: an unpacked base layer or a step's overlay
//! upper directory) is written as an uncompressed OCI layer tar
//! (`application/vnd.oci.image.layer.v1.tar`, so the blob digest is the `diff_id` too):
//! entries sorted by name, modification times zero, owners and permission bits as they are,
//! overlayfs whiteouts (0/0 character devices) as `.wh.NAME`, opaque directories as
//! `DIR/.wh..wh..opq`. The same layer directory always gives the same bytes, so pushing an
//! unchanged image again sends nothing but its manifest (blobs the registry has are skipped).
//! Extended attributes are not carried (file capabilities included): the image's own
//! `RUN setcap` would have to run again where it is used.
//!
//! Reading a layer directory never follows a link: the walk does not descend through
//! symlinks, each file is opened with `O_NOFOLLOW`, and what a build step left is taken as
//! entries, never as paths to go to.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use oci_spec::image::{
    ConfigBuilder, DescriptorBuilder, ImageConfigurationBuilder, ImageManifestBuilder, MediaType,
    RootFsBuilder, SCHEMA_VERSION,
};
use sha2::{Digest, Sha256};

use super::graph::ImageConfig;
use super::oci::reference::Reference;
use super::oci::registry::Registry;
use super::oci::FetchError;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Pushed {
    /// `REGISTRY/REPO:TAG@sha256:…`.
    pub reference: String,
    pub digest: String,
    pub layers: usize,
    /// Layer bytes sent (blobs the registry already had are not).
    pub sent: u64,
    pub skipped: usize,
}

fn io_fail(what: String, e: io::Error) -> FetchError {
    FetchError {
        what: format!("{what}: {e}"),
        help: "the store entry is unreadable; `aisb build` again rebuilds what is damaged".into(),
    }
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    len: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn is_whiteout(m: &fs::Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}

fn is_opaque(dir: &Path) -> bool {
    ["trusted.overlay.opaque", "user.overlay.opaque"]
        .iter()
        .any(|name| matches!(xattr::get(dir, name), Ok(Some(v)) if v == b"y"))
}

fn header(m: &fs::Metadata, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(m.mode() & 0o7777);
    h.set_uid(m.uid() as u64);
    h.set_gid(m.gid() as u64);
    h.set_mtime(0);
    h.set_size(0);
    h
}

/// [`layer_tar`] where its files can be read and their owners are the image's: for an
/// ordinary user who builds over their subordinate ids, in `aisb __userns tar` (root of a user
/// namespace with their map, where every file is readable and `stat` gives the ids inside).
fn layer_tar_as_owner(dir: &Path, out: &Path) -> Result<(String, u64), FetchError> {
    if nix::unistd::geteuid().is_root() || crate::userns::caller_maps().is_err() {
        return layer_tar(dir, out);
    }
    let fail = |e: io::Error| io_fail(format!("writing the layer tar ({})", dir.display()), e);
    let (dir, out) = (
        std::path::absolute(dir).map_err(fail)?,
        std::path::absolute(out).map_err(fail)?,
    );
    // Made here, so that it is the caller's: the helper writes into it.
    fs::File::create(&out).map_err(fail)?;
    let mut child = crate::userns::spawn(&[
        "tar".into(),
        dir.clone().into_os_string(),
        out.into_os_string(),
    ])
    .map_err(fail)?;
    drop(child.stdin.take());
    let o = child.wait_with_output().map_err(fail)?;
    let text = String::from_utf8_lossy(&o.stdout);
    match text.split_whitespace().collect::<Vec<_>>().as_slice() {
        [digest, len] if o.status.success() && digest.starts_with("sha256:") => Ok((
            digest.to_string(),
            len.parse()
                .map_err(|_| fail(io::Error::other("bad length")))?,
        )),
        _ => Err(fail(io::Error::other(format!(
            "as the owner of the subordinate ids: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )))),
    }
}

/// Write the layer directory `dir` as a tar to `out`; its sha256 digest and length.
pub fn layer_tar(dir: &Path, out: &Path) -> Result<(String, u64), FetchError> {
    let fail = |what: &str, e: io::Error| io_fail(format!("{what} ({})", dir.display()), e);
    let file = fs::File::create(out).map_err(|e| fail("creating the layer tar", e))?;
    let mut w = Hashing {
        inner: io::BufWriter::new(file),
        hash: Sha256::new(),
        len: 0,
    };
    {
        let mut b = tar::Builder::new(&mut w);
        b.mode(tar::HeaderMode::Deterministic);
        let walk = walkdir::WalkDir::new(dir)
            .min_depth(1)
            .follow_links(false)
            .sort_by_file_name();
        for entry in walk {
            let entry = entry.map_err(|e| fail("reading the layer", e.into()))?;
            let rel = entry
                .path()
                .strip_prefix(dir)
                .expect("walkdir stays below its root")
                .to_path_buf();
            let m = entry
                .path()
                .symlink_metadata()
                .map_err(|e| fail("reading the layer", e))?;
            let ft = m.file_type();
            if is_whiteout(&m) {
                let name = rel.file_name().expect("an entry has a name");
                let mut wh = std::ffi::OsString::from(".wh.");
                wh.push(name);
                let path = rel.with_file_name(wh);
                let mut h = header(&m, tar::EntryType::Regular);
                h.set_mode(0o644);
                b.append_data(&mut h, &path, io::empty())
                    .map_err(|e| fail("writing the layer", e))?;
            } else if ft.is_dir() {
                let mut h = header(&m, tar::EntryType::Directory);
                b.append_data(&mut h, &rel, io::empty())
                    .map_err(|e| fail("writing the layer", e))?;
                if is_opaque(entry.path()) {
                    let mut h = header(&m, tar::EntryType::Regular);
                    h.set_mode(0o644);
                    b.append_data(&mut h, rel.join(".wh..wh..opq"), io::empty())
                        .map_err(|e| fail("writing the layer", e))?;
                }
            } else if ft.is_symlink() {
                let target = fs::read_link(entry.path()).map_err(|e| fail("reading a link", e))?;
                let mut h = header(&m, tar::EntryType::Symlink);
                b.append_link(&mut h, &rel, &target)
                    .map_err(|e| fail("writing the layer", e))?;
            } else if ft.is_file() {
                let f = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(entry.path())
                    .map_err(|e| fail("reading a file", e))?;
                let mut h = header(&m, tar::EntryType::Regular);
                h.set_size(m.len());
                // Exactly the size taken with the header, whatever the file does meanwhile.
                b.append_data(&mut h, &rel, f.take(m.len()))
                    .map_err(|e| fail("writing the layer", e))?;
            } else if ft.is_fifo() || ft.is_char_device() || ft.is_block_device() {
                let kind = if ft.is_fifo() {
                    tar::EntryType::Fifo
                } else if ft.is_char_device() {
                    tar::EntryType::Char
                } else {
                    tar::EntryType::Block
                };
                let mut h = header(&m, kind);
                let dev = m.rdev();
                h.set_device_major(libc::major(dev)).ok();
                h.set_device_minor(libc::minor(dev)).ok();
                b.append_data(&mut h, &rel, io::empty())
                    .map_err(|e| fail("writing the layer", e))?;
            }
            // Sockets are left out: they mean nothing in an image.
        }
        b.finish().map_err(|e| fail("writing the layer", e))?;
    }
    w.flush().map_err(|e| fail("writing the layer", e))?;
    Ok((format!("sha256:{}", hex::encode(w.hash.finalize())), w.len))
}

fn spec_fail(e: oci_spec::OciSpecError) -> FetchError {
    FetchError {
        what: format!("building the image's manifest: {e}"),
        help: "this is a bug in aisb".into(),
    }
}

/// Push the image whose layers and settings are `config` to `target` (a tag; `latest` when it
/// names none). `scratch` holds the layer tars while they are sent.
pub fn push(
    config: &ImageConfig,
    target: &Reference,
    scratch: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Pushed, FetchError> {
    if target.digest.is_some() {
        return Err(FetchError {
            what: format!("{target}: a push names a tag, not a digest"),
            help: "push to REGISTRY/REPO:TAG; the digest is printed after the push".into(),
        });
    }
    let tag = target.tag.clone().unwrap_or_else(|| "latest".into());
    let registry = Registry::new(target);
    fs::create_dir_all(scratch).map_err(|e| io_fail(scratch.display().to_string(), e))?;
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    let (mut sent, mut skipped) = (0u64, 0usize);
    let bottom_first: Vec<&PathBuf> = config.layers.iter().rev().collect();
    for (i, dir) in bottom_first.iter().enumerate() {
        let tar_path = scratch.join(format!("layer-{i}.tar"));
        progress(&format!(
            "layer {}/{}: writing {}",
            i + 1,
            bottom_first.len(),
            dir.display()
        ));
        let (digest, len) = layer_tar_as_owner(dir, &tar_path)?;
        if registry.has_blob(&digest)? {
            skipped += 1;
            progress(&format!(
                "layer {}/{}: {digest} already there",
                i + 1,
                bottom_first.len()
            ));
        } else {
            progress(&format!(
                "layer {}/{}: sending {digest} ({} KiB)",
                i + 1,
                bottom_first.len(),
                len / 1024
            ));
            registry.upload_blob(&digest, &tar_path, len)?;
            sent += len;
        }
        let _ = fs::remove_file(&tar_path);
        layers.push(
            DescriptorBuilder::default()
                .media_type(MediaType::ImageLayer)
                .digest(
                    digest
                        .parse::<oci_spec::image::Digest>()
                        .map_err(spec_fail)?,
                )
                .size(len)
                .build()
                .map_err(spec_fail)?,
        );
        diff_ids.push(digest);
    }
    let env: Vec<String> = config.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut run = ConfigBuilder::default().env(env).cmd(config.shell.clone());
    if !config.workdir.is_empty() {
        run = run.working_dir(config.workdir.clone());
    }
    if !config.user.is_empty() {
        run = run.user(config.user.clone());
    }
    let image_config = ImageConfigurationBuilder::default()
        .architecture(oci_spec::image::Arch::default())
        .os(oci_spec::image::Os::default())
        .config(run.build().map_err(spec_fail)?)
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(diff_ids)
                .build()
                .map_err(spec_fail)?,
        )
        .build()
        .map_err(spec_fail)?;
    let config_bytes = serde_json::to_vec(&image_config).expect("a config serializes");
    let config_digest = super::oci::sha256_hex(&config_bytes);
    let config_path = scratch.join("config.json");
    fs::write(&config_path, &config_bytes)
        .map_err(|e| io_fail(config_path.display().to_string(), e))?;
    if !registry.has_blob(&config_digest)? {
        registry.upload_blob(&config_digest, &config_path, config_bytes.len() as u64)?;
    }
    let _ = fs::remove_file(&config_path);
    let manifest = ImageManifestBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageManifest)
        .config(
            DescriptorBuilder::default()
                .media_type(MediaType::ImageConfig)
                .digest(
                    config_digest
                        .parse::<oci_spec::image::Digest>()
                        .map_err(spec_fail)?,
                )
                .size(config_bytes.len() as u64)
                .build()
                .map_err(spec_fail)?,
        )
        .layers(layers)
        .build()
        .map_err(spec_fail)?;
    let manifest_bytes = serde_json::to_vec(&manifest).expect("a manifest serializes");
    progress(&format!("manifest: {tag}"));
    let digest = registry.put_manifest(
        &tag,
        &manifest_bytes,
        "application/vnd.oci.image.manifest.v1+json",
    )?;
    let mut pinned = target.clone();
    pinned.tag = Some(tag);
    pinned.digest = Some(digest.clone());
    Ok(Pushed {
        reference: pinned.to_string(),
        digest,
        layers: bottom_first.len(),
        sent,
        skipped,
    })
}
