//! Manifests, indexes and image configs: told apart, parsed, and an index entry chosen for
//! this machine's platform.

use oci_spec::image::{Arch, Descriptor, ImageConfiguration, ImageIndex, ImageManifest, Os};
use serde::Deserialize;

/// What a base image's config says that a build and a sandbox use.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct RunConfig {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
}

/// A manifest blob: an index (or Docker manifest list) of manifests, or one image's manifest.
#[derive(Debug, Clone)]
pub enum Document {
    Index(Box<ImageIndex>),
    Manifest(Box<ImageManifest>),
}

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// What `bytes` are, by their media type, or by their shape when they name none (the OCI
/// spec makes `mediaType` optional).
pub fn parse_document(bytes: &[u8]) -> Result<Document, String> {
    #[derive(Deserialize)]
    struct Kind {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        manifests: Option<serde::de::IgnoredAny>,
        config: Option<serde::de::IgnoredAny>,
    }
    let kind: Kind = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let index = match kind.media_type.as_deref() {
        Some(t) if INDEX_TYPES.contains(&t) => true,
        Some(t) if MANIFEST_TYPES.contains(&t) => false,
        t => match (&kind.manifests, &kind.config) {
            (Some(_), None) => true,
            (None, Some(_)) => false,
            _ => {
                return Err(format!(
                    "neither an image index nor an image manifest (media type {})",
                    t.unwrap_or("not given")
                ))
            }
        },
    };
    if index {
        serde_json::from_slice(bytes)
            .map(|i| Document::Index(Box::new(i)))
            .map_err(|e| format!("image index: {e}"))
    } else {
        serde_json::from_slice(bytes)
            .map(|m| Document::Manifest(Box::new(m)))
            .map_err(|e| format!("image manifest: {e}"))
    }
}

/// The parts of an image config that aisb uses.
pub fn parse_config(bytes: &[u8]) -> Result<RunConfig, String> {
    let c: ImageConfiguration = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    Ok(c.config()
        .as_ref()
        .map(|c| RunConfig {
            env: c.env().clone(),
            working_dir: c.working_dir().clone(),
            user: c.user().clone(),
        })
        .unwrap_or_default())
}

pub(super) fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        a => a,
    }
}

/// The CPU variants this machine runs (`None`: the entry names none), best first.
fn variants() -> &'static [Option<&'static str>] {
    match arch() {
        "amd64" => &[None, Some("v1")],
        "arm64" => &[Some("v8"), None],
        "arm" => &[Some("v7"), Some("v6"), Some("v5"), None],
        _ => &[None],
    }
}

/// The index entry for this machine: linux, its architecture, the best CPU variant it runs.
pub fn pick_platform(index: &ImageIndex) -> Option<&Descriptor> {
    let this_arch = Arch::from(arch());
    let candidates: Vec<&Descriptor> = index
        .manifests()
        .iter()
        .filter(|d| {
            d.platform()
                .as_ref()
                .is_some_and(|p| p.os() == &Os::Linux && p.architecture() == &this_arch)
        })
        .collect();
    variants().iter().find_map(|want| {
        candidates
            .iter()
            .copied()
            .find(|d| d.platform().as_ref().and_then(|p| p.variant().as_deref()) == *want)
    })
}
