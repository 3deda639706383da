//! `aisb lsp`: protocol-level tests (a JSON-RPC client over the server's stdio) and a real
//! client, Neovim's built-in LSP client run headless, opening a broken sandbox.kdl and
//! reading the diagnostics it received, a completion and a hover.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Every wait is bounded.
const WAIT: Duration = Duration::from_secs(60);

struct Client {
    child: Child,
    stdin: ChildStdin,
    rx: Receiver<Value>,
    next: i64,
    /// Notifications read while waiting for a response.
    notes: Vec<Value>,
}

impl Client {
    fn start(dir: &Path) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_aisb"))
            .arg("lsp")
            .current_dir(dir)
            .env("XDG_CACHE_HOME", dir.join(".cache-test"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || loop {
            let mut len = None;
            loop {
                let mut line = String::new();
                if out.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some(v) = line.strip_prefix("Content-Length: ") {
                    len = v.parse::<usize>().ok();
                }
            }
            let mut body = vec![0; len.expect("Content-Length")];
            if out.read_exact(&mut body).is_err() {
                return;
            }
            if tx.send(serde_json::from_slice(&body).unwrap()).is_err() {
                return;
            }
        });
        let mut c = Client {
            child,
            stdin,
            rx,
            next: 1,
            notes: Vec::new(),
        };
        let r = c.request("initialize", json!({"capabilities": {}, "rootUri": null}));
        assert!(r["capabilities"]["completionProvider"].is_object(), "{r}");
        c.notify("initialized", json!({}));
        c
    }

    fn send(&mut self, v: Value) {
        let body = v.to_string();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        self.stdin.flush().unwrap();
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn recv(&mut self, deadline: Instant) -> Value {
        match self
            .rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(v) => v,
            Err(RecvTimeoutError::Timeout) => panic!("no message from aisb lsp in {WAIT:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("aisb lsp closed its output"),
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + WAIT;
        loop {
            let m = self.recv(deadline);
            if m["id"] == id {
                assert!(m.get("error").is_none(), "{m}");
                return m["result"].clone();
            }
            self.notes.push(m);
        }
    }

    /// The next diagnostics published for `uri` (with `version` when given).
    fn diagnostics(&mut self, uri: &str, version: Option<i64>) -> Vec<Value> {
        let matches = |m: &Value| {
            m["method"] == "textDocument/publishDiagnostics"
                && m["params"]["uri"] == uri
                && version.is_none_or(|v| m["params"]["version"] == v)
        };
        if let Some(i) = self.notes.iter().position(matches) {
            let m = self.notes.remove(i);
            return m["params"]["diagnostics"].as_array().unwrap().clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let m = self.recv(deadline);
            if matches(&m) {
                return m["params"]["diagnostics"].as_array().unwrap().clone();
            }
        }
    }

    fn open(&mut self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "kdl", "version": 1, "text": text}}),
        );
    }

    fn change(&mut self, uri: &str, version: i64, text: &str) {
        self.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]}),
        );
    }

    fn at(&mut self, method: &str, uri: &str, line: u32, character: u32) -> Value {
        self.request(
            method,
            json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}),
        )
    }

    fn stop(mut self) {
        self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                assert!(s.success(), "aisb lsp exited with {s}");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        panic!("aisb lsp did not exit after `exit`");
    }
}

fn project() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("proj");
    std::fs::create_dir_all(&dir).unwrap();
    support::git_in(&dir, &["init", "-q"]);
    let dir = dir.canonicalize().unwrap();
    (t, dir)
}

fn uri(p: &Path) -> String {
    format!("file://{}", p.display())
}

fn labels(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i["label"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn diagnostics_follow_the_text_with_spans_and_help() {
    let (_t, dir) = project();
    let file = dir.join("sandbox.kdl");
    let text = "netwrok \"none\"\nlimits {\n    pids \"many\"\n}\n";
    std::fs::write(&file, text).unwrap();
    let u = uri(&file);
    let mut c = Client::start(&dir);
    c.open(&u, text);
    let d = c.diagnostics(&u, Some(1));
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0]["range"]["start"], json!({"line": 0, "character": 0}));
    assert_eq!(d[0]["range"]["end"], json!({"line": 0, "character": 7}));
    let m = d[0]["message"].as_str().unwrap();
    assert!(
        m.contains("unknown node `netwrok`") && m.contains("help: did you mean `network`?"),
        "{m}"
    );
    assert_eq!(d[1]["range"]["start"]["line"], 2);
    // As the user types: decoding is fine now, the evaluator finds an unknown parent profile.
    let text = "network \"none\"\nprofile \"p\" extends=\"nope\" {\n}\n";
    c.change(&u, 2, text);
    let d = c.diagnostics(&u, Some(2));
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0]["message"].as_str().unwrap().contains("nope"), "{d:?}");
    assert_eq!(d[0]["range"]["start"]["line"], 1);
    // Fixed: an empty list clears the editor's problems.
    c.change(&u, 3, "network \"none\"\n");
    assert!(c.diagnostics(&u, Some(3)).is_empty());
    c.stop();
}

#[test]
fn an_import_cycle_is_reported_in_the_file_that_has_it() {
    let (_t, dir) = project();
    std::fs::write(dir.join("a.kdl"), "import \"sandbox.kdl\"\n").unwrap();
    let file = dir.join("sandbox.kdl");
    let text = "import \"a.kdl\"\n";
    std::fs::write(&file, text).unwrap();
    let mut c = Client::start(&dir);
    c.open(&uri(&file), text);
    let mut all = c.diagnostics(&uri(&file), Some(1));
    if all.is_empty() {
        all = c.diagnostics(&uri(&dir.join("a.kdl")), None);
    }
    assert!(
        all.iter()
            .any(|d| d["message"].as_str().unwrap().contains("cycle")),
        "{all:?}"
    );
    c.stop();
}

#[test]
fn completion_offers_what_the_decoder_accepts_where_the_cursor_is() {
    let (_t, dir) = project();
    let file = dir.join("sandbox.kdl");
    let text = "profile \"x\" {\n    network {\n        \n    }\n}\nmount \"/a\" access=\nho\n";
    std::fs::write(&file, text).unwrap();
    let u = uri(&file);
    let mut c = Client::start(&dir);
    c.open(&u, text);
    let inside = labels(&c.at("textDocument/completion", &u, 2, 8));
    assert_eq!(inside, ["allow", "deny", "group", "localhost-port"]);
    let values = labels(&c.at("textDocument/completion", &u, 5, 18));
    assert_eq!(values, ["\"ro\"", "\"rw\"", "\"overlay\""]);
    let top = labels(&c.at("textDocument/completion", &u, 6, 2));
    assert_eq!(top, ["home"]);
    let in_profile = labels(&c.at("textDocument/completion", &u, 1, 4));
    assert!(in_profile.contains(&"mount".to_string()), "{in_profile:?}");
    assert!(
        !in_profile.contains(&"import".to_string()),
        "{in_profile:?}"
    );
    // Each offered top-level node decodes (no `unknown node`): one table for both.
    for name in labels(&c.at("textDocument/completion", &u, 0, 0)) {
        let probe = dir.join("probe.kdl");
        std::fs::write(&probe, format!("{name}\n")).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_aisb"))
            .args(["-f"])
            .arg(&probe)
            .args(["check", "--format", "short"])
            .current_dir(&dir)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!out.contains("unknown node"), "{name}: {out}");
    }
    c.stop();
}

#[test]
fn hover_definition_and_formatting() {
    let (_t, dir) = project();
    std::fs::write(
        dir.join("extra.kdl"),
        "domains \"corp\" \"git.corp.example\"\n",
    )
    .unwrap();
    let file = dir.join("sandbox.kdl");
    let text = "import \"extra.kdl\"\nprofile \"base\" {\n}\nprofile \"review\" extends=\"base\" {\n    network {\n        group \"corp\"\n    }\n}\ntask \"t\" {\n    run \"true\"\n    profile \"review\"\n}\nmount   \"/a\"    access=\"ro\"\n";
    std::fs::write(&file, text).unwrap();
    let u = uri(&file);
    let mut c = Client::start(&dir);
    c.open(&u, text);
    let h = c.at("textDocument/hover", &u, 12, 2);
    let doc = h["contents"]["value"].as_str().unwrap();
    assert!(doc.contains("Extra host paths"), "{doc}");
    assert!(doc.contains("```kdl\nmount "), "{doc}");
    // extends= -> the profile.
    let d = c.at("textDocument/definition", &u, 3, 27);
    assert_eq!(d["uri"], u);
    assert_eq!(d["range"]["start"], json!({"line": 1, "character": 9}));
    // A task's profile -> the profile.
    let d = c.at("textDocument/definition", &u, 10, 15);
    assert_eq!(d["range"]["start"], json!({"line": 3, "character": 9}));
    // group -> the domains node, in the imported file.
    let d = c.at("textDocument/definition", &u, 5, 16);
    assert_eq!(d["uri"], uri(&dir.join("extra.kdl")));
    assert_eq!(d["range"]["start"], json!({"line": 0, "character": 9}));
    // import -> the file.
    let d = c.at("textDocument/definition", &u, 0, 10);
    assert_eq!(d["uri"], uri(&dir.join("extra.kdl")));
    // Formatting: the same document, tidied.
    let edits = c.request(
        "textDocument/formatting",
        json!({"textDocument": {"uri": u}, "options": {"tabSize": 4, "insertSpaces": true}}),
    );
    let new = edits[0]["newText"].as_str().unwrap();
    assert!(new.contains("mount \"/a\" access=\"ro\""), "{new}");
    assert_eq!(
        kdl::KdlDocument::parse_v2(new).unwrap().nodes().len(),
        kdl::KdlDocument::parse_v2(text).unwrap().nodes().len()
    );
    c.stop();
}

/// Neovim 0.7's built-in client (Debian's `neovim`), headless: it starts `aisb lsp`, opens a
/// broken sandbox.kdl, waits for the diagnostics, asks for a completion and a hover, and
/// writes what it got as JSON.
#[test]
fn neovim_shows_diagnostics_completion_and_hover() {
    if !support::tool_or_skip("nvim", "the Neovim LSP test") {
        return;
    }
    let (t, dir) = project();
    let file = dir.join("sandbox.kdl");
    std::fs::write(&file, "netwrok \"none\"\nnetwork {\n    \n}\n").unwrap();
    let out = t.path().join("nvim-result.json");
    let lua = t.path().join("test.lua");
    std::fs::write(
        &lua,
        format!(
            r#"
local out = {{}}
local client = vim.lsp.start_client({{
  name = "aisb",
  cmd = {{ "{aisb}", "lsp" }},
  root_dir = "{dir}",
  cmd_env = {{ XDG_CACHE_HOME = "{dir}/.cache-test" }},
}})
vim.cmd("edit {file}")
local buf = vim.api.nvim_get_current_buf()
vim.lsp.buf_attach_client(buf, client)
out.got_diagnostics = vim.wait(30000, function() return #vim.diagnostic.get(buf) > 0 end, 50)
out.diagnostics = {{}}
for _, d in ipairs(vim.diagnostic.get(buf)) do
  table.insert(out.diagnostics, {{ lnum = d.lnum, col = d.col, message = d.message }})
end
local function at(line, col)
  return {{ textDocument = {{ uri = vim.uri_from_bufnr(buf) }}, position = {{ line = line, character = col }} }}
end
local c = vim.lsp.buf_request_sync(buf, "textDocument/completion", at(2, 4), 30000)
out.completion = {{}}
for _, r in pairs(c or {{}}) do
  for _, item in ipairs(r.result or {{}}) do table.insert(out.completion, item.label) end
end
local h = vim.lsp.buf_request_sync(buf, "textDocument/hover", at(1, 2), 30000)
for _, r in pairs(h or {{}}) do
  if r.result then out.hover = r.result.contents.value end
end
local f = io.open("{out}", "w")
f:write(vim.fn.json_encode(out))
f:close()
vim.lsp.stop_client(client)
vim.cmd("qall!")
"#,
            aisb = env!("CARGO_BIN_EXE_aisb"),
            dir = dir.display(),
            file = file.display(),
            out = out.display(),
        ),
    )
    .unwrap();
    let mut child = Command::new("nvim")
        .args(["--headless", "--clean", "-n", "-c"])
        .arg(format!("luafile {}", lua.display()))
        .current_dir(&dir)
        .env("HOME", t.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("nvim did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    let text = std::fs::read_to_string(&out)
        .unwrap_or_else(|_| panic!("nvim wrote no result ({status}): {err}"));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["got_diagnostics"], true, "{v}");
    let d = &v["diagnostics"][0];
    assert_eq!(d["lnum"], 0, "{v}");
    assert_eq!(d["col"], 0, "{v}");
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .contains("did you mean `network`?"),
        "{v}"
    );
    assert_eq!(
        v["completion"],
        json!(["allow", "deny", "group", "localhost-port"]),
        "{v}"
    );
    assert!(v["hover"].as_str().unwrap_or("").contains("network"), "{v}");
}

/// Typing faster than the evaluation: the server diagnoses the newest text, and never
/// publishes an older version's diagnostics after a newer one's.
#[test]
fn a_burst_of_edits_ends_on_the_newest_text() {
    let (_t, dir) = project();
    let file = dir.join("sandbox.kdl");
    std::fs::write(&file, "network \"none\"\n").unwrap();
    let u = uri(&file);
    let mut c = Client::start(&dir);
    c.open(&u, "network \"none\"\n");
    for v in 2..=30 {
        // Odd versions are broken, even ones valid; the last (30) is valid.
        let text = if v % 2 == 1 {
            format!("netwrk{v} \"none\"\n")
        } else {
            format!("network \"none\"\ndomains \"g{v}\" \"a.example\"\n")
        };
        c.change(&u, v, &text);
    }
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let m = c.recv(deadline);
        if m["method"] != "textDocument/publishDiagnostics" || m["params"]["uri"] != u {
            continue;
        }
        let v = m["params"]["version"].as_i64().unwrap();
        seen.push(v);
        if v == 30 {
            assert!(
                m["params"]["diagnostics"].as_array().unwrap().is_empty(),
                "{m}"
            );
            break;
        }
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "out of order: {seen:?}"
    );
    c.stop();
}
