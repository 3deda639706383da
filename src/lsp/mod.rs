//! `aisb lsp`: a language server for sandbox.kdl over stdio (`lsp-server`, the transport
//! rust-analyzer uses, and `lsp-types`).
//!
//! Diagnostics come from the same loader, decoder and evaluator as `aisb check` (every
//! profile evaluated, every error with its span and help), computed on a worker thread so
//! that a slow evaluation (the first project scan) never blocks completion or hover: the
//! worker always takes the newest text of a document, and a result for a text that has
//! changed since is dropped. Completion comes from the decoder's own tables
//! (`config::schema`), hover from `sandbox.kdl.example`'s comments, go to definition from the
//! names `import`, `extends=`, `group`, `profile`, `rootfs image=` and tasks refer to, and
//! formatting from kdl's own formatter.

pub mod text;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use lsp_server::{Connection, Message, Notification, Request, Response};
use lsp_types::{
    CompletionItem, CompletionItemKind, CompletionOptions, CompletionResponse, Diagnostic,
    DiagnosticSeverity, GotoDefinitionResponse, Hover, HoverContents, HoverProviderCapability,
    Location, MarkupContent, MarkupKind, OneOf, Position, PublishDiagnosticsParams, Range,
    ServerCapabilities, TextDocumentSyncCapability, TextDocumentSyncKind, TextEdit, Uri,
};

use crate::config::schema;
use crate::eval::{self, Host, Request as EvalRequest, Root};

/// The example every node is documented in.
const EXAMPLE: &str = include_str!("../../sandbox.kdl.example");

/// `file://` URI of an absolute path (percent-encoded).
pub fn uri_of(path: &Path) -> Option<Uri> {
    let mut s = String::from("file://");
    for b in path.as_os_str().as_encoded_bytes() {
        match *b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                s.push(*b as char)
            }
            b => s.push_str(&format!("%{b:02X}")),
        }
    }
    s.parse().ok()
}

/// The path of a `file://` URI.
pub fn path_of(uri: &Uri) -> Option<PathBuf> {
    let rest = uri.as_str().strip_prefix("file://")?;
    let mut bytes = Vec::with_capacity(rest.len());
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            bytes.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(bytes).ok()?;
    Some(PathBuf::from(s))
}

/// The newest text of each open document, for the diagnostics worker.
#[derive(Default)]
struct Pending {
    /// uri -> (version, text) not yet diagnosed.
    queue: HashMap<String, (i32, Uri, String)>,
    shutdown: bool,
}

struct Worker {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// The newest version of each document: a result for an older one is stale.
    latest: Mutex<HashMap<String, i32>>,
}

/// Every diagnostic of a text, grouped by the document it is in (the text's own URI first,
/// possibly with none: that clears the editor's list).
pub fn diagnose(host: &Host, uri: &Uri, text: &str) -> Vec<(Uri, Vec<Diagnostic>)> {
    let Some(path) = path_of(uri) else {
        return vec![(uri.clone(), Vec::new())];
    };
    let mut errors = crate::config::Errors::default();
    let root = Root::Text {
        path: path.clone(),
        text: text.to_string(),
    };
    let cache = host.cache_home().join("aisb").join("kdl");
    let loaded = match eval::load_cached(root, &mut errors, Some(cache)) {
        Ok(mut l) => {
            crate::graph::realise::memos(&std::mem::take(&mut l.memos));
            l
        }
        Err(e) => {
            return vec![(
                uri.clone(),
                vec![whole_file(format!("cannot load: {e}"), None)],
            )]
        }
    };
    let mut list = errors.list;
    let mut other = Vec::new();
    if list.is_empty() {
        let profiles = eval::profile_names(&loaded);
        // Every profile at once: each evaluation mostly waits on its own reads of the
        // cached scan, and the slowest one sets when the editor sees its problems.
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = std::iter::once(None)
                .chain(profiles.into_iter().map(Some))
                .map(|p| {
                    let loaded = &loaded;
                    s.spawn(move || {
                        let req = EvalRequest {
                            profile: p,
                            use_cache: true,
                            ..EvalRequest::default()
                        };
                        eval::evaluate(loaded, host, &req).map(|mut plan| {
                            crate::graph::realise::memos(&std::mem::take(&mut plan.memos));
                            plan
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect()
        });
        for r in results {
            let Ok(r) = r else {
                other.push(whole_file(
                    "the evaluation failed (a bug in aisb)".into(),
                    None,
                ));
                continue;
            };
            match r {
                Ok(_) => {}
                Err(eval::EvalError::Config(c)) => {
                    for e in c.errors {
                        if !list
                            .iter()
                            .any(|x| x.file == e.file && x.span == e.span && x.message == e.message)
                        {
                            list.push(e);
                        }
                    }
                }
                Err(e) => {
                    let help = miette::Diagnostic::help(&e).map(|h| h.to_string());
                    other.push(whole_file(e.to_string(), help));
                    break;
                }
            }
        }
    }
    let mut by_file: Vec<(Uri, Vec<Diagnostic>)> = vec![(uri.clone(), other)];
    for e in list {
        let Some(src) = loaded.sources.get(e.file) else {
            continue;
        };
        let Some(file_uri) = src.path.as_ref().and_then(|p| {
            if *p == path {
                Some(uri.clone())
            } else {
                uri_of(p)
            }
        }) else {
            continue; // an embedded preset: nothing the user can open
        };
        let range = Range::new(
            text::position(&src.text, e.span.offset()),
            text::position(&src.text, e.span.offset() + e.span.len()),
        );
        let mut message = e.message.clone();
        if !e.label.is_empty() && e.label != "here" {
            message = format!("{message} ({})", e.label);
        }
        if let Some(h) = &e.help {
            message.push_str("\nhelp: ");
            message.push_str(h);
        }
        let d = Diagnostic {
            range,
            severity: Some(DiagnosticSeverity::ERROR),
            source: Some("aisb".into()),
            message,
            ..Diagnostic::default()
        };
        match by_file.iter_mut().find(|(u, _)| *u == file_uri) {
            Some((_, v)) => v.push(d),
            None => by_file.push((file_uri, vec![d])),
        }
    }
    by_file
}

fn whole_file(message: String, help: Option<String>) -> Diagnostic {
    let message = match help {
        Some(h) => format!("{message}\nhelp: {h}"),
        None => message,
    };
    Diagnostic {
        range: Range::new(Position::new(0, 0), Position::new(0, 0)),
        severity: Some(DiagnosticSeverity::ERROR),
        source: Some("aisb".into()),
        message,
        ..Diagnostic::default()
    }
}

/// Completion items valid at `pos` in `text`.
pub fn complete(text: &str, pos: Position) -> Vec<CompletionItem> {
    let at = text::offset(text, pos);
    let c = text::cursor(text, at);
    let path: Vec<&str> = c.path.iter().map(String::as_str).collect();
    let docs = text::docs(EXAMPLE, &all_names());
    let item = |label: String, kind, insert: Option<String>, doc: Option<&String>| CompletionItem {
        label,
        kind: Some(kind),
        insert_text: insert,
        documentation: doc.map(|d| {
            lsp_types::Documentation::MarkupContent(MarkupContent {
                kind: MarkupKind::Markdown,
                value: d.clone(),
            })
        }),
        ..CompletionItem::default()
    };
    let mut out = Vec::new();
    match &c.node {
        None => {
            for n in schema::children_at(&path) {
                out.push(item(
                    n.to_string(),
                    CompletionItemKind::KEYWORD,
                    None,
                    docs.get(n),
                ));
            }
        }
        Some(node) => {
            let mut full = path.clone();
            full.push(node);
            let Some(shape) = schema::shape(&full) else {
                return out;
            };
            match &c.prop {
                Some(p) => {
                    if let Some((_, vals)) = shape.prop_values.iter().find(|(k, _)| k == p) {
                        for v in *vals {
                            let text = if v.starts_with('#') {
                                v.to_string()
                            } else {
                                format!("\"{v}\"")
                            };
                            out.push(item(
                                text.clone(),
                                CompletionItemKind::VALUE,
                                Some(text),
                                None,
                            ));
                        }
                    }
                }
                None => {
                    for p in shape.props {
                        out.push(item(
                            format!("{p}="),
                            CompletionItemKind::PROPERTY,
                            Some(format!("{p}=")),
                            None,
                        ));
                    }
                    for v in shape.values {
                        let text = if v.starts_with('#') {
                            v.to_string()
                        } else {
                            format!("\"{v}\"")
                        };
                        out.push(item(
                            text.clone(),
                            CompletionItemKind::VALUE,
                            Some(text),
                            None,
                        ));
                    }
                }
            }
        }
    }
    let typed = c.word.trim_start_matches('"');
    out.retain(|i| i.label.trim_start_matches('"').starts_with(typed));
    out
}

fn all_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = schema::TOP_NODES
        .iter()
        .chain(schema::SETTINGS_NODES)
        .chain(schema::TASK_CHILDREN)
        .chain(schema::SECRETS_CHILDREN)
        .chain(schema::ENV_CHILDREN)
        .chain(schema::NETWORK_CHILDREN)
        .chain(schema::PROCESS_CHILDREN)
        .chain(schema::LIMITS_CHILDREN)
        .chain(schema::IMAGE_CHILDREN)
        .copied()
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The documentation of the node under `pos`.
pub fn hover(text: &str, pos: Position) -> Option<Hover> {
    let at = text::offset(text, pos);
    let (word, range) = text::word_at(text, at)?;
    let docs = text::docs(EXAMPLE, &all_names());
    let doc = docs.get(&word)?;
    Some(Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value: doc.clone(),
        }),
        range: Some(Range::new(
            text::position(text, range.start),
            text::position(text, range.end),
        )),
    })
}

/// Where the name under `pos` is defined: an imported file, a profile (`extends=`,
/// `profile`, `default-profile`), a domain group (`group`), an image (`rootfs image=`), a
/// task. Searched in this text first, then in the files it imports.
pub fn definition(text: &str, path: &Path, pos: Position) -> Option<Location> {
    let at = text::offset(text, pos);
    let (word, _) = text::word_at(text, at)?;
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("").trim_start();
    let dir = path.parent().unwrap_or(Path::new("/"));
    if line.starts_with("import") {
        if word.starts_with("preset:") {
            return None;
        }
        let target = dir.join(&word);
        let uri = uri_of(&target.canonicalize().ok()?)?;
        return Some(Location::new(uri, Range::default()));
    }
    let kinds: &[&str] = if line.starts_with("group") {
        &["domains"]
    } else if line.contains(&format!("image=\"{word}\"")) {
        &["image"]
    } else if line.contains(&format!("extends=\"{word}\""))
        || line.starts_with("profile")
        || line.starts_with("default-profile")
    {
        &["profile"]
    } else {
        &text::DEFINERS
    };
    if let Some(r) = text::definition(text, kinds, &word) {
        let uri = uri_of(path)?;
        return Some(Location::new(
            uri,
            Range::new(text::position(text, r.start), text::position(text, r.end)),
        ));
    }
    // In an imported file.
    let mut errors = crate::config::Errors::default();
    let loaded = eval::load(
        Root::Text {
            path: path.to_path_buf(),
            text: text.to_string(),
        },
        &mut errors,
    )
    .ok()?;
    for src in &loaded.sources {
        let Some(p) = &src.path else { continue };
        if p == path {
            continue;
        }
        if let Some(r) = text::definition(&src.text, kinds, &word) {
            return Some(Location::new(
                uri_of(p)?,
                Range::new(
                    text::position(&src.text, r.start),
                    text::position(&src.text, r.end),
                ),
            ));
        }
    }
    None
}

/// The whole text formatted by kdl's formatter; None when it does not parse (the
/// diagnostics say why).
pub fn format(text: &str) -> Option<Vec<TextEdit>> {
    let mut doc = kdl::KdlDocument::parse_v2(text).ok()?;
    // Indentation and spacing only: each value keeps how the user wrote it ("x" stays quoted,
    // 0x1F stays hex), one space before it.
    fn keep_values(doc: &mut kdl::KdlDocument) {
        for node in doc.nodes_mut() {
            for e in node.entries_mut() {
                e.keep_format();
                if let Some(f) = e.format_mut() {
                    f.leading = " ".into();
                }
            }
            if let Some(children) = node.children_mut() {
                keep_values(children);
            }
        }
    }
    keep_values(&mut doc);
    doc.autoformat();
    let formatted = doc.to_string();
    if formatted == text {
        return Some(Vec::new());
    }
    Some(vec![TextEdit::new(
        Range::new(Position::new(0, 0), text::position(text, text.len())),
        formatted,
    )])
}

fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec!["=".into(), "\"".into()]),
            ..CompletionOptions::default()
        }),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        definition_provider: Some(OneOf::Left(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        ..ServerCapabilities::default()
    }
}

/// Serve on stdin/stdout until the client says `exit`.
pub fn serve() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (conn, io) = Connection::stdio();
    let caps = serde_json::to_value(capabilities())?;
    conn.initialize(caps)?;
    let host = Host::current(crate::graph::system::system_paths)?;
    let worker = Arc::new(Worker {
        pending: Mutex::new(Pending::default()),
        wake: Condvar::new(),
        latest: Mutex::new(HashMap::new()),
    });
    let diag = {
        let worker = Arc::clone(&worker);
        let sender = conn.sender.clone();
        let host = host.clone();
        // The stack of aisb's main thread, where every other command parses: the KDL
        // parser's recovery from some malformed texts (an unclosed raw string after a stray
        // `*/`) goes deeper than a spawned thread's default 2 MiB in a debug build.
        std::thread::Builder::new()
            .name("aisb-lsp-diagnostics".into())
            .stack_size(crate::config::PARSE_STACK)
            .spawn(move || diagnostics_worker(&worker, &|m| sender.send(m).is_ok(), &host))?
    };
    let mut docs: HashMap<String, String> = HashMap::new();
    let enqueue = |uri: &Uri, version: i32, text: &str| {
        if let Ok(mut l) = worker.latest.lock() {
            l.insert(uri.as_str().to_string(), version);
        }
        if let Ok(mut p) = worker.pending.lock() {
            p.queue.insert(
                uri.as_str().to_string(),
                (version, uri.clone(), text.to_string()),
            );
        }
        worker.wake.notify_one();
    };
    for msg in &conn.receiver {
        match msg {
            Message::Request(req) => {
                if conn.handle_shutdown(&req)? {
                    break;
                }
                let resp = handle(&req, &docs);
                conn.sender.send(Message::Response(resp))?;
            }
            Message::Notification(n) => match n.method.as_str() {
                "textDocument/didOpen" => {
                    if let Ok(p) =
                        serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(n.params)
                    {
                        let d = p.text_document;
                        enqueue(&d.uri, d.version, &d.text);
                        docs.insert(d.uri.as_str().to_string(), d.text);
                    }
                }
                "textDocument/didChange" => {
                    if let Ok(p) =
                        serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(n.params)
                    {
                        // Full sync: the last change is the whole text.
                        if let Some(c) = p.content_changes.into_iter().last() {
                            enqueue(&p.text_document.uri, p.text_document.version, &c.text);
                            docs.insert(p.text_document.uri.as_str().to_string(), c.text);
                        }
                    }
                }
                "textDocument/didSave" => {}
                "textDocument/didClose" => {
                    if let Ok(p) =
                        serde_json::from_value::<lsp_types::DidCloseTextDocumentParams>(n.params)
                    {
                        docs.remove(p.text_document.uri.as_str());
                        let params =
                            PublishDiagnosticsParams::new(p.text_document.uri, vec![], None);
                        let _ = conn.sender.send(Message::Notification(Notification::new(
                            "textDocument/publishDiagnostics".into(),
                            params,
                        )));
                    }
                }
                _ => {}
            },
            Message::Response(_) => {}
        }
    }
    if let Ok(mut p) = worker.pending.lock() {
        p.shutdown = true;
    }
    worker.wake.notify_one();
    let _ = diag.join();
    drop(conn);
    io.join()?;
    Ok(())
}

/// `send` returns false once the client is gone.
fn diagnostics_worker(worker: &Worker, send: &dyn Fn(Message) -> bool, host: &Host) {
    loop {
        let job = {
            let Ok(mut p) = worker.pending.lock() else {
                return;
            };
            loop {
                if p.shutdown {
                    return;
                }
                if let Some(k) = p.queue.keys().next().cloned() {
                    break p.queue.remove(&k);
                }
                p = match worker.wake.wait(p) {
                    Ok(p) => p,
                    Err(_) => return,
                };
            }
        };
        let Some((version, uri, text)) = job else {
            continue;
        };
        let result = diagnose(host, &uri, &text);
        // A newer text arrived while this one was evaluated: its own result will follow.
        let stale = worker
            .latest
            .lock()
            .map(|l| l.get(uri.as_str()).is_some_and(|v| *v != version))
            .unwrap_or(false);
        if stale {
            continue;
        }
        for (u, diags) in result {
            let v = (u == uri).then_some(version);
            let params = PublishDiagnosticsParams::new(u, diags, v);
            if !send(Message::Notification(Notification::new(
                "textDocument/publishDiagnostics".into(),
                params,
            ))) {
                return;
            }
        }
    }
}

fn handle(req: &Request, docs: &HashMap<String, String>) -> Response {
    let id = req.id.clone();
    let doc_of = |v: &serde_json::Value| -> Option<(Uri, String)> {
        let uri: Uri = serde_json::from_value(v.get("textDocument")?.get("uri")?.clone()).ok()?;
        let text = docs.get(uri.as_str())?.clone();
        Some((uri, text))
    };
    let pos_of = |v: &serde_json::Value| -> Option<Position> {
        serde_json::from_value(v.get("position")?.clone()).ok()
    };
    let result = match req.method.as_str() {
        "textDocument/completion" => doc_of(&req.params)
            .zip(pos_of(&req.params))
            .map(|((_, t), p)| serde_json::to_value(CompletionResponse::Array(complete(&t, p)))),
        "textDocument/hover" => doc_of(&req.params)
            .zip(pos_of(&req.params))
            .map(|((_, t), p)| serde_json::to_value(hover(&t, p))),
        "textDocument/definition" => {
            doc_of(&req.params)
                .zip(pos_of(&req.params))
                .map(|((u, t), p)| {
                    let loc = path_of(&u).and_then(|path| definition(&t, &path, p));
                    serde_json::to_value(loc.map(GotoDefinitionResponse::Scalar))
                })
        }
        "textDocument/formatting" => {
            doc_of(&req.params).map(|(_, t)| serde_json::to_value(format(&t)))
        }
        _ => {
            return Response::new_err(
                id,
                lsp_server::ErrorCode::MethodNotFound as i32,
                format!("aisb lsp does not handle {}", req.method),
            )
        }
    };
    match result {
        Some(Ok(v)) => Response::new_ok(id, v),
        Some(Err(e)) => Response::new_err(
            id,
            lsp_server::ErrorCode::InternalError as i32,
            e.to_string(),
        ),
        // A document the client never opened: nothing to say about it.
        None => Response::new_ok(id, serde_json::Value::Null),
    }
}
