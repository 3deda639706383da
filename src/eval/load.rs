//! Reading the root file and everything it imports: a depth-first worklist with a stack for
//! cycle detection and a visited map so a file imported twice is read once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{self, ConfigFile, Errors, Loc, SourceFile, Spanned};
use crate::presets;

/// The implicit, lowest-priority import that makes the built-in per-task profiles
/// (`investigate`, `fix`, `implement`) available to every configuration.
pub const BUILTIN_PROFILES: &str = "preset:profiles";

#[derive(Debug, Clone)]
pub enum Root {
    File(PathBuf),
    /// No `sandbox.kdl`: the embedded default, evaluated in `dir`; with the agent preset
    /// `agent` too when the command is that agent (`aisb up -- claude`).
    Default {
        dir: PathBuf,
        agent: Option<&'static str>,
    },
    /// A text not read from disk (tests, fuzzing); `path` names it and anchors relative paths.
    Text {
        path: PathBuf,
        text: String,
    },
}

#[derive(Debug)]
pub struct Loaded {
    pub sources: Vec<SourceFile>,
    /// Decoded files, parallel to `sources`.
    pub files: Vec<ConfigFile>,
    /// Imports before their importers; the root file last.
    pub order: Vec<usize>,
    pub root: usize,
    pub root_kind: Root,
    /// Decoded files to cache (see [`parse_cached`]), unwritten.
    pub memos: Vec<super::plan::Memo>,
}

impl Loaded {
    /// Directory relative paths in the root file are resolved against.
    pub fn base_dir(&self) -> PathBuf {
        match &self.root_kind {
            Root::File(p) => p
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            Root::Default { dir, .. } => dir.clone(),
            Root::Text { path, .. } => path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Key {
    Path(PathBuf),
    Preset(String),
}

struct Loader<'e> {
    sources: Vec<SourceFile>,
    files: Vec<ConfigFile>,
    order: Vec<usize>,
    visited: HashMap<Key, usize>,
    stack: Vec<(Key, String)>,
    errors: &'e mut Errors,
    /// Where decoded files are cached (see [`parse_cached`]); `None`: parse every time.
    cache: Option<PathBuf>,
    memos: Vec<super::plan::Memo>,
}

pub fn load(root: Root, errors: &mut Errors) -> Result<Loaded, std::io::Error> {
    load_cached(root, errors, None)
}

/// [`load`], reusing decoded files cached in `cache`.
pub fn load_cached(
    root: Root,
    errors: &mut Errors,
    cache: Option<PathBuf>,
) -> Result<Loaded, std::io::Error> {
    let mut l = Loader {
        sources: Vec::new(),
        files: Vec::new(),
        order: Vec::new(),
        visited: HashMap::new(),
        stack: Vec::new(),
        errors,
        cache,
        memos: Vec::new(),
    };
    let builtin = presets::get("profiles").expect("built-in profiles preset");
    l.add(
        Key::Preset("profiles".into()),
        BUILTIN_PROFILES.into(),
        None,
        builtin.to_string(),
    );
    let root_idx = match &root {
        Root::File(path) => {
            let text = std::fs::read_to_string(path)?;
            let name = display_name(path);
            let key = Key::Path(path.canonicalize().unwrap_or_else(|_| path.clone()));
            l.add(key, name, Some(path.clone()), text)
        }
        Root::Default { agent: None, .. } => {
            let text = presets::get("default")
                .expect("embedded default")
                .to_string();
            l.add(
                Key::Preset("default".into()),
                "<embedded default>".into(),
                None,
                text,
            )
        }
        Root::Default {
            agent: Some(agent), ..
        } => {
            // The agent's preset after the default: its network and mounts win.
            let text = format!("import \"preset:default\"\nimport \"preset:{agent}\"\n");
            l.add(
                Key::Preset(format!("default+{agent}")),
                format!("<embedded default + preset:{agent}>"),
                None,
                text,
            )
        }
        Root::Text { path, text } => {
            let name = path.file_name().map_or_else(
                || "sandbox.kdl".into(),
                |n| n.to_string_lossy().into_owned(),
            );
            l.add(
                Key::Path(path.clone()),
                name,
                Some(path.clone()),
                text.clone(),
            )
        }
    };
    Ok(Loaded {
        sources: l.sources,
        files: l.files,
        order: l.order,
        root: root_idx,
        root_kind: root,
        memos: l.memos,
    })
}

/// Paths are shown relative to the current directory when they are under it.
pub fn display_name(path: &Path) -> String {
    let cwd = std::env::current_dir().ok();
    match cwd.as_deref().and_then(|c| path.strip_prefix(c).ok()) {
        Some(rel) if !rel.as_os_str().is_empty() => rel.display().to_string(),
        _ => path.display().to_string(),
    }
}

impl Loader<'_> {
    /// Decode a source, then its imports (depth first), then record it in `order`.
    fn add(&mut self, key: Key, name: String, path: Option<PathBuf>, text: String) -> usize {
        let idx = self.sources.len();
        self.sources.push(SourceFile {
            name: name.clone(),
            path: path.clone(),
            text: Arc::new(text),
        });
        let file = parse_cached(
            &self.sources,
            idx,
            self.errors,
            self.cache.as_deref(),
            &mut self.memos,
        );
        self.files.push(ConfigFile::default());
        self.visited.insert(key.clone(), idx);
        self.stack.push((key, name));
        let dir = path
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf);
        for import in &file.imports {
            self.import(import, dir.as_deref());
        }
        self.stack.pop();
        self.files[idx] = file;
        self.order.push(idx);
        idx
    }

    fn import(&mut self, import: &Spanned<String>, dir: Option<&Path>) {
        let loc = import.loc;
        let (key, name, path, text) = if let Some(preset) = import.value.strip_prefix("preset:") {
            match presets::get(preset) {
                Some(text) => (
                    Key::Preset(preset.into()),
                    import.value.clone(),
                    None,
                    text.to_string(),
                ),
                None => {
                    let hint = crate::config::diag::suggest(preset, presets::names());
                    self.err(
                        loc,
                        format!("unknown preset `{preset}`"),
                        "no such preset",
                        Some(match hint {
                            Some(h) => {
                                format!("did you mean `preset:{h}`? (`aisb presets` lists them)")
                            }
                            None => format!(
                                "built-in presets: {}",
                                presets::names().collect::<Vec<_>>().join(", ")
                            ),
                        }),
                    );
                    return;
                }
            }
        } else {
            let Some(dir) = dir else {
                self.err(
                    loc,
                    "a built-in preset can only import other presets".into(),
                    "file import",
                    None,
                );
                return;
            };
            let path = dir.join(&import.value);
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    self.err(
                        loc,
                        format!("cannot read `{}`: {e}", path.display()),
                        "imported here",
                        Some("import paths are relative to the importing file".into()),
                    );
                    return;
                }
            };
            let key = Key::Path(path.canonicalize().unwrap_or_else(|_| path.clone()));
            (key, display_name(&path), Some(path), text)
        };
        if let Some(pos) = self.stack.iter().position(|(k, _)| *k == key) {
            let mut chain: Vec<&str> = self.stack[pos..].iter().map(|(_, n)| n.as_str()).collect();
            chain.push(&self.stack[pos].1);
            self.err(
                loc,
                format!("import cycle: {}", chain.join(" -> ")),
                "imported here",
                Some("remove one of the imports in the cycle".into()),
            );
            return;
        }
        if self.visited.contains_key(&key) {
            return;
        }
        self.add(key, name, path, text);
    }

    fn err(&mut self, loc: Loc, message: String, label: &str, help: Option<String>) {
        self.errors.push(&self.sources, loc, message, label, help);
    }
}

/// [`config::parse`], through a cache of decoded files in `cache` (when given): the KDL parser takes
/// ~0.2 ms per kilobyte, on every command. An entry is named by the hash of the text and of
/// this binary's identity (a rebuilt aisb never reads an older one's entries) and is written
/// only for a file that decoded without errors, so every error is still reported from the
/// text itself.
fn parse_cached(
    sources: &[SourceFile],
    file: usize,
    errors: &mut Errors,
    cache: Option<&std::path::Path>,
    memos: &mut Vec<super::plan::Memo>,
) -> ConfigFile {
    let Some(dir) = cache else {
        return config::parse(sources, file, errors);
    };
    let path = dir.join(format!("{}.json", cache_key(&sources[file].text)));
    if let Ok(bytes) = std::fs::read(&path) {
        if let Ok(decoded) = config::diag::with_file(file, || serde_json::from_slice(&bytes)) {
            return decoded;
        }
    }
    let before = errors.list.len();
    let decoded = config::parse(sources, file, errors);
    if errors.list.len() == before {
        if let Ok(bytes) = serde_json::to_vec(&decoded) {
            memos.push(super::plan::Memo { path, bytes });
        }
    }
    decoded
}

fn cache_key(text: &str) -> String {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::MetadataExt;
    static EXE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let exe = EXE.get_or_init(|| {
        std::env::current_exe()
            .and_then(std::fs::metadata)
            .map_or_else(
                |_| format!("unknown-{}", std::process::id()),
                |m| {
                    format!(
                        "{}:{}:{}:{}.{}",
                        m.dev(),
                        m.ino(),
                        m.size(),
                        m.mtime(),
                        m.mtime_nsec()
                    )
                },
            )
    });
    let mut h = Sha256::new();
    h.update(env!("CARGO_PKG_VERSION"));
    h.update([0]);
    h.update(exe);
    h.update([0]);
    h.update(text);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
