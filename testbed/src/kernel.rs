//! Kernels to boot: Debian's packaged ones (fetched with `apt-get download`, unpacked, modules
//! indexed with `depmod`) or any bzImage with its modules directory. Cached under
//! `target/testbed/kernels/<package file name>/` with a `ready` marker written last, and the
//! package's sha256 recorded beside it.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::{run, Error};

#[derive(Debug, Clone)]
pub struct Kernel {
    /// Short name for tables: `6.1.0-56`, `6.12.117`, or the file name of a given image.
    pub name: String,
    pub image: PathBuf,
    /// `lib/modules/<release>` of this kernel, when it has modules.
    pub modules: Option<PathBuf>,
}

/// The default matrix: the newest Debian 12 6.1 and 6.12 kernels the package index knows.
pub const DEFAULT: [&str; 2] = [
    r"^linux-image-6\.1\.0-[0-9]+-amd64$",
    r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$",
];

/// The newest package whose name matches `regex` (apt's own version order).
fn newest_package(regex: &str) -> Result<String, Error> {
    let out = run(Command::new("apt-cache").args(["search", "--names-only", regex]))?;
    let mut names: Vec<String> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    if names.is_empty() {
        return Err(Error::msg(
            format!("no package matches {regex}"),
            "run `apt-get update` first (the testbed fetches kernels from the Debian archive)",
        ));
    }
    names.sort_by_key(|n| version_key(n));
    Ok(names.pop().unwrap_or_default())
}

/// Numbers in a package name, for ordering `6.1.0-9` before `6.1.0-56`.
fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Fetch (once) and unpack a Debian kernel package matching `regex`.
pub fn debian(cache: &Path, regex: &str) -> Result<Kernel, Error> {
    let package = newest_package(regex)?;
    let dir = cache.join("kernels").join(&package);
    if !dir.join("ready").exists() {
        eprintln!("testbed: fetching {package}");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
        run(Command::new("apt-get")
            .args(["download", "-q", &package])
            .current_dir(&dir))?;
        let deb = std::fs::read_dir(&dir)
            .map_err(Error::io(&dir))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .ok_or_else(|| {
                Error::msg(
                    format!("apt-get download {package} wrote no .deb"),
                    "check the apt sources",
                )
            })?;
        let bytes = std::fs::read(&deb).map_err(Error::io(&deb))?;
        let sum: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(dir.join("root")))?;
        std::fs::remove_file(&deb).map_err(Error::io(&deb))?;
        let release = release_of(&dir.join("root"))?;
        run(Command::new("depmod")
            .arg("-b")
            .arg(dir.join("root"))
            .arg(&release))?;
        std::fs::write(dir.join("sha256"), format!("{sum}  {package}\n"))
            .map_err(Error::io(&dir))?;
        std::fs::write(dir.join("ready"), &release).map_err(Error::io(&dir))?;
    }
    let root = dir.join("root");
    let release = std::fs::read_to_string(dir.join("ready")).map_err(Error::io(&dir))?;
    let name = package
        .trim_start_matches("linux-image-")
        .trim_end_matches("-amd64")
        .trim_end_matches("+deb12")
        .to_string();
    Ok(Kernel {
        name,
        image: root.join(format!("boot/vmlinuz-{release}")),
        modules: Some(root.join("lib/modules").join(&release)),
    })
}

fn release_of(root: &Path) -> Result<String, Error> {
    let modules = root.join("lib/modules");
    std::fs::read_dir(&modules)
        .map_err(Error::io(&modules))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or_else(|| {
            Error::msg(
                format!("no modules in {}", modules.display()),
                "is this a kernel package?",
            )
        })
}

/// `--kernel IMAGE[:MODULES_DIR]`: a kernel built elsewhere.
pub fn given(spec: &str) -> Result<Kernel, Error> {
    let (image, modules) = match spec.split_once(':') {
        Some((i, m)) => (PathBuf::from(i), Some(PathBuf::from(m))),
        None => (PathBuf::from(spec), None),
    };
    if !image.is_file() {
        return Err(Error::msg(
            format!("no kernel image at {}", image.display()),
            "give a bzImage path, optionally `:MODULES_DIR` (lib/modules/<release>)",
        ));
    }
    Ok(Kernel {
        name: image
            .file_name()
            .map_or_else(|| "kernel".into(), |n| n.to_string_lossy().into_owned()),
        image,
        modules,
    })
}

/// The module files (dependencies first) needed to load `names`, per modules.dep.
pub fn module_files(k: &Kernel, names: &[&str]) -> Vec<PathBuf> {
    let Some(dir) = &k.modules else {
        return Vec::new();
    };
    let Ok(dep) = std::fs::read_to_string(dir.join("modules.dep")) else {
        return Vec::new();
    };
    let entry = |name: &str| {
        dep.lines().find_map(|l| {
            let (file, deps) = l.split_once(':')?;
            let base = Path::new(file).file_name()?.to_string_lossy();
            let stem = base.split('.').next()?;
            (stem.replace('-', "_") == name.replace('-', "_")).then(|| {
                (
                    file.to_string(),
                    deps.split_whitespace()
                        .map(str::to_string)
                        .collect::<Vec<_>>(),
                )
            })
        })
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for name in names {
        if let Some((file, deps)) = entry(name) {
            // modules.dep lists dependencies deepest last; load them first.
            for d in deps.iter().rev().chain(std::iter::once(&file)) {
                let p = dir.join(d);
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    out
}
