use std::path::{Path, PathBuf};

use crate::Error;

/// One-time root step on Ubuntu 23.10+: an AppArmor profile that lets aisb make user namespaces
///
/// Ubuntu restricts unprivileged user namespaces to programs whose AppArmor profile allows them
/// (`kernel.apparmor_restrict_unprivileged_userns=1`). Turning that off is a machine-wide
/// security change; this profile instead gives the permission to this aisb binary (and the
/// bubblewrap and init it starts, which run under it) and to nothing else. It is otherwise
/// unconfined: aisb's own isolation is its seccomp filter, namespaces and masks. Installed as
/// /etc/apparmor.d/aisb and loaded with apparmor_parser; run it again after moving aisb. The
/// binary and every directory above it must be root's alone (copy it to /usr/local/bin):
/// otherwise anyone who can replace it gets the permission.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  sudo \"$(command -v aisb)\" setup-apparmor\n  aisb setup-apparmor --print   # the profile, installed nowhere"
)]
pub struct Args {
    /// Print the profile instead of installing it
    #[arg(long)]
    pub print: bool,
}

/// Where the profile is installed.
const PROFILE_FILE: &str = "/etc/apparmor.d/aisb";

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ApparmorError {
    #[error("{path}: {why}: an AppArmor profile names its program by a path without spaces, quotes or control characters")]
    #[diagnostic(help(
        "install aisb at a plain path (e.g. /usr/local/bin/aisb) and run this again"
    ))]
    BadPath { path: PathBuf, why: &'static str },
    #[error("apparmor_parser could not load {PROFILE_FILE}: {detail}")]
    #[diagnostic(help("apparmor_parser comes with the `apparmor` package; AppArmor 4 (Ubuntu 24.04) knows the `userns` rule"))]
    Load { detail: String },
}

/// The profile for the aisb binary at `exe` (and its init, when it is a separate file).
pub fn profile(exe: &Path, init: &Path) -> Result<String, ApparmorError> {
    let plain = |p: &Path| -> Result<String, ApparmorError> {
        let s = p.to_str().ok_or(ApparmorError::BadPath {
            path: p.to_path_buf(),
            why: "not UTF-8",
        })?;
        // Letters, digits and `/._+-` alone: anything else may be an AppArmor glob, escape
        // (`\/`) or syntax.
        if !s.starts_with('/')
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '+' | '-'))
        {
            return Err(ApparmorError::BadPath {
                path: p.to_path_buf(),
                why: "not a plain absolute path",
            });
        }
        // A path an ordinary user could replace would give user namespaces to whatever they
        // put there: the binary and every directory above it must be root's and not writable
        // by others.
        for a in p.ancestors() {
            use std::os::unix::fs::MetadataExt;
            if let Ok(md) = std::fs::symlink_metadata(a) {
                if md.uid() != 0 || md.mode() & 0o022 != 0 {
                    return Err(ApparmorError::BadPath {
                        path: p.to_path_buf(),
                        why: "it, or a directory above it, is not root's alone",
                    });
                }
            }
        }
        Ok(s.to_string())
    };
    let mut text = String::from(
        "# Written by `aisb setup-apparmor`: aisb (and the bubblewrap and init it starts, which run\n\
         # under this profile) may make user namespaces, which Ubuntu otherwise restricts to\n\
         # profiled programs. Nothing else is granted or confined.\n\
         abi <abi/4.0>,\n\
         include <tunables/global>\n\n",
    );
    text.push_str(&format!(
        "profile aisb {} flags=(unconfined) {{\n  userns,\n\n  include if exists <local/aisb>\n}}\n",
        plain(exe)?
    ));
    if init != exe {
        text.push_str(&format!(
            "\nprofile aisb-init {} flags=(unconfined) {{\n  userns,\n}}\n",
            plain(init)?
        ));
    }
    Ok(text)
}

pub fn run(a: Args) -> Result<i32, Error> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let exe = std::env::current_exe()
        .and_then(|e| e.canonicalize())
        .map_err(io(Path::new("/proc/self/exe")))?;
    let init = crate::init::binary_beside(&exe);
    let text = profile(&exe, &init).map_err(Error::from)?;
    if a.print {
        print!("{text}");
        return Ok(0);
    }
    crate::atomic::write_atomic(Path::new(PROFILE_FILE), text.as_bytes())
        .map_err(io(Path::new(PROFILE_FILE)))?;
    let out = std::process::Command::new("apparmor_parser")
        .args(["-r", PROFILE_FILE])
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            eprintln!(
                "{PROFILE_FILE}: aisb at {} may make user namespaces (loaded)",
                exe.display()
            );
            Ok(0)
        }
        Ok(o) => Err(ApparmorError::Load {
            detail: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        }
        .into()),
        Err(e) => Err(ApparmorError::Load {
            detail: e.to_string(),
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_names_aisb_and_its_init_and_refuses_odd_paths() {
        let p = profile(
            Path::new("/usr/local/bin/aisb"),
            Path::new("/usr/local/bin/aisb-init"),
        )
        .unwrap();
        assert!(p.contains("profile aisb /usr/local/bin/aisb flags=(unconfined) {\n  userns,\n"));
        assert!(p.contains("profile aisb-init /usr/local/bin/aisb-init flags=(unconfined)"));
        assert!(p.starts_with("# Written by") && p.contains("abi <abi/4.0>,"));
        let same = profile(Path::new("/opt/aisb"), Path::new("/opt/aisb")).unwrap();
        assert!(!same.contains("aisb-init"));
        for bad in [
            "/a b/aisb",
            "/x/aisb\n/y",
            "relative/aisb",
            "/x/{a}",
            "/x/\"a",
        ] {
            assert!(
                profile(Path::new(bad), Path::new("/usr/bin/true")).is_err(),
                "{bad:?}"
            );
        }
    }
}
