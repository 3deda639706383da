//! The host's half of credential brokering (issue 31): each `credential`'s real value read
//! where the configuration says (the caller's environment, a file of the user's, a command's
//! output), a placeholder of the same shape made for it, and the user's CA. The real values
//! and the CA key go to the proxy over its stdin; the sandbox gets the placeholders and a
//! bundle of the host's roots and the CA's certificate, beside the proxy's socket.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::RuntimeError;
use crate::config::model::CredentialSource;
use crate::eval::plan::{Credential, Plan};
use crate::proxy::broker::{BrokerConfig, Brokered};

/// The bundle's name in the proxy's directory (`/run/aisb/net` inside).
pub const BUNDLE: &str = "ca-bundle.pem";
/// The variables the ecosystems read for their trusted roots, all pointed at the bundle:
/// OpenSSL and curl, Node, Python's requests and pip, git.
pub const CA_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
];
/// A credential longer than this is not one.
const MAX_VALUE: usize = 16 * 1024;
/// A `from command=` that has not answered by then is killed, and the run does not start.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// The host's roots are read up to this size.
const MAX_ROOTS: u64 = 8 << 20;

pub struct Prepared {
    pub config: BrokerConfig,
    placeholders: Vec<(String, String)>,
    /// Variables of the plan's environment whose values hold a real value (passed under
    /// another name): kept out.
    pub withheld: Vec<String>,
    ca_pem: String,
}

fn err(what: String) -> RuntimeError {
    RuntimeError::Io {
        what,
        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
    }
}

/// The credentials of `plan` read and given placeholders; None when it has none (or none of
/// them has a value on this host: each of the project's own without one is said on stderr,
/// and its variable stays unset inside).
pub fn prepare(plan: &Plan) -> Result<Option<Prepared>, RuntimeError> {
    if plan.credentials.is_empty() {
        return Ok(None);
    }
    let mut credentials = Vec::new();
    let mut placeholders = Vec::new();
    for c in &plan.credentials {
        let Some(real) = read(c, plan)? else {
            // A preset's credential with no value is the usual case (an agent's key the user
            // does not use): said only for the project's own.
            if !c.at.starts_with("preset:") {
                eprintln!(
                    "aisb: credential `{}`: {} has no value here; ${} stays unset inside",
                    c.name, c.source, c.env
                );
            }
            continue;
        };
        let placeholder = placeholder(&real);
        placeholders.push((c.env.clone(), placeholder.clone()));
        credentials.push(Brokered {
            name: c.name.clone(),
            hosts: c.hosts.clone(),
            allow_requests: c.allow_requests.clone(),
            deny_requests: c.deny_requests.clone(),
            header: c.header.clone(),
            scheme: c.scheme,
            placeholder,
            real,
        });
    }
    login_hints(plan, &credentials);
    if credentials.is_empty() {
        return Ok(None);
    }
    let dir = plan
        .store
        .parent()
        .map_or_else(|| plan.store.join("ca"), |p| p.join("ca"));
    let withheld = plan
        .env
        .vars
        .iter()
        .filter(|(_, v)| credentials.iter().any(|c| v.contains(&c.real)))
        .map(|(k, _)| k.clone())
        .collect();
    let ca = crate::proxy::ca::load_or_create(&dir)
        .map_err(|why| err(format!("the credential broker's CA: {why}")))?;
    Ok(Some(Prepared {
        config: BrokerConfig {
            credentials,
            ca_key: ca.key_pem(),
        },
        placeholders,
        withheld,
        ca_pem: ca.cert_pem(),
    }))
}

impl Prepared {
    /// Write the CA bundle into the proxy's directory `dir`; the variables the sandbox gets.
    pub fn finish(self, dir: &Path) -> Result<Vec<(String, String)>, RuntimeError> {
        let roots = crate::proxy::broker::host_roots_file();
        let mut text = String::new();
        if let Ok(f) = std::fs::File::open(&roots) {
            let _ = f.take(MAX_ROOTS).read_to_string(&mut text);
        }
        // Certificates only: a bundle that also holds a key (a proxy's combined PEM) keeps it.
        let mut bundle = String::new();
        let mut inside = false;
        for line in text.lines() {
            if line.starts_with("-----BEGIN CERTIFICATE-----") {
                inside = true;
            }
            if inside {
                bundle.push_str(line);
                bundle.push('\n');
            }
            if line.starts_with("-----END CERTIFICATE-----") {
                inside = false;
            }
        }
        bundle.push_str(&self.ca_pem);
        let path = dir.join(BUNDLE);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, bundle.as_bytes()))
            .map_err(|source| RuntimeError::Io {
                what: format!("writing {}", path.display()),
                source,
            })?;
        let inside = Path::new(crate::vocab::PROXY_DIR).join(BUNDLE);
        let inside = inside.to_string_lossy().into_owned();
        let mut env = self.placeholders;
        env.extend(CA_VARS.iter().map(|v| (v.to_string(), inside.clone())));
        Ok(env)
    }
}

/// A credential's real value, from where it says; None when that source has nothing (an
/// unset variable, a missing file). A value with a line break or other control character is
/// refused: it would be a header of its own.
fn read(c: &Credential, plan: &Plan) -> Result<Option<String>, RuntimeError> {
    let value = match &c.source {
        CredentialSource::Env(v) => match std::env::var(v) {
            Ok(v) => v,
            Err(_) => return Ok(None),
        },
        CredentialSource::File(p) => {
            let path = file_path(p, plan)
                .map_err(|why| err(format!("credential `{}` ({}): {why}", c.name, c.at)))?;
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)
            {
                Ok(f) => {
                    // A regular file of this user's with no other name: not a FIFO that
                    // hangs the start, not a hard link to a file of someone's choosing.
                    let meta = f.metadata().map_err(|source| RuntimeError::Io {
                        what: format!("reading {}", path.display()),
                        source,
                    })?;
                    use std::os::unix::fs::MetadataExt;
                    if !meta.is_file()
                        || meta.nlink() != 1
                        || meta.uid() != nix::unistd::geteuid().as_raw()
                    {
                        return Err(err(format!(
                            "credential `{}` ({}): {} is not a regular file of yours with one name",
                            c.name,
                            c.at,
                            path.display()
                        )));
                    }
                    let mut text = String::new();
                    f.take(MAX_VALUE as u64 + 1)
                        .read_to_string(&mut text)
                        .map_err(|source| RuntimeError::Io {
                            what: format!("reading {} (credential `{}`)", path.display(), c.name),
                            source,
                        })?;
                    text
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(source) => {
                    return Err(RuntimeError::Io {
                        what: format!(
                            "reading {} (credential `{}`; a link there is not followed)",
                            path.display(),
                            c.name
                        ),
                        source,
                    })
                }
            }
        }
        CredentialSource::Command(cmd) => run(cmd, &c.name, &plan.identity.home)?,
    };
    let value = value.trim().to_string();
    if value.is_empty() {
        return Ok(None);
    }
    if value.len() > MAX_VALUE || value.chars().any(char::is_control) {
        return Err(err(format!(
            "credential `{}` ({}): the value from {} is not one credential (longer than {MAX_VALUE} bytes, or holds a line break or control character)",
            c.name, c.at, c.source
        )));
    }
    Ok(Some(value))
}

/// Where `from file=` reads: `~/` the user's home, else an absolute path; never in the
/// project, which the sandbox writes (it could make the file a link to any of the user's
/// files, and the proxy would send that file's text to the credential's hosts).
fn file_path(p: &str, plan: &Plan) -> Result<PathBuf, String> {
    let path = match p.strip_prefix("~/") {
        Some(rest) => plan.identity.home.join(rest),
        None if Path::new(p).is_absolute() => PathBuf::from(p),
        None => return Err(format!("`{p}` is not absolute: write `~/…` or `/…`")),
    };
    let lexical = crate::git::lexical_join(Path::new("/"), &path);
    let project = plan
        .project
        .canonicalize()
        .unwrap_or_else(|_| plan.project.clone());
    let real = lexical.canonicalize().unwrap_or_else(|_| lexical.clone());
    if lexical.starts_with(&plan.project) || real.starts_with(&project) {
        return Err(format!(
            "{} is in the project, which the sandbox writes: keep the credential outside it",
            lexical.display()
        ));
    }
    Ok(lexical)
}

/// The agents' logins that stay on the host (masked inside, wherever a mount shows them: their
/// tokens would be the sandbox's to send anywhere), the preset credentials that would stand in
/// for them, and how to give one a value.
const LOGINS: &[(&str, &str, &[&str], &str)] = &[
    (
        "claude",
        ".claude/.credentials.json",
        &[
            "anthropic-api-key",
            "anthropic-auth-token",
            "claude-oauth-token",
        ],
        "Run `claude setup-token` once and export what it prints as CLAUDE_CODE_OAUTH_TOKEN",
    ),
    (
        "codex",
        ".codex/auth.json",
        &["openai-api-key"],
        "Export an API key as OPENAI_API_KEY",
    ),
    (
        "gemini",
        ".gemini/oauth_creds.json",
        &["gemini-api-key", "google-api-key"],
        "Export an API key as GEMINI_API_KEY",
    ),
    (
        "opencode",
        ".local/share/opencode/auth.json",
        &["openai-api-key", "anthropic-api-key"],
        "Export a provider's API key (ANTHROPIC_API_KEY, OPENAI_API_KEY)",
    ),
];

/// A preset brokers an agent's keys from the caller's environment; a subscription's login is
/// a file in the home, which stays there. Without any key the agent inside is not logged in:
/// say why, and how to hand it a brokered one.
fn login_hints(plan: &Plan, brokered: &[Brokered]) {
    for (agent, file, names, how) in LOGINS {
        // That agent's preset's own credentials (another preset may name the same ones).
        let from = format!("preset:{agent}:");
        let preset = |n: &str| {
            plan.credentials
                .iter()
                .any(|p| p.name == n && p.at.starts_with(&from))
        };
        if !names.iter().all(|n| preset(n))
            || brokered.iter().any(|b| names.contains(&b.name.as_str()))
        {
            continue;
        }
        let login = plan.identity.home.join(file);
        // Said only where it is masked (not under `secrets { defaults #false }`).
        let masked = plan.masks.iter().any(|m| m.path.ends_with(file));
        if masked && std::fs::symlink_metadata(&login).is_ok() {
            eprintln!(
                "aisb: the login in {} stays on the host (inside, its tokens could be sent anywhere). {how}: the sandbox gets a placeholder, and the proxy adds the real value for the agent's API only",
                login.display()
            );
        }
    }
}

/// `from command=`: its output, by `/bin/sh -c`, no stdin, within [`COMMAND_TIMEOUT`].
fn run(cmd: &str, name: &str, home: &Path) -> Result<String, RuntimeError> {
    let mut sh = std::process::Command::new("/bin/sh");
    // Not the project (the sandbox writes there): the user's home. Its stderr stays the
    // user's (`gh` says why it has no token there).
    sh.arg("-c")
        .arg(cmd)
        .current_dir(home)
        .stdin(std::process::Stdio::null());
    let bounds = crate::child::Bounds {
        time: COMMAND_TIMEOUT,
        output: MAX_VALUE as u64 + 1,
    };
    let out = match crate::child::output_within(sh, bounds, false) {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            return Err(err(format!(
                "credential `{name}`: `{cmd}` did not answer within {} s",
                COMMAND_TIMEOUT.as_secs()
            )))
        }
        Err(source) => {
            return Err(RuntimeError::Spawn {
                program: format!("/bin/sh -c {cmd:?} (credential `{name}`)"),
                source,
            })
        }
    };
    let (status, text) = (out.status, out.stdout);
    if !status.success() {
        return Err(err(format!(
            "credential `{name}`: `{cmd}` failed ({status})"
        )));
    }
    String::from_utf8(text).map_err(|_| {
        err(format!(
            "credential `{name}`: `{cmd}` printed something other than text"
        ))
    })
}

/// Prefixes the providers publish for their keys' kinds: a placeholder keeps one, so a client
/// that checks a key's form still starts. Nothing else of a value is kept (its dashes and
/// underscores, where they fall, would be bits of the secret).
const PUBLIC_PREFIXES: &[&str] = &[
    "sk-ant-api03-",
    "sk-ant-oat01-",
    "sk-ant-admin01-",
    "sk-ant-",
    "sk-proj-",
    "sk-svcacct-",
    "sk-admin-",
    "sk-",
    "github_pat_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "AIza",
    "hf_",
    "npm_",
    "pypi-",
];

/// A placeholder of the real value's shape: its published prefix (`sk-ant-api03-`, `ghp_`,
/// [`PUBLIC_PREFIXES`]) if it has one, then random letters and digits to the same length.
/// Different in every run.
pub fn placeholder(real: &str) -> String {
    let prefix = PUBLIC_PREFIXES
        .iter()
        .find(|p| real.starts_with(*p) && real.len() > p.len() + 8)
        .copied()
        .unwrap_or("");
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let rest = real.len() - prefix.len();
    let mut bytes = vec![0u8; rest.max(1)];
    random(&mut bytes);
    let mut out = prefix.to_string();
    out.extend(
        bytes[..rest]
            .iter()
            .map(|r| ALNUM[*r as usize % ALNUM.len()] as char),
    );
    if out == real {
        // Astronomically unlikely; still never the value itself.
        out.pop();
        out.push(if real.ends_with('x') { 'y' } else { 'x' });
    }
    out
}

fn random(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: the pointer and length are the unfilled part of `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n <= 0 {
            // getrandom(2) does not fail on a running system; a counter is not a secret anyway.
            for (i, b) in buf[filled..].iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(31);
            }
            return;
        }
        filled += n as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_keep_the_shape_and_differ() {
        let real = "sk-ant-api03-AbCdEf0123456789-xyzXYZ_0000";
        let a = placeholder(real);
        let b = placeholder(real);
        assert_eq!(a.len(), real.len());
        assert!(a.starts_with("sk-ant-api03-"), "{a}");
        assert_ne!(a, real);
        assert_ne!(a, b);
        // Nothing of the secret part, not even where its dashes fall.
        assert!(!a["sk-ant-api03-".len()..].contains(['-', '_']), "{a}");
        let google = placeholder("AIzaSyB3x_Q9kLm-0123456789abcdefghijk");
        assert!(
            google.starts_with("AIza") && !google.starts_with("AIzaSyB3x_"),
            "{google}"
        );
        let password = placeholder("my-secret_pw");
        assert!(!password.starts_with("my-"), "{password}");
        let gh = placeholder("ghp_0123456789abcdefABCDEF0123456789abcd");
        assert!(gh.starts_with("ghp_") && gh.len() == 40, "{gh}");
    }
}
