//! Images built without a daemon (issue 8), as root: a Dockerfile on a Debian base (made with
//! debootstrap once and cached as an OCI layout) runs in a sandbox on both backends; the
//! graph rebuilds exactly what changed; corrupted entries are rebuilt; concurrent builds build
//! once; `--locked` catches a moved tag on a registry running on loopback; steps cannot reach
//! the host's network or files.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use support::{git_in, root_or_skip, Out};

const CACHE: &str = "/var/cache/aisb-test";

/// A Debian bookworm root made by debootstrap, as an OCI layout (`oci:DIR:1`), made once per
/// machine (locked against other test processes).
fn debian_layout() -> PathBuf {
    static DONE: OnceLock<PathBuf> = OnceLock::new();
    DONE.get_or_init(|| {
        let layout = Path::new(CACHE).join("debian-bookworm.oci");
        std::fs::create_dir_all(CACHE).unwrap();
        let lock = std::fs::File::create(Path::new(CACHE).join(".lock")).unwrap();
        // SAFETY: flock on our own descriptor; released when it closes.
        assert_eq!(
            unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
            0
        );
        if !layout.join("index.json").exists() {
            let rootfs = Path::new(CACHE).join("debian-bookworm.rootfs");
            let _ = std::fs::remove_dir_all(&rootfs);
            eprintln!("making the Debian base image once (debootstrap, ~1 min)…");
            let st = Command::new(if Path::new("/usr/sbin/debootstrap").exists() {
                "/usr/sbin/debootstrap"
            } else {
                "debootstrap"
            })
            .args(["--variant=minbase", "bookworm"])
            .arg(&rootfs)
            .arg("http://deb.debian.org/debian")
            .stdout(Stdio::null())
            .status()
            .expect("debootstrap (scripts/setup-tests.sh installs it)");
            assert!(st.success(), "debootstrap failed");
            let _ = std::fs::remove_dir_all(&layout);
            layout_of(&rootfs, &layout, "1");
            let _ = std::fs::remove_dir_all(&rootfs);
        }
        layout
    })
    .clone()
}

/// `tests/images/oci-layout.sh`: an OCI layout of one layer from `rootfs`.
fn layout_of(rootfs: &Path, out: &Path, tag: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images/oci-layout.sh");
    let o = Command::new(script)
        .arg(rootfs)
        .arg(out)
        .arg(tag)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// One project with its own cache and store, so the nodes built are this test's alone (each
/// test unpacks the base layer once, ~8 s).
struct Proj {
    dir: tempfile::TempDir,
}

impl Proj {
    fn new() -> Proj {
        let dir = tempfile::tempdir().unwrap();
        let p = Proj { dir };
        std::fs::create_dir_all(p.proj()).unwrap();
        std::fs::create_dir_all(p.dir.path().join("home")).unwrap();
        git_in(&p.proj(), &["init", "-q"]);
        p
    }
    /// A project whose sandbox is built from [`dockerfile`] on the Debian base, copying
    /// `data/file` (`data`).
    fn with_dockerfile(data: &str, nonce: &str, middle: &str) -> Proj {
        let p = Proj::new();
        p.write("data/file", data);
        p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
        p.write("Dockerfile", &dockerfile(&debian_layout(), nonce, middle));
        p
    }
    fn proj(&self) -> PathBuf {
        self.dir.path().join("proj")
    }
    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }
    fn store(&self) -> PathBuf {
        self.cache().join("aisb/store")
    }
    fn write(&self, rel: &str, text: &str) {
        let p = self.proj().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    /// aisb in the project, its configuration trusted: the images are built from the shared
    /// Debian base, a layout outside the project (a loosening aisb asks about).
    fn aisb(&self) -> Command {
        let mut cmd = self.aisb_asking();
        cmd.arg("--trust");
        cmd
    }
    /// aisb in the project, asking about what the configuration loosens as a user's would.
    fn aisb_asking(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_aisb"));
        cmd.current_dir(self.proj())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_CACHE_HOME", self.cache())
            .stdin(Stdio::null());
        cmd
    }
    /// `aisb build --json [extra]`: (exit ok, the outcome of each node by its text, stderr).
    fn build(&self, extra: &[&str]) -> (bool, Vec<(String, String)>, String) {
        let o = self
            .aisb()
            .arg("build")
            .arg("--json")
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let nodes = v["nodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| {
                        (
                            n["what"].as_str().unwrap_or("").to_string(),
                            n["outcome"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        (o.status.success(), nodes, err)
    }
    fn built(&self, extra: &[&str]) -> Vec<String> {
        let (ok, nodes, err) = self.build(extra);
        assert!(ok, "aisb build failed: {err}");
        nodes
            .into_iter()
            .filter(|(_, o)| o == "built")
            .map(|(w, _)| w)
            .collect()
    }
    fn run(&self, backend: &str, script: &str) -> Out {
        Out::from(
            self.aisb()
                .args(["run", "--backend", backend, "--", "/bin/sh", "-c", script])
                .output()
                .unwrap(),
        )
    }
}

/// A copy of the layout `base` whose image config has `env` added: another image over the
/// same layers.
fn with_env(base: &Path, out: &Path, env: &str) {
    derive(base, out, Some(env), &[]);
}

/// A copy of the layout `base`, with `env` added to its config and, when `files` is not empty,
/// one more layer holding them (names with `.wh.` are OCI whiteouts, as written).
fn derive(base: &Path, out: &Path, env: Option<&str>, files: &[(&str, &[u8])]) {
    use sha2::Digest;
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for e in std::fs::read_dir(base.join("blobs/sha256"))
        .unwrap()
        .flatten()
    {
        // Copied, not linked: a link would change the shared base under a concurrent reader.
        std::fs::copy(e.path(), blobs.join(e.file_name())).unwrap();
    }
    let put_bytes = |b: &[u8]| -> (String, usize) {
        let d = hex::encode(sha2::Sha256::digest(b));
        std::fs::write(blobs.join(&d), b).unwrap();
        (format!("sha256:{d}"), b.len())
    };
    let put = |v: &serde_json::Value| put_bytes(&serde_json::to_vec(v).unwrap());
    let read = |d: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(blobs.join(&d[7..])).unwrap()).unwrap()
    };
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.join("index.json")).unwrap()).unwrap();
    let mut manifest = read(index["manifests"][0]["digest"].as_str().unwrap());
    let mut config = read(manifest["config"]["digest"].as_str().unwrap());
    if let Some(env) = env {
        config["config"]["Env"]
            .as_array_mut()
            .unwrap()
            .push(env.into());
    }
    if !files.is_empty() {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, content) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(content.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            tar.append_data(&mut h, path, *content).unwrap();
        }
        let raw = tar.into_inner().unwrap();
        let diff_id = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&raw)));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &raw).unwrap();
        let (d, n) = put_bytes(&gz.finish().unwrap());
        manifest["layers"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": n,
            }));
        config["rootfs"]["diff_ids"]
            .as_array_mut()
            .unwrap()
            .push(diff_id.into());
    }
    let (d, n) = put(&config);
    manifest["config"]["digest"] = d.into();
    manifest["config"]["size"] = n.into();
    let (d, n) = put(&manifest);
    index["manifests"][0]["digest"] = d.into();
    index["manifests"][0]["size"] = n.into();
    std::fs::write(out.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::copy(base.join("oci-layout"), out.join("oci-layout")).unwrap();
}

fn overlay_mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(" - overlay "))
        .count()
}

fn dockerfile(base: &Path, nonce: &str, middle: &str) -> String {
    format!(
        "FROM oci:{}:1\nARG USER_NAME\nARG USER_ID\nARG GROUP_ID\nRUN echo \"$USER_NAME:$USER_ID:$GROUP_ID\" > /etc/built-for\nRUN echo {nonce} > /etc/nonce\n{middle}\nCOPY data/ /opt/data/\nRUN cat /opt/data/file > /etc/copied\n",
        base.display()
    )
}

#[test]
fn a_dockerfile_image_runs_a_command_on_both_backends() {
    if !root_or_skip("images") {
        return;
    }
    let base = debian_layout();
    let p = Proj::new();
    let host_secret = p.dir.path().join("host-only-file");
    std::fs::write(&host_secret, "secret").unwrap();
    p.write("data/file", "payload\n");
    // bwrap is on the host, not in a minimal Debian: the step sees the image, not the host.
    let steps = format!(
        "RUN test ! -e {} && test ! -e /usr/bin/bwrap",
        host_secret.display()
    );
    p.write("Dockerfile", &dockerfile(&base, "n1", &steps));
    p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    let built = p.built(&[]);
    assert_eq!(built.len(), 6, "base layer, 3 RUNs, COPY, RUN: {built:?}");
    assert!(p.proj().join("sandbox.lock").is_file());
    let before = overlay_mounts();
    for backend in ["bwrap", "libcontainer"] {
        let out = p.run(
            backend,
            "cat /etc/built-for /etc/nonce /etc/copied /etc/debian_version; test -e /usr/bin/bwrap && echo HOST-ROOT; touch /usr/x 2>/dev/null && echo WROTE-IMAGE; pwd",
        );
        assert_eq!(out.code, 0, "{backend}: {}", out.stderr);
        assert!(
            out.stdout.contains("root:0:0\nn1\npayload\n12."),
            "{backend}: {}",
            out.stdout
        );
        assert!(
            !out.stdout.contains("HOST-ROOT"),
            "{backend}: the host's root is visible"
        );
        assert!(
            !out.stdout.contains("WROTE-IMAGE"),
            "{backend}: the image is writable"
        );
        assert!(
            out.stdout.contains(&p.proj().display().to_string()),
            "{backend}: not in the project: {}",
            out.stdout
        );
    }
    assert_eq!(
        overlay_mounts(),
        before,
        "a mount of the image was left on the host"
    );
}

/// `aisb plan`, `aisb spec` and `aisb export` describe the sandbox on its image, never the
/// host's root it does not get: before the build the image's directories are unknown (spec
/// refuses), after it they are the image's; a bundle for another runtime is refused.
#[test]
fn plan_and_spec_show_the_images_root_and_export_refuses_it() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::with_dockerfile("payload\n", "n-plan", "");
    let out = |args: &[&str]| Out::from(p.aisb().args(args).output().unwrap());
    let plan = out(&["plan"]);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert!(
        plan.stdout
            .contains("the image's top-level directories, once it is built"),
        "{}",
        plan.stdout
    );
    assert!(
        !plan.stdout.contains("world-readable"),
        "the host's /etc in an image's plan: {}",
        plan.stdout
    );
    let spec = out(&["spec"]);
    assert_ne!(spec.code, 0);
    assert!(spec.stderr.contains("is not built yet"), "{}", spec.stderr);

    p.built(&[]);
    let plan = out(&["plan"]);
    assert!(
        plan.stdout.contains("/usr (image)") && plan.stdout.contains("/etc (image)"),
        "{}",
        plan.stdout
    );
    assert!(!plan.stdout.contains("world-readable"), "{}", plan.stdout);
    let json: serde_json::Value = serde_json::from_str(&out(&["plan", "--json"]).stdout).unwrap();
    let kinds: Vec<&str> = json["system"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"image") && !kinds.contains(&"bind") && !kinds.contains(&"snapshot"),
        "{kinds:?}"
    );
    let spec = out(&["spec"]);
    assert_eq!(spec.code, 0, "{}", spec.stderr);
    let spec: serde_json::Value = serde_json::from_str(&spec.stdout).unwrap();
    let usr = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == "/usr")
        .expect("a /usr mount");
    assert!(
        usr["source"].as_str().unwrap().ends_with("/rootfs/usr"),
        "{usr}"
    );
    let bundle = p.dir.path().join("bundle");
    let export = out(&["export", "bundle", bundle.to_str().unwrap()]);
    assert_ne!(export.code, 0);
    assert!(
        export.stderr.contains("cannot be exported"),
        "{}",
        export.stderr
    );
    assert!(!bundle.join("config.json").exists());
}

/// The sandbox masks the project's secrets; an image must not hand them back: COPY leaves
/// masked files out of a copied directory (so neither a RUN step nor the sandbox sees them)
/// and refuses to copy one by name.
#[test]
fn copy_never_puts_a_masked_secret_into_the_image() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::new();
    p.write(".env", "API_TOKEN=hunter2-top-level\n");
    p.write("app/.env", "API_TOKEN=hunter2-nested\n");
    p.write(
        "app/id_ed25519",
        "-----BEGIN OPENSSH PRIVATE KEY----- hunter2-key\n",
    );
    p.write("app/main.sh", "echo hello\n");
    p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    let from = format!("FROM oci:{}:1\n", debian_layout().display());
    p.write(
        "Dockerfile",
        &format!("{from}COPY . /src/\nRUN echo step sees: $(cat /src/app/.env /src/app/id_ed25519 /src/.env 2>&1)\n"),
    );
    let (ok, _, err) = p.build(&[]);
    assert!(ok, "{err}");
    assert!(
        !err.contains("hunter2"),
        "a RUN step read a masked secret: {err}"
    );
    assert!(
        err.contains("step sees: cat: /src/app/.env: No such file"),
        "{err}"
    );
    for backend in ["bwrap", "libcontainer"] {
        let out = p.run(
            backend,
            "cat /src/app/main.sh; grep -r hunter2 /src /etc /opt 2>/dev/null; true",
        );
        assert_eq!(out.code, 0, "{backend}: {}", out.stderr);
        assert!(
            out.stdout.contains("echo hello"),
            "{backend}: {}",
            out.stdout
        );
        assert!(
            !out.stdout.contains("hunter2"),
            "{backend}: a masked secret is in the image: {}",
            out.stdout
        );
    }
    p.write("Dockerfile", &format!("{from}COPY app/.env /etc/app.env\n"));
    let (ok, _, err) = p.build(&[]);
    assert!(!ok, "a masked file was copied by name");
    assert!(
        err.contains("is never copied into an image")
            && err.contains("masks it")
            && err.contains("Dockerfile:2"),
        "{err}"
    );
}

/// A source that sends a layer without end (here an OCI layout whose layer blob is
/// /dev/zero) is cut at the size its manifest gives and refused, instead of filling the disk.
#[test]
fn a_layer_longer_than_its_manifest_says_is_cut_and_refused() {
    if !root_or_skip("images") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("root/etc")).unwrap();
    std::fs::write(t.path().join("root/etc/hello"), "hi\n").unwrap();
    let layout = t.path().join("img.oci");
    layout_of(&t.path().join("root"), &layout, "1");
    let json = |digest: &str| -> serde_json::Value {
        let path = layout.join("blobs/sha256").join(&digest[7..]);
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest = json(index["manifests"][0]["digest"].as_str().unwrap());
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    let blob = layout.join("blobs/sha256").join(&layer[7..]);
    std::fs::remove_file(&blob).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &blob).unwrap();
    let p = Proj::new();
    p.write(
        "sandbox.kdl",
        &format!("rootfs from=\"oci:{}:1\"\n", layout.display()),
    );
    let mut child = p
        .aisb()
        .args(["build"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("aisb build kept reading an endless layer");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "an endless layer was accepted");
    // Cut where the manifest says the layer ends: the unpacker or the size check refuses it.
    assert!(err.contains(&layer[..20]), "{err}");
}

#[test]
fn a_changed_run_rebuilds_that_step_and_later_only_and_an_unchanged_build_is_all_hits() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::with_dockerfile("one\n", "a", "RUN echo middle-1 > /etc/middle");
    assert_eq!(p.built(&[]).len(), 6);
    assert_eq!(
        p.built(&[]),
        Vec::<String>::new(),
        "an unchanged rebuild built something"
    );
    p.write(
        "Dockerfile",
        &dockerfile(&debian_layout(), "a", "RUN echo middle-2 > /etc/middle"),
    );
    assert_eq!(
        p.built(&[]),
        [
            "RUN echo middle-2 > /etc/middle",
            "COPY data/ /opt/data/",
            "RUN cat /opt/data/file > /etc/copied"
        ]
    );
    let out = p.run("bwrap", "cat /etc/middle /etc/nonce");
    assert_eq!(out.stdout, "middle-2\na\n");
}

#[test]
fn a_copied_files_content_change_is_detected_and_its_mtime_change_is_not() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::with_dockerfile("one\n", "b", "");
    p.built(&[]);
    let f = std::fs::File::options()
        .write(true)
        .open(p.proj().join("data/file"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(3600))
        .unwrap();
    drop(f);
    assert_eq!(
        p.built(&[]),
        Vec::<String>::new(),
        "an mtime change rebuilt"
    );
    p.write("data/file", "two\n");
    assert_eq!(
        p.built(&[]),
        [
            "COPY data/ /opt/data/",
            "RUN cat /opt/data/file > /etc/copied"
        ]
    );
    assert_eq!(p.run("libcontainer", "cat /etc/copied").stdout, "two\n");
    // A mode change is content too (it is what the image will have).
    std::fs::set_permissions(
        p.proj().join("data/file"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    assert_eq!(p.built(&[]).len(), 2);
}

#[test]
fn a_corrupted_store_entry_is_rebuilt() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::with_dockerfile("x\n", "c", "");
    p.built(&[]);
    // The entry of `RUN echo c > /etc/nonce`: an interrupted build left it without its marker
    // and with wrong content.
    let out = p.aisb().args(["build", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let node = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["what"] == "RUN echo c > /etc/nonce")
        .unwrap();
    let entry = PathBuf::from(node["entry"].as_str().unwrap());
    let marker = PathBuf::from(format!("{}.ready", entry.display()));
    std::fs::remove_file(&marker).unwrap();
    std::fs::write(entry.join("etc/nonce"), "tampered\n").unwrap();
    let built = p.built(&[]);
    assert!(
        built.contains(&"RUN echo c > /etc/nonce".to_string()),
        "{built:?}"
    );
    assert!(marker.is_file());
    assert_eq!(p.run("bwrap", "cat /etc/nonce").stdout, "c\n");
}

#[test]
fn two_concurrent_builds_build_each_node_once() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::with_dockerfile("x\n", "d", "RUN sleep 1");
    let spawn = || {
        p.aisb()
            .args(["build", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let outcomes = |c: std::process::Child| -> Vec<(String, String)> {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["what"].as_str().unwrap().to_string(),
                    n["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let (a, b) = (outcomes(a), outcomes(b));
    for ((what, oa), (_, ob)) in a.iter().zip(&b) {
        if oa == "config" {
            continue;
        }
        let built = [oa, ob].iter().filter(|o| **o == "built").count();
        assert_eq!(built, 1, "{what}: built {built} times ({oa}, {ob})");
    }
}

/// A registry on a loopback port (Debian's `docker-registry`), stopped when dropped.
struct Registry {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    fn start() -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = dir.path().join("config.yml");
        std::fs::write(
            &cfg,
            format!("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n", dir.path().join("data").display()),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (scripts/setup-tests.sh installs it)");
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the registry did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            port,
            _dir: dir,
        }
    }
    fn push(&self, layout: &Path, tag: &str) {
        let st = Command::new("skopeo")
            .args(["copy", "-q", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:1", layout.display()))
            .arg(format!("docker://127.0.0.1:{}/base:{tag}", self.port))
            .status()
            .expect("skopeo (scripts/setup-tests.sh installs it)");
        assert!(st.success());
    }
}

/// `COPY . …` (the whole project) and the lock file the build writes into that project: the
/// lock is never an input, so the build after it is all cache hits and `--locked` passes.
#[test]
fn copying_the_whole_project_leaves_the_lock_file_out() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::new();
    p.write("app.sh", "echo app\n");
    p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    p.write(
        "Dockerfile",
        &format!("FROM oci:{}:1\nCOPY . /src/\n", debian_layout().display()),
    );
    assert_eq!(p.built(&[]).len(), 2, "layer, COPY");
    assert!(p.proj().join("sandbox.lock").is_file());
    assert_eq!(
        p.built(&[]),
        Vec::<String>::new(),
        "the written lock file changed the COPY"
    );
    let (ok, _, err) = p.build(&["--locked"]);
    assert!(ok, "--locked failed right after a build: {err}");
    let out = p.run(
        "bwrap",
        "cat /src/app.sh; test -e /src/sandbox.lock && echo LOCK-COPIED; true",
    );
    assert_eq!(out.stdout, "echo app\n", "{}", out.stderr);
    p.write(
        "Dockerfile",
        &format!(
            "FROM oci:{}:1\nCOPY sandbox.lock /x\n",
            debian_layout().display()
        ),
    );
    let (ok, _, err) = p.build(&[]);
    assert!(
        !ok && err.contains("sandbox.lock is the build's output"),
        "{err}"
    );
}

#[test]
fn locked_builds_catch_a_moved_tag_on_a_loopback_registry() {
    if !root_or_skip("images") {
        return;
    }
    let base = debian_layout();
    let reg = Registry::start();
    reg.push(&base, "1");
    let p = Proj::new();
    p.write(
        "sandbox.kdl",
        &format!("image \"dev\" {{\n    from \"127.0.0.1:{}/base:1\"\n    env \"A\" \"from-kdl\"\n    run \"echo pulled > /etc/pulled\"\n    copy \"f\" \"/opt/f\" chmod=\"0600\"\n}}\nrootfs image=\"dev\"\n", reg.port),
    );
    p.write("f", "file\n");
    assert_eq!(p.built(&[]).len(), 3, "layer, RUN, COPY");
    let out = p.run("bwrap", "cat /etc/pulled; echo $A; stat -c %a /opt/f");
    assert_eq!(out.stdout, "pulled\nfrom-kdl\n600\n", "{}", out.stderr);
    let lock = std::fs::read_to_string(p.proj().join("sandbox.lock")).unwrap();
    let (ok, _, err) = p.build(&["--locked"]);
    assert!(ok, "--locked failed with nothing moved: {err}");

    // Another image under the same tag (the same layer, another config).
    let other = tempfile::tempdir().unwrap();
    let moved = other.path().join("moved.oci");
    with_env(&base, &moved, "MOVED=1");
    reg.push(&moved, "1");
    let (ok, _, err) = p.build(&["--locked"]);
    assert!(!ok, "--locked passed although the tag moved");
    assert!(
        err.contains("now points at") && err.contains("sandbox.lock"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(p.proj().join("sandbox.lock")).unwrap(),
        lock,
        "--locked wrote the lock"
    );
    // Without --locked the pin holds: the same image, all cached.
    assert_eq!(p.built(&[]), Vec::<String>::new());
    // --pull takes the new image and pins it.
    p.built(&["--pull"]);
    assert_ne!(
        std::fs::read_to_string(p.proj().join("sandbox.lock")).unwrap(),
        lock
    );
    assert!(p.build(&["--locked"]).0);
    // Built once, the sandbox starts with the registry gone.
    drop(reg);
    let out = p.run("libcontainer", "cat /etc/pulled");
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "pulled\n"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_layer_that_does_not_match_its_digest_is_never_used() {
    if !root_or_skip("images") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("root/etc")).unwrap();
    std::fs::write(t.path().join("root/etc/hello"), "hi\n").unwrap();
    let layout = t.path().join("img.oci");
    layout_of(&t.path().join("root"), &layout, "1");
    // Flip one byte of the layer (the largest blob).
    let blob = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .flatten()
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&blob).unwrap();
    let n = bytes.len() / 2;
    bytes[n] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let p = Proj::new();
    p.write(
        "sandbox.kdl",
        &format!("rootfs from=\"oci:{}:1\"\n", layout.display()),
    );
    let (ok, _, err) = p.build(&[]);
    assert!(!ok, "a corrupt layer was accepted");
    assert!(err.contains("digest") || err.contains("corrupt"), "{err}");
    let ready = std::fs::read_dir(p.store())
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".ready"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(
        ready, 0,
        "something of the corrupt image was stored as ready"
    );
}

#[test]
fn build_steps_cannot_reach_the_hosts_network_or_files() {
    if !root_or_skip("images") {
        return;
    }
    let base = debian_layout();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let p = Proj::new();
    p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    let secret = p.dir.path().join("host-secret");
    std::fs::write(&secret, "s").unwrap();
    for (attack, what) in [
        (
            format!("RUN bash -c 'echo x > /dev/tcp/127.0.0.1/{port}'"),
            "a loopback port of the host",
        ),
        (format!("RUN cat {}", secret.display()), "a host file"),
        ("RUN mount -t tmpfs none /mnt".to_string(), "mount"),
    ] {
        p.write(
            "Dockerfile",
            &format!("FROM oci:{}:1\n{attack}\n", base.display()),
        );
        let (ok, _, err) = p.build(&[]);
        assert!(!ok, "a build step reached {what}: {err}");
        assert!(err.contains("exited"), "{what}: {err}");
    }
    assert!(
        listener.accept().is_err(),
        "the host's listener got a connection"
    );
}

#[test]
fn a_dockerfile_outside_the_subset_is_an_error_naming_its_line() {
    let p = Proj::new();
    p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    p.write("Dockerfile", "FROM scratch\nRUN true\nEXPOSE 80\n");
    let (ok, _, err) = p.build(&[]);
    assert!(!ok);
    assert!(
        err.contains("Dockerfile:3") && err.contains("EXPOSE"),
        "{err}"
    );
    p.write("sandbox.kdl", "rootfs image=\"nope\"\n");
    let (ok, _, err) = p.build(&[]);
    assert!(!ok);
    assert!(
        err.contains("no image named `nope`") && err.contains("sandbox.kdl"),
        "{err}"
    );
}

#[test]
fn store_gc_keeps_what_the_lock_file_pins_and_sweeps_dead_step_scratch() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::with_dockerfile("x\n", "gc", "");
    p.built(&[]);
    let gc = |dry: bool| -> serde_json::Value {
        let mut cmd = p.aisb();
        cmd.args(["store", "gc", "--json"]);
        if dry {
            cmd.arg("--dry-run");
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // A step's scratch directory left by a builder that died (pid 0 never runs a build).
    let dead = p.store().join(".work/0-3");
    std::fs::create_dir_all(dead.join("bundle")).unwrap();
    let v = gc(false);
    let removed: Vec<&str> = v["removed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert_eq!(removed, [".work/0-3"], "{v}");
    assert!(!dead.exists());
    // Only the lock file still pins the image (the run's record aged out): still kept.
    for state in walk_states(&p.cache()) {
        let _ = std::fs::remove_file(state.join("store-refs.json"));
    }
    assert_eq!(
        gc(true)["removed"].as_array().unwrap().len(),
        0,
        "gc would remove what sandbox.lock pins"
    );
    std::fs::remove_file(p.proj().join("sandbox.lock")).unwrap();
    let removed = gc(false)["removed"].as_array().unwrap().len();
    assert!(
        removed >= 6,
        "the unpinned image (5 layers, its entry) stayed ({removed} removed)"
    );
    // And a build after gc rebuilds it: the base layer and four steps.
    assert_eq!(p.built(&[]).len(), 5);
}

fn walk_states(cache: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(cache.join("aisb"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name() != "store")
        .flat_map(|repo| {
            std::fs::read_dir(repo.path())
                .into_iter()
                .flatten()
                .flatten()
                .map(|s| s.path())
        })
        .collect()
}

#[test]
fn an_oci_archive_is_a_base_too() {
    if !root_or_skip("images") {
        return;
    }
    let base = debian_layout();
    let p = Proj::new();
    let archive = p.dir.path().join("base.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&base)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    p.write(
        "sandbox.kdl",
        &format!("rootfs from=\"oci-archive:{}:1\"\n", archive.display()),
    );
    assert_eq!(p.built(&[]).len(), 1, "the base layer");
    let out = p.run("libcontainer", "cat /etc/debian_version");
    assert!(out.stdout.starts_with("12."), "{}", out.stderr);
}

/// A layer that deletes a file of the base (whiteout) and hides a directory's contents
/// (opaque): as root and as an ordinary user (whose layers carry `user.overlay.*` and whose
/// overlay is mounted in a user namespace).
fn whiteout_layout(dir: &Path) -> PathBuf {
    let layout = dir.join("wh.oci");
    derive(
        &debian_layout(),
        &layout,
        None,
        &[
            ("etc/.wh.debian_version", b""),
            ("usr/share/doc/.wh..wh..opq", b""),
            ("usr/share/doc/only", b"only\n"),
        ],
    );
    layout
}

const WHITEOUT_CHECK: &str = "test ! -e /etc/debian_version && echo deleted; ls /usr/share/doc; test -e /usr/bin/bash && echo base";

#[test]
fn whiteouts_and_opaque_directories_of_a_layer_hide_what_is_below() {
    if !root_or_skip("images") {
        return;
    }
    let p = Proj::new();
    let layout = whiteout_layout(p.dir.path());
    p.write(
        "sandbox.kdl",
        &format!("rootfs from=\"oci:{}:1\"\n", layout.display()),
    );
    assert_eq!(p.built(&[]).len(), 2, "two layers");
    for backend in ["bwrap", "libcontainer"] {
        let out = p.run(backend, WHITEOUT_CHECK);
        assert_eq!(
            out.stdout, "deleted\nonly\nbase\n",
            "{backend}: {}",
            out.stderr
        );
    }
}

#[test]
fn an_ordinary_user_runs_an_image_on_both_backends_and_is_told_what_needs_root() {
    if !root_or_skip("images") {
        return;
    }
    let (uid, gid) = support::test_user();
    let p = Proj::new();
    let layout = whiteout_layout(p.dir.path());
    p.write(
        "sandbox.kdl",
        &format!("rootfs from=\"oci:{}:1\"\n", layout.display()),
    );
    support::chown_r(p.dir.path(), uid, gid);
    let as_user = |args: &[&str]| {
        let mut cmd = p.aisb();
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        Out::from(cmd.args(args).output().unwrap())
    };
    let before = overlay_mounts();
    // No backend named: bwrap; then libcontainer, named.
    for backend in [&[][..], &["--backend", "libcontainer"][..]] {
        let mut args = vec!["run"];
        args.extend_from_slice(backend);
        let script = format!("{WHITEOUT_CHECK}; id -u; touch /usr/x 2>/dev/null || echo RO");
        args.extend_from_slice(&["--", "/bin/sh", "-c", &script]);
        let out = as_user(&args);
        assert_eq!(
            out.stdout,
            format!("deleted\nonly\nbase\n{uid}\nRO\n"),
            "{backend:?}: {}",
            out.stderr
        );
        assert_eq!(overlay_mounts(), before);
    }

    // A user without subordinate ids (the one-time root step not taken) is told what it is,
    // for libcontainer on an image and for RUN steps; bwrap still runs the image.
    let other = "aisb-test-nosub";
    let (ouid, ogid) = support::create_user(other);
    for f in ["/etc/subuid", "/etc/subgid"] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with(&format!("{other}:")) || l.starts_with(&format!("{ouid}:"))),
            "{other} must have no subordinate ids for this test"
        );
    }
    let q = Proj::new();
    q.write(
        "sandbox.kdl",
        &format!("rootfs from=\"oci:{}:1\"\n", layout.display()),
    );
    support::chown_r(q.dir.path(), ouid, ogid);
    let as_other = |args: &[&str]| {
        let mut cmd = q.aisb();
        std::os::unix::process::CommandExt::uid(&mut cmd, ouid);
        std::os::unix::process::CommandExt::gid(&mut cmd, ogid);
        Out::from(cmd.args(args).output().unwrap())
    };
    let out = as_other(&["run", "--", "/bin/sh", "-c", WHITEOUT_CHECK]);
    assert_eq!(out.stdout, "deleted\nonly\nbase\n", "{}", out.stderr);
    let out = as_other(&["run", "--backend", "libcontainer", "--", "true"]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("setup-user") && out.stderr.contains("--backend bwrap"),
        "{}",
        out.stderr
    );
    q.write(
        "Dockerfile",
        &format!("FROM oci:{}:1\nRUN true\n", layout.display()),
    );
    q.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    support::chown_r(&q.proj(), ouid, ogid);
    let out = as_other(&["build"]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("subordinate") && out.stderr.contains("setup-user"),
        "{}",
        out.stderr
    );
}

/// Every file below `dir` (no link followed) whose owner is not `uid`:`gid`, as `path uid:gid`.
fn not_owned_by(dir: &Path, uid: u32, gid: u32) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let m = e.path().symlink_metadata().ok()?;
            ((m.uid(), m.gid()) != (uid, gid))
                .then(|| format!("{} {}:{}", e.path().display(), m.uid(), m.gid()))
        })
        .collect()
}

/// Issue 22: an ordinary user builds the project's Dockerfile as themselves, with their name
/// and ids as build arguments: RUN steps as root over their subordinate ids (useradd, chown,
/// writes into /etc and /usr, a deletion of a base file, a USER step), a cached rebuild is all
/// hits, the sandbox on it is the caller with every file's owner as the image gave it, the
/// graph hash is root's for the same inputs, a failed step leaves nothing, and `aisb store gc`
/// removes every file of their subordinate ids.
#[test]
fn an_ordinary_user_builds_their_dockerfile_as_themselves_and_gc_leaves_nothing_behind() {
    if !root_or_skip("images") {
        return;
    }
    let (uid, gid) = support::test_user();
    let name = nix::unistd::User::from_uid(uid.into())
        .unwrap()
        .unwrap()
        .name;
    let dockerfile = format!(
        "FROM oci:{}:1
ARG USER_NAME
ARG USER_ID
ARG GROUP_ID
RUN groupadd -g $GROUP_ID $USER_NAME && useradd -M -d /opt/u -u $USER_ID -g $GROUP_ID $USER_NAME
RUN mkdir /opt/app /opt/u && chown 42:42 /opt/app && chown $USER_ID:$GROUP_ID /opt/u && echo made > /usr/local/share/made && echo conf > /etc/made.conf
RUN rm /etc/debian_version
COPY copied/ /opt/copied/
USER $USER_NAME
RUN id -u > /opt/u/step-uid && echo mine > /opt/u/mine && stat -c %u:%g / > /opt/u/steproot && ls /proc/self/fd | tr '\\n' ' ' > /opt/u/fds && if [ -c /proc/timer_list ]; then echo masked > /opt/u/proc; fi
",
        debian_layout().display()
    );
    let p = Proj::new();
    p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    p.write("Dockerfile", &dockerfile);
    p.write("copied/f", "copied\n");
    support::chown_r(p.dir.path(), uid, gid);
    let as_user = |args: &[&str]| {
        let mut cmd = p.aisb();
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        // A descriptor the caller left open (fd 10, not close-on-exec): no step or sandbox
        // may get it.
        // SAFETY: dup2 is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::dup2(2, 10) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Out::from(cmd.args(args).output().unwrap())
    };
    let outcomes = |out: &Out| -> (String, Vec<String>) {
        let v: serde_json::Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\n{}", out.stdout, out.stderr));
        let o = v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| !n["entry"].is_null())
            .map(|n| n["outcome"].as_str().unwrap().to_string())
            .collect();
        (v["hash"].as_str().unwrap().to_string(), o)
    };
    let out = as_user(&["build", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (hash, built) = outcomes(&out);
    assert!(built.iter().all(|o| o == "built"), "{built:?}");
    assert_eq!(
        built.len(),
        6,
        "the base layer, four steps and a COPY: {built:?}"
    );
    let out = as_user(&["build", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (again, cached) = outcomes(&out);
    assert_eq!(again, hash);
    assert!(
        cached.iter().all(|o| o == "cached"),
        "a rebuild is all hits: {cached:?}"
    );

    // The same inputs built by root: the same graph hash (it never depends on who built it).
    let root_proj = Proj::new();
    root_proj.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    root_proj.write("Dockerfile", &dockerfile);
    root_proj.write("copied/f", "copied\n");
    let mut cmd = root_proj.aisb();
    cmd.args(["build", "--json"]);
    for (keys, v) in [
        (&["USER_NAME", "USERNAME"][..], name.clone()),
        (&["USER_ID", "USER_UID", "UID"][..], uid.to_string()),
        (&["GROUP_ID", "USER_GID", "GID"][..], gid.to_string()),
    ] {
        for k in keys {
            cmd.args(["--build-arg", &format!("{k}={v}")]);
        }
    }
    let out = Out::from(cmd.output().unwrap());
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        outcomes(&out).0,
        hash,
        "root's graph hash for the same inputs"
    );

    // The sandbox on it: the caller, with every file's owner as the image gave it.
    let probe = "echo uid=$(id -u) gid=$(id -g) name=$(id -un) steproot=$(cat /opt/u/steproot)
        echo copied=$(stat -c %u:%g /opt/copied /opt/copied/f)
        echo app=$(stat -c %u:%g /opt/app) made=$(stat -c %u:%g /usr/local/share/made)
        echo shadow=$(stat -c %u:%g /etc/shadow) mine=$(stat -c %u:%g /opt/u/mine)
        echo step=$(cat /opt/u/step-uid) conf=$(cat /etc/made.conf)
        echo stepfds=$(cat /opt/u/fds) stepproc=$(cat /opt/u/proc)
        echo fds=$(ls /proc/self/fd | tr '\\n' ' ')
        test -e /etc/debian_version; echo deleted=$?
        touch /usr/x 2>/dev/null; echo usr=$?
        echo hi > written && echo project=ok";
    for backend in ["bwrap", "libcontainer"] {
        let out = as_user(&["run", "--backend", backend, "--", "/bin/sh", "-c", probe]);
        assert_eq!(out.code, 0, "{backend}: {}\n{}", out.stdout, out.stderr);
        // The step's "/" was root's, as in root's build.
        out.expect("uid", &format!("{uid} gid={gid} name={name} steproot=0:0"));
        // COPY gives what it copies root's (or --chown's), as root's build does.
        out.expect("copied", "0:0 0:0");
        out.expect("shadow", &format!("0:42 mine={uid}:{gid}"));
        out.expect("step", &format!("{uid} conf=conf"));
        out.expect("deleted", "1");
        // stdin, stdout, stderr and the listed directory: nothing else reached them.
        // /proc's kernel interfaces were masked for the step (/dev/null over timer_list).
        out.expect("stepfds", "0 1 2 3 stepproc=masked");
        out.expect("fds", "0 1 2 3");
        out.expect_failed("usr", "the image is read-only in the sandbox");
        out.expect("project", "ok");
        // Nothing of the project is anyone's but the caller's on the host.
        assert_eq!(
            not_owned_by(&p.proj(), uid, gid),
            Vec::<String>::new(),
            "{backend}"
        );
    }

    // Pushed by the user: the registry gets the image's own owners (read and tarred inside
    // their namespace), as root sees when it runs the pulled image.
    let reg = Registry::start();
    let target = format!("127.0.0.1:{}/aisb/user:v1", reg.port);
    let out = as_user(&["build", "--push", &target]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let pulled = Proj::new();
    pulled.write("sandbox.kdl", &format!("rootfs from=\"{target}\"\n"));
    let out = Out::from(pulled.aisb().args(["build", "--json"]).output().unwrap());
    assert_eq!(out.code, 0, "{}", out.stderr);
    // Root's store keeps a layer's owners as its tar says: find each path in the layers.
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let layers: Vec<PathBuf> = v["config"]["layers"]
        .as_array()
        .or(v["nodes"].as_array())
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str().or(n["entry"].as_str()).map(PathBuf::from))
        .collect();
    let owner = |rel: &str| {
        use std::os::unix::fs::MetadataExt;
        layers
            .iter()
            .find_map(|l| l.join(rel).symlink_metadata().ok())
            .map(|m| format!("{}:{}", m.uid(), m.gid()))
            .unwrap_or_else(|| panic!("{rel} in none of {layers:?}"))
    };
    assert_eq!(owner("opt/app"), "42:42");
    assert_eq!(owner("usr/local/share/made"), "0:0");
    assert_eq!(owner("etc/shadow"), "0:42");
    assert_eq!(owner("opt/u/mine"), format!("{uid}:{gid}"));

    // A failed step (after writing files of other ids) leaves nothing behind.
    p.write(
        "Dockerfile",
        &format!(
            "FROM oci:{}:1\nRUN mkdir /etc/x && touch /etc/x/y && chown -R 7:7 /etc/x && chmod 0 /etc/x && false\n",
            debian_layout().display()
        ),
    );
    // The project only: the store keeps the owners the build gave its files.
    support::chown_r(&p.proj(), uid, gid);
    let out = as_user(&["build"]);
    assert_ne!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("exited with 1"), "{}", out.stderr);
    let leftovers: Vec<_> = std::fs::read_dir(p.store())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert_eq!(
        leftovers,
        Vec::<String>::new(),
        "a failed step's layer stayed"
    );
    let work = p.store().join(".work");
    assert!(
        std::fs::read_dir(&work).map_or(true, |mut d| d.next().is_none()),
        "a failed step's scratch stayed: {:?}",
        not_owned_by(&work, uid, gid)
    );
    let subordinate = not_owned_by(p.store().as_path(), uid, gid);
    assert!(
        !subordinate.is_empty(),
        "the image's files keep their owners in the store: {:?}",
        std::fs::read_dir(p.store())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect::<Vec<_>>()
    );

    // Nothing pins the image any more: gc removes all of it, subordinate-owned files included.
    for state in walk_states(&p.cache()) {
        let _ = std::fs::remove_file(state.join("store-refs.json"));
    }
    let _ = std::fs::remove_file(p.proj().join("sandbox.lock"));
    let out = as_user(&["store", "gc", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        not_owned_by(p.cache().as_path(), uid, gid),
        Vec::<String>::new(),
        "gc left files of the subordinate ids"
    );
}

#[test]
fn build_steps_reach_the_default_groups_or_their_own_network_through_the_proxy_and_nothing_else() {
    if !root_or_skip("images") {
        return;
    }
    // A package registry stand-in on loopback; the step's proxy is pinned there by name.
    let served = tempfile::tempdir().unwrap();
    std::fs::write(served.path().join("pkg"), "package-bytes\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("/usr/bin/python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port.to_string(),
        ])
        .current_dir(served.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = Proj::new();
    p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    // Plain HTTP through the relay on 127.0.0.1:3128 with bash alone (a minimal Debian has no
    // curl): a package registry and Debian's archive (the default groups), then a host
    // outside them.
    let get = |host: &str| {
        format!("exec 3<>/dev/tcp/127.0.0.1/3128; printf 'GET http://{host}/pkg HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n' >&3; cat <&3; exec 3<&-")
    };
    let step = |hosts: &[&str], nonce: &str| {
        let gets: Vec<String> = hosts
            .iter()
            .map(|h| format!("echo {h}: $(bash -c \"{}\" | tail -n 1)", get(h)))
            .collect();
        format!(
            "FROM oci:{}:1\nRUN echo {nonce}; {}\n",
            debian_layout().display(),
            gets.join("; ")
        )
    };
    let pins = ["registry.npmjs.org", "deb.debian.org", "example.com"]
        .map(|h| format!("{h}=127.0.0.1:{port}"))
        .join(",");
    let build = |extra: &[&str]| {
        let o = p
            .aisb_asking()
            .arg("build")
            .args(extra)
            .env("AISB_PROXY_PIN", &pins)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    p.write(
        "Dockerfile",
        &step(
            &["registry.npmjs.org", "deb.debian.org", "example.com"],
            "default",
        ),
    );
    // The shared base is a layout outside the project: approved once, as a user would.
    let trusted = p.aisb_asking().arg("trust").output().unwrap();
    assert!(trusted.status.success(), "{trusted:?}");
    let (ok, err) = build(&[]);
    assert!(ok, "{err}");
    assert!(
        err.contains("registry.npmjs.org: package-bytes")
            && err.contains("deb.debian.org: package-bytes"),
        "the default groups were not reached: {err}"
    );
    assert!(
        !err.contains("example.com: package-bytes") && err.contains("example.com: "),
        "a host outside the groups was reached: {err}"
    );

    // `rootfs … { network … }`: exactly what it says, and a widening is asked about first.
    p.write(
        "sandbox.kdl",
        "rootfs dockerfile=\"Dockerfile\" {\n    network { allow \"example.com\"; }\n}\n",
    );
    p.write(
        "Dockerfile",
        &step(&["registry.npmjs.org", "example.com"], "custom"),
    );
    let (ok, err) = build(&[]);
    assert!(!ok, "an untrusted widening was built: {err}");
    assert!(
        err.contains("image build steps reach 1 domain rule(s)") && err.contains("example.com"),
        "{err}"
    );
    assert!(
        !err.contains("package-bytes"),
        "a step ran before trust: {err}"
    );
    let (ok, err) = build(&["--trust"]);
    assert!(ok, "{err}");
    assert!(err.contains("example.com: package-bytes"), "{err}");
    assert!(
        !err.contains("registry.npmjs.org: package-bytes"),
        "the default groups stayed allowed: {err}"
    );
    let _ = server.kill();
    let _ = server.wait();
    let audit = Out::from(p.aisb().args(["audit", "--json"]).output().unwrap());
    assert!(
        audit.stdout.contains("registry.npmjs.org")
            && audit.stdout.contains("deb.debian.org")
            && audit.stdout.contains("example.com"),
        "{}",
        audit.stdout
    );
}

#[test]
fn an_image_without_glibc_is_refused_with_a_reason() {
    // busybox alone (static): aisb's init could not start in it.
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    let layout = t.path().join("tiny.oci");
    layout_of(&root, &layout, "1");
    let p = Proj::new();
    p.write(
        "Dockerfile",
        &format!("FROM oci:{}:1\nRUN true\n", layout.display()),
    );
    p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
    let (ok, _, err) = p.build(&[]);
    assert!(!ok);
    assert!(
        err.contains("Dockerfile:2") && err.contains("glibc"),
        "{err}"
    );
    p.write(
        "sandbox.kdl",
        &format!("rootfs from=\"oci:{}:1\"\n", layout.display()),
    );
    let out = p.run("bwrap", "true");
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("glibc-based image"), "{}", out.stderr);
}

/// COPY with several sources: an earlier one puts a link where a later one's directory goes
/// (`a/x -> <host dir>`, then `b/x/evil`). The build refuses it; nothing is written or
/// chmodded outside the layer (it wrote `evil` into the host directory and made it 0755, as
/// root, before). ADD of an archive into such a path likewise.
#[test]
fn copy_never_writes_through_a_link_an_earlier_source_made() {
    if !root_or_skip("images") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    for add in [false, true] {
        let p = Proj::new();
        let host = p.dir.path().join("host-dir");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir_all(p.proj().join("a")).unwrap();
        std::os::unix::fs::symlink(&host, p.proj().join("a/x")).unwrap();
        let second = if add {
            let src = p.dir.path().join("tar-src");
            std::fs::create_dir_all(&src).unwrap();
            std::fs::write(src.join("evil"), "evil").unwrap();
            let ok = Command::new("tar")
                .arg("-cf")
                .arg(p.proj().join("evil.tar"))
                .arg("-C")
                .arg(&src)
                .arg("evil")
                .status()
                .unwrap()
                .success();
            assert!(ok, "tar");
            "ADD evil.tar /d/x/\n"
        } else {
            p.write("b/x/evil", "evil");
            "COPY a b /d/\n"
        };
        let first = if add { "COPY a /d/\n" } else { "" };
        p.write("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n");
        p.write("Dockerfile", &format!("FROM scratch\n{first}{second}"));
        let (ok, _, err) = p.build(&[]);
        assert!(
            std::fs::read_dir(&host).unwrap().next().is_none(),
            "[add={add}] the build wrote into the host directory: {err}"
        );
        assert_eq!(
            std::fs::metadata(&host).unwrap().permissions().mode() & 0o7777,
            0o700,
            "[add={add}] the build changed the host directory's mode"
        );
        if add {
            // The archive's destination resolves through the lower layer's link inside the
            // image (as Docker does): it is built, and lands inside the layer.
            assert!(ok, "[add] {err}");
        } else {
            assert!(!ok, "the build did not refuse the link");
            assert!(err.contains("symbolic link"), "{err}");
        }
    }
}

/// `aisb build --push`: the built image (base layer, a RUN that writes and one that deletes a
/// base file, a COPY) goes to a loopback registry; skopeo reads the same digest back, a second
/// push sends no layer again, the lock file records the push, and aisb itself pulls the pushed
/// image by digest and runs it: the files, the deletion and the config survived the trip.
#[test]
fn a_pushed_image_comes_back_by_digest_with_its_files_and_deletions() {
    if !root_or_skip("images") {
        return;
    }
    let base = debian_layout();
    let reg = Registry::start();
    reg.push(&base, "1");
    let p = Proj::new();
    p.write(
        "sandbox.kdl",
        &format!("image \"dev\" {{\n    from \"127.0.0.1:{}/base:1\"\n    env \"A\" \"from-kdl\"\n    run \"echo built > /etc/built && rm /etc/debian_version && mkdir -p /opt/d && touch /opt/d/x\"\n    copy \"f\" \"/opt/f\" chmod=\"0640\"\n}}\nrootfs image=\"dev\"\n", reg.port),
    );
    p.write("f", "copied\n");
    let target = format!("127.0.0.1:{}/aisb/dev:v1", reg.port);
    let o = p
        .aisb()
        .args(["build", "--json", "--push", &target])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let digest = v["pushed"]["digest"]
        .as_str()
        .expect("a pushed digest")
        .to_string();
    assert!(err.contains(&format!("pushed {target}@{digest}")), "{err}");
    // The registry serves that manifest (skopeo: another client's reading of it).
    let inspect = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", "--raw"])
        .arg(format!("docker://{target}"))
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let raw_digest = format!("sha256:{}", {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&inspect.stdout))
    });
    assert_eq!(raw_digest, digest);
    let layout = tempfile::tempdir().unwrap();
    let st = Command::new("skopeo")
        .args(["copy", "-q", "--src-tls-verify=false"])
        .arg(format!("docker://{target}"))
        .arg(format!("oci:{}:x", layout.path().join("l").display()))
        .status()
        .unwrap();
    assert!(st.success(), "skopeo could not pull the pushed image back");
    // The lock records it.
    let lock: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.proj().join("sandbox.lock")).unwrap()).unwrap();
    assert_eq!(
        lock["images"]["dev"]["pushed"][&target],
        serde_json::json!(digest)
    );
    // Pushed again: the same bytes, nothing but the manifest sent.
    let o = p
        .aisb()
        .args(["build", "--push", &target])
        .output()
        .unwrap();
    let err2 = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err2}");
    assert!(
        err2.contains(&format!("pushed {target}@{digest}")),
        "{err2}"
    );
    assert!(err2.contains(" 0 KiB sent"), "{err2}");
    // aisb runs it by digest, from the registry, in a new project.
    let q = Proj::new();
    q.write(
        "sandbox.kdl",
        &format!("rootfs from=\"127.0.0.1:{}/aisb/dev@{digest}\"\n", reg.port),
    );
    let out = q.run(
        "bwrap",
        "cat /etc/built /opt/f; stat -c %a /opt/f; test -e /etc/debian_version && echo STILL-THERE; test -e /opt/d/x && echo dir-ok; test -e /etc/apt && echo base-ok",
    );
    assert_eq!(
        out.stdout, "built\ncopied\n640\ndir-ok\nbase-ok\n",
        "{}",
        out.stderr
    );
    // A digest is not a push target.
    let o = p
        .aisb()
        .args([
            "build",
            "--push",
            &format!("127.0.0.1:{}/aisb/dev@{digest}", reg.port),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("names a tag, not a digest"));
}
