//! Resolving bases: references, documents, platforms, nesting, and the registry client
//! against loopback servers.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::*;

#[test]
fn references() {
    let r = Reference::parse("debian").unwrap();
    assert_eq!(
        (r.registry.as_str(), r.repo.as_str(), r.tag.as_deref()),
        ("docker.io", "library/debian", Some("latest"))
    );
    let r = Reference::parse("127.0.0.1:5000/team/base:1").unwrap();
    assert_eq!(
        (r.registry.as_str(), r.repo.as_str(), r.tag.as_deref()),
        ("127.0.0.1:5000", "team/base", Some("1"))
    );
    assert_eq!(r.base_url(), "http://127.0.0.1:5000/v2/team/base");
    let d = format!("sha256:{}", "a".repeat(64));
    let r = Reference::parse(&format!("ghcr.io/o/i@{d}")).unwrap();
    assert_eq!(
        (r.tag.clone(), r.digest.as_deref()),
        (None, Some(d.as_str()))
    );
    assert!(r.base_url().starts_with("https://ghcr.io/"));
    assert!(Reference::parse("x@sha256:12").is_err());
    assert!(Reference::parse("upper/Case").is_err());
    // An uppercase first component is a registry's name (as Docker reads it).
    assert_eq!(Reference::parse("UPPER/case").unwrap().registry, "UPPER");
}

/// Plain HTTP is for a registry on this machine only: the name must be loopback exactly,
/// not merely start like one.
#[test]
fn only_an_exactly_loopback_registry_gets_plain_http() {
    for local in [
        "localhost/x",
        "localhost:5000/x",
        "127.0.0.1/x",
        "127.1.2.3:80/x",
        "[::1]/x",
        "[::1]:5000/x",
    ] {
        let r = Reference::parse(local).unwrap();
        assert!(
            r.base_url().starts_with("http://"),
            "{local}: {}",
            r.base_url()
        );
    }
    for remote in [
        "localhost.evil.com/x",
        "localhost.evil.com:5000/x",
        "localhostx:5000/x",
        "127.0.0.1.nip.io/x",
        "127.evil.com/x",
        "[::1].evil.com/x",
    ] {
        match Reference::parse(remote) {
            Ok(r) => assert!(
                r.base_url().starts_with("https://"),
                "{remote}: {}",
                r.base_url()
            ),
            Err(e) => assert!(remote.starts_with('['), "{remote}: {e}"),
        }
    }
}

/// Docker Hub's official images live under `library/`, whichever of its names is written.
#[test]
fn docker_hub_names_of_one_component_are_library_images() {
    for name in [
        "debian",
        "docker.io/debian",
        "index.docker.io/debian",
        "registry-1.docker.io/debian",
        "docker.io/library/debian",
    ] {
        let r = Reference::parse(name).unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repo.as_str()),
            ("docker.io", "library/debian"),
            "{name}"
        );
        assert_eq!(
            r.base_url(),
            "https://registry-1.docker.io/v2/library/debian",
            "{name}"
        );
    }
    let r = Reference::parse("docker.io/team/tool:1").unwrap();
    assert_eq!(r.repo, "team/tool");
    // Compared exactly, as Docker does: another spelling is another registry's name.
    assert_eq!(
        Reference::parse("Docker.io/x").unwrap().registry,
        "Docker.io"
    );
}

/// Found by fuzzing (`fuzz/fuzz_targets/image_reference.rs`): a reference prints as text
/// that parses back to it, the length limit included.
#[test]
fn a_reference_parses_back_from_its_printed_form() {
    for text in [
        format!("{}/x", "a".repeat(240)),
        "a".repeat(240),
        "dockerSio/l:12".to_string(),
        "[::1]:5000/a".into(),
    ] {
        let r = Reference::parse(&text).unwrap();
        assert_eq!(Reference::parse(&r.to_string()), Ok(r), "{text}");
    }
}

/// Whatever a reference says ends up in a URL path: only the grammar's characters get
/// there.
#[test]
fn references_outside_the_distribution_grammar_are_refused() {
    let hex = "a".repeat(64);
    for bad in [
        "x:a?b".to_string(),
        "x:a#b".into(),
        "x:a/../../b".into(),
        "x:".into(),
        "x:-a".into(),
        format!("x:{}", "a".repeat(129)),
        "x:tä".into(),
        "a//b".into(),
        "a/-b".into(),
        "a/b-".into(),
        "a..b".into(),
        "a___b".into(),
        "/a".into(),
        "a/".into(),
        "".into(),
        "ex ample.com/a".into(),
        "-bad.com/a".into(),
        "example.com:port/a".into(),
        format!("x@sha256:{}", hex.to_uppercase()),
        format!("x@sha256:{}", &hex[1..]),
        format!("x@sha512:{}", "a".repeat(128)),
        format!("x@{hex}"),
        format!("x@sha256:{hex}@sha256:{hex}"),
        format!("{}/x", "a".repeat(300)),
        format!("x/{}", "a".repeat(256)),
    ] {
        assert!(Reference::parse(&bad).is_err(), "`{bad}` was accepted");
    }
    for good in [
        "a__b/c.d/e-f/g---h:W_1.x-2",
        "my.registry.example:5000/a/b@sha256:AAAA",
        "Registry.Example/a",
    ] {
        let good = good.replace("AAAA", &hex);
        assert!(Reference::parse(&good).is_ok(), "`{good}` was refused");
    }
    let r = Reference::parse(&format!("h.io/a:t@sha256:{hex}")).unwrap();
    assert_eq!(
        (r.tag.as_deref(), r.digest.clone()),
        (Some("t"), Some(format!("sha256:{hex}")))
    );
}

/// The entry for this machine: linux, its architecture, a CPU variant it runs (an index
/// lists arm64/v8 beside amd64, and attestations as unknown/unknown).
#[test]
#[cfg(target_arch = "x86_64")]
fn an_index_entry_is_chosen_by_os_architecture_and_variant() {
    let entry = |os: &str, arch: &str, variant: Option<&str>, n: char| {
        let mut p = serde_json::json!({"os": os, "architecture": arch});
        if let Some(v) = variant {
            p["variant"] = v.into();
        }
        serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{}", n.to_string().repeat(64)), "size": 1, "platform": p})
    };
    let index = |entries: Vec<serde_json::Value>| -> ImageIndex {
        serde_json::from_value(serde_json::json!({"schemaVersion": 2, "manifests": entries}))
            .unwrap()
    };
    let chosen = |i: &ImageIndex| pick_platform(i).map(|d| d.digest().to_string());
    let i = index(vec![
        entry("unknown", "unknown", None, '0'),
        entry("linux", "arm64", Some("v8"), '1'),
        entry("linux", "amd64", Some("v3"), '2'),
        entry("windows", "amd64", None, '3'),
        entry("linux", "amd64", None, '4'),
    ]);
    assert_eq!(chosen(&i), Some(format!("sha256:{}", "4".repeat(64))));
    let i = index(vec![entry("linux", "amd64", Some("v1"), '5')]);
    assert_eq!(chosen(&i), Some(format!("sha256:{}", "5".repeat(64))));
    // A CPU level this machine may not have is not taken for it.
    let i = index(vec![entry("linux", "amd64", Some("v3"), '6')]);
    assert_eq!(chosen(&i), None);
}

/// Manifests, indexes and configs are the spec's types: what a registry sends that is
/// neither, or lacks what the spec requires, is an error, never a guess.
#[test]
fn documents_are_told_apart_by_media_type_or_shape() {
    let d = format!("sha256:{}", "a".repeat(64));
    let desc = serde_json::json!({"mediaType": "application/vnd.oci.image.config.v1+json", "digest": d, "size": 2});
    let manifest = serde_json::json!({"schemaVersion": 2, "config": desc, "layers": [desc]});
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [desc]});
    let bytes = |v: &serde_json::Value| serde_json::to_vec(v).unwrap();
    assert!(matches!(
        parse_document(&bytes(&manifest)),
        Ok(Document::Manifest(_))
    ));
    assert!(matches!(
        parse_document(&bytes(&index)),
        Ok(Document::Index(_))
    ));
    let mut docker_list = index.clone();
    docker_list["mediaType"] = "application/vnd.docker.distribution.manifest.list.v2+json".into();
    assert!(matches!(
        parse_document(&bytes(&docker_list)),
        Ok(Document::Index(_))
    ));
    let mut mislabelled = manifest.clone();
    mislabelled["mediaType"] = "application/vnd.oci.image.index.v1+json".into();
    for bad in [
        mislabelled,
        serde_json::json!({"schemaVersion": 1, "fsLayers": []}),
        serde_json::json!({"schemaVersion": 2, "config": desc, "layers": [{"digest": d}]}),
        serde_json::json!({"schemaVersion": 2, "config": desc, "layers": [], "manifests": []}),
        serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "x", "digest": "sha256:é", "size": 1}]}),
    ] {
        assert!(parse_document(&bytes(&bad)).is_err(), "{bad}");
    }
    assert!(parse_config(br#"{"config": {"Env": ["A=1"]}}"#).is_err());
    let c = parse_config(br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{"Env":["A=1"],"User":"u","WorkingDir":"/w","ExposedPorts":{"80/tcp":{}}}}"#).unwrap();
    assert_eq!(
        c,
        RunConfig {
            env: Some(vec!["A=1".into()]),
            working_dir: Some("/w".into()),
            user: Some("u".into())
        }
    );
}

/// An index's manifests may be indexes again, twice at most: a registry cannot keep aisb
/// following them.
#[test]
fn an_index_nested_deeper_than_two_levels_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let ok = nested_layout(&t.path().join("two"), 2);
    let r = resolve(
        &Source::Layout {
            dir: ok.clone(),
            tag: None,
        },
        None,
    );
    assert!(r.is_ok(), "two nested indexes: {:?}", r.err());
    let deep = nested_layout(&t.path().join("three"), 3);
    let r = resolve(
        &Source::Layout {
            dir: deep,
            tag: None,
        },
        None,
    );
    let e = r.err().expect("three nested indexes were followed");
    assert!(e.what.contains("nested"), "{e}");
}

/// An OCI layout whose index.json names an image index that nests `depth` indexes in all
/// above one manifest (no layers).
fn nested_layout(dir: &Path, depth: usize) -> PathBuf {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let put = |v: serde_json::Value| -> serde_json::Value {
        let b = serde_json::to_vec(&v).unwrap();
        let d = sha256_hex(&b);
        fs::write(blobs.join(&d[7..]), &b).unwrap();
        let media = if v.get("manifests").is_some() {
            "application/vnd.oci.image.index.v1+json"
        } else if v.get("layers").is_some() {
            "application/vnd.oci.image.manifest.v1+json"
        } else {
            "application/vnd.oci.image.config.v1+json"
        };
        serde_json::json!({"mediaType": media, "digest": d, "size": b.len(),
            "platform": {"os": "linux", "architecture": arch()}})
    };
    let config = put(serde_json::json!({"architecture": arch(), "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": []}, "config": {"Env": ["A=1"]}}));
    let mut top = put(serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config, "layers": []}));
    for _ in 0..depth {
        top = put(serde_json::json!({"schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [top]}));
    }
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [top]})).unwrap(),
    )
    .unwrap();
    dir.to_path_buf()
}

/// A loopback HTTP server for registry tests: answers each request with `answer(head)`
/// (the request line and headers), records every head, and stops when dropped or after
/// 30 s, whichever comes first.
struct Loopback {
    port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Loopback {
    fn start(answer: impl Fn(&str) -> String + Send + 'static) -> Loopback {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while !stop2.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                };
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
                    match s.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let reply = answer(&head);
                seen2.lock().unwrap().push(head);
                let _ = s.write_all(reply.as_bytes());
            }
        });
        Loopback { port, seen, stop }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn http(status: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r
}

/// A registry on 127.0.0.1 that asks for a token at `realm` (its `{self}` replaced by its
/// own address) and serves `manifest` to a request carrying that token.
fn token_registry(realm: &str, manifest: &'static str) -> Loopback {
    let realm = realm.to_string();
    let own = std::sync::Arc::new(std::sync::OnceLock::<u16>::new());
    let own2 = own.clone();
    let reg = Loopback::start(move |head| {
        let me = format!("127.0.0.1:{}", own2.get().copied().unwrap_or(0));
        let challenge = format!(
            "Bearer realm=\"{}\",service=\"svc\",scope=\"repository:a:pull,push\"",
            realm.replace("{self}", &me)
        );
        if head.starts_with("GET /token") {
            http("200 OK", &[], r#"{"token":"T0K"}"#)
        } else if head.contains("Bearer T0K") {
            http(
                "200 OK",
                &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
                manifest,
            )
        } else {
            http("401 Unauthorized", &[("WWW-Authenticate", &challenge)], "")
        }
    });
    own.set(reg.port).unwrap();
    reg
}

/// A hostile registry's realm must not make aisb request another service on this machine:
/// the other port never sees a connection.
#[test]
fn a_realm_on_another_loopback_port_is_refused_before_connecting() {
    let other = Loopback::start(|_| http("200 OK", &[], r#"{"token":"T0K"}"#));
    for realm in [
        format!("http://127.0.0.1:{}/token", other.port),
        format!("https://127.0.0.1:{}/token", other.port),
        format!("http://localhost:{}/token", other.port),
    ] {
        let reg = token_registry(&realm, "{}");
        let r = Reference::parse(&format!("127.0.0.1:{}/a:1", reg.port)).unwrap();
        let got = Registry::new(&r).manifest("1");
        let e = got
            .err()
            .unwrap_or_else(|| panic!("{realm}: a token was fetched"));
        assert!(e.what.contains("realm"), "{realm}: {e}");
        assert_eq!(other.seen(), Vec::<String>::new(), "{realm}: {e}");
    }
}

/// The cloud metadata service (or any internal address) as a realm is refused by looking
/// at the URL: no connection is tried.
#[test]
fn a_realm_at_the_metadata_service_is_refused_without_a_request() {
    for realm in [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "https://169.254.169.254/token",
        "https://[::ffff:169.254.169.254]/token",
        "https://[fd00:ec2::254]/token",
        "https://10.0.0.1/token",
        "file:///etc/passwd",
    ] {
        let reg = token_registry(realm, "{}");
        let r = Reference::parse(&format!("127.0.0.1:{}/a:1", reg.port)).unwrap();
        let e = Registry::new(&r).manifest("1").unwrap_err();
        assert!(e.what.contains("refusing the token realm"), "{realm}: {e}");
        // One request to the registry itself, none for a token.
        assert_eq!(reg.seen().len(), 1, "{realm}");
    }
}

/// A redirect is checked like a realm: a registry cannot bounce aisb to another port.
#[test]
fn a_redirect_to_another_loopback_port_is_refused_before_connecting() {
    let other = Loopback::start(|_| http("200 OK", &[], "{}"));
    let to = format!("http://127.0.0.1:{}/v2/a/manifests/1", other.port);
    let reg = Loopback::start(move |_| http("307 Temporary Redirect", &[("Location", &to)], ""));
    let r = Reference::parse(&format!("127.0.0.1:{}/a:1", reg.port)).unwrap();
    let e = Registry::new(&r).manifest("1").unwrap_err();
    assert!(e.what.contains("refusing the redirect"), "{e}");
    assert_eq!(other.seen(), Vec::<String>::new());
    // To its own authority, a redirect is followed.
    let own = Loopback::start(|head| {
        if head.starts_with("GET /v2/a/manifests/1 ") {
            http("302 Found", &[("Location", "/elsewhere")], "")
        } else {
            http("200 OK", &[], "moved")
        }
    });
    let r = Reference::parse(&format!("127.0.0.1:{}/a:1", own.port)).unwrap();
    assert_eq!(Registry::new(&r).manifest("1").unwrap().0, b"moved");
}

/// `scope="repository:a:pull,push"` is one parameter: its comma is inside quotes.
#[test]
fn a_quoted_comma_in_the_challenge_stays_in_the_scope() {
    let manifest = r#"{"schemaVersion":2}"#;
    let reg = token_registry("http://{self}/token", manifest);
    let r = Reference::parse(&format!("127.0.0.1:{}/a:1", reg.port)).unwrap();
    let (bytes, _) = Registry::new(&r).manifest("1").unwrap();
    assert_eq!(bytes, manifest.as_bytes());
    let token_request = reg
        .seen()
        .into_iter()
        .find(|h| h.starts_with("GET /token"))
        .unwrap();
    let line = token_request.lines().next().unwrap();
    assert!(
        line.contains("scope=repository%3Aa%3Apull%2Cpush") && line.contains("service=svc"),
        "{line}"
    );
}
