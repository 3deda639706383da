//! The user's own certificate authority for credential brokering (issue 31): the proxy
//! terminates TLS only for hosts a credential is bound to, with a leaf certificate for that
//! host signed here; the sandbox trusts this CA through the bundle its run is given.
//!
//! Only the key is kept (`$XDG_CACHE_HOME/aisb/ca/key.pem`, 0600 in a 0700 directory, never
//! visible inside). The certificate is made again from it with fixed parameters wherever it
//! is needed: the subject and the key identifier (taken from the public key) are the same
//! every time, so leaves signed by one process chain to the certificate another wrote.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA's subject: what a user sees when a client shows who issued a terminated host's
/// certificate.
pub const CA_NAME: &str = "aisb credential broker (this user's own CA)";
/// The key file under the CA's directory.
pub const KEY_FILE: &str = "key.pem";
/// A key file larger than this is not a key (read with a bound).
const MAX_KEY: u64 = 16 * 1024;

pub struct Ca {
    key: KeyPair,
    cert: rcgen::Certificate,
}

/// The CA's parameters: the same every time (see the module's text).
fn ca_params() -> Result<CertificateParams, String> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.distinguished_name.push(DnType::OrganizationName, "aisb");
    // Signs leaves only: no intermediate below it.
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2049, 12, 31);
    Ok(p)
}

impl Ca {
    /// The CA of a key in PEM form.
    pub fn from_key_pem(pem: &str) -> Result<Ca, String> {
        let key = KeyPair::from_pem(pem).map_err(|e| format!("the CA key does not parse: {e}"))?;
        let cert = ca_params()?
            .self_signed(&key)
            .map_err(|e| format!("making the CA certificate: {e}"))?;
        Ok(Ca { key, cert })
    }

    /// A new CA (a new P-256 key).
    pub fn generate() -> Result<Ca, String> {
        let key = KeyPair::generate().map_err(|e| format!("making a CA key: {e}"))?;
        Self::from_key_pem(&key.serialize_pem())
    }

    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// The certificate, in PEM form (what the sandbox trusts).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// A leaf certificate for `host` with `key`, valid from a day before now to a year after,
    /// for serving TLS only.
    pub fn leaf(&self, host: &str, key: &KeyPair) -> Result<CertificateDer<'static>, String> {
        let mut p = CertificateParams::new(vec![host.to_string()]).map_err(|e| e.to_string())?;
        p.distinguished_name.push(DnType::CommonName, host);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.use_authority_key_identifier_extension = true;
        let now = rcgen::date_time_ymd(1970, 1, 1)
            + std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
        p.not_before = now - std::time::Duration::from_secs(86_400);
        p.not_after = now + std::time::Duration::from_secs(365 * 86_400);
        let cert = p
            .signed_by(key, &self.cert, &self.key)
            .map_err(|e| format!("making a certificate for {host}: {e}"))?;
        Ok(cert.der().clone())
    }
}

/// A key for leaves (one per proxy process: every terminated host's certificate carries it).
pub fn leaf_key() -> Result<(KeyPair, PrivateKeyDer<'static>), String> {
    let key = KeyPair::generate().map_err(|e| format!("making a key: {e}"))?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok((key, der))
}

/// The user's CA, kept in `dir` (made 0700; the key 0600): read when it is there, made and
/// written when it is not. Nothing below `dir` is followed through a link, and a key file
/// that is not a regular file of this user's is refused, not used.
pub fn load_or_create(dir: &Path) -> Result<Ca, String> {
    let shown = dir.display();
    match std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) => return Err(format!("making {shown}: {e}")),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{shown}: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || std::os::unix::fs::MetadataExt::uid(&meta) != me {
        return Err(format!(
            "{shown} is not a directory of this user's: move it away (aisb makes its CA there)"
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{shown}: {e}"))?;
    }
    let path = dir.join(KEY_FILE);
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(f) => {
            let meta = f
                .metadata()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if !meta.is_file()
                || std::os::unix::fs::MetadataExt::uid(&meta) != me
                || meta.permissions().mode() & 0o077 != 0
            {
                return Err(format!(
                    "{} is not a key file of this user's alone (0600): remove it, and aisb makes a new CA",
                    path.display()
                ));
            }
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_KEY), &mut text)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ca::from_key_pem(&text).map_err(|e| {
                format!(
                    "{}: {e}; remove it, and aisb makes a new CA",
                    path.display()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let ca = Ca::generate()?;
            // Written whole under a temporary name and renamed into place: two runs that
            // make one at once each keep the CA they made.
            crate::atomic::write_atomic_private(&path, ca.key_pem().as_bytes())
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            Ok(ca)
        }
        Err(e) => Err(format!(
            "{}: {e} (a link there is refused: remove it, and aisb makes a new CA)",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leaf signed by the CA remade from its key verifies against the certificate another
    /// process wrote from the same key.
    #[test]
    fn leaves_chain_to_the_ca_remade_from_its_key() {
        let t = tempfile::tempdir().unwrap();
        let first = load_or_create(&t.path().join("ca")).unwrap();
        let again = load_or_create(&t.path().join("ca")).unwrap();
        assert_eq!(first.key_pem(), again.key_pem());
        let mode = std::fs::metadata(t.path().join("ca").join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (key, _) = leaf_key().unwrap();
        let leaf = again.leaf("api.example.test", &key).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(first.cert_der()).unwrap();
        let roots = std::sync::Arc::new(roots);
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots,
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let name = rustls::pki_types::ServerName::try_from("api.example.test").unwrap();
        let now = rustls::pki_types::UnixTime::now();
        rustls::client::danger::ServerCertVerifier::verify_server_cert(
            verifier.as_ref(),
            &leaf,
            &[],
            &name,
            &[],
            now,
        )
        .unwrap();
        let other = rustls::pki_types::ServerName::try_from("other.test").unwrap();
        assert!(
            rustls::client::danger::ServerCertVerifier::verify_server_cert(
                verifier.as_ref(),
                &leaf,
                &[],
                &other,
                &[],
                now,
            )
            .is_err()
        );
    }

    /// A link planted where the key goes is refused, not followed.
    #[test]
    fn a_link_in_place_of_the_key_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ca");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join(KEY_FILE)).unwrap();
        let err = load_or_create(&dir).err().unwrap();
        assert!(err.contains("link"), "{err}");
    }
}
