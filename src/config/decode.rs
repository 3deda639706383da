//! KDL -> raw model. One small function per node; every unknown node, property or value is an
//! error at its own span, and decoding goes on so that all errors are reported at once.

use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};
use miette::SourceSpan;

use super::diag::{suggest, Errors, Loc, SourceFile, Spanned};
use super::model::*;
use crate::proxy::domain::DomainRule;

/// Decoding state for one file: where we are and what went wrong so far.
pub struct Decoder<'a> {
    pub sources: &'a [SourceFile],
    pub file: usize,
    pub errors: &'a mut Errors,
}

const TOP_NODES: &[&str] = &[
    "import",
    "default-profile",
    "profile",
    "task",
    "domains",
    "image",
];
const SETTINGS_NODES: &[&str] = &[
    "project",
    "read-only",
    "mount",
    "tmpfs",
    "home",
    "xdg",
    "block",
    "allow",
    "secrets",
    "env",
    "network",
    "process",
    "limits",
    "backend",
    "rootfs",
];

/// Runtime backends `backend` accepts (the runtimes themselves live outside the config).
pub const BACKENDS: [&str; 2] = ["libcontainer", "bwrap"];

fn kind_of(v: &KdlValue) -> &'static str {
    match v {
        KdlValue::String(_) => "a string",
        KdlValue::Integer(_) => "an integer",
        KdlValue::Float(_) => "a number",
        KdlValue::Bool(_) => "a boolean",
        KdlValue::Null => "#null",
    }
}

impl Decoder<'_> {
    fn loc(&self, span: SourceSpan) -> Loc {
        Loc {
            file: self.file,
            span,
        }
    }

    fn err(
        &mut self,
        span: SourceSpan,
        message: impl Into<String>,
        label: &str,
        help: Option<String>,
    ) {
        let loc = self.loc(span);
        self.errors.push(self.sources, loc, message, label, help);
    }

    /// Decode a whole file.
    pub fn file(&mut self, doc: &KdlDocument) -> ConfigFile {
        let mut cfg = ConfigFile::default();
        for node in doc.nodes() {
            let name = node.name().value();
            match name {
                "import" => {
                    self.only_props(node, &[]);
                    self.no_children(node);
                    for e in self.args(node, 1, usize::MAX, "a file path or preset:NAME") {
                        if let Some(s) = self.string(e) {
                            cfg.imports.push(s);
                        }
                    }
                }
                "default-profile" => {
                    self.only_props(node, &[]);
                    self.no_children(node);
                    if let Some(e) = self.args(node, 1, 1, "a profile name").first() {
                        cfg.default_profile = self.string(e);
                    }
                }
                "profile" => {
                    if let Some(p) = self.profile(node) {
                        if cfg.profiles.iter().any(|p2| p2.name.value == p.name.value) {
                            self.err(
                                p.name.loc.span,
                                format!("profile `{}` is defined twice in this file", p.name.value),
                                "second definition",
                                Some("rename one of them, or merge their settings".into()),
                            );
                        } else {
                            cfg.profiles.push(p);
                        }
                    }
                }
                "task" => {
                    if let Some(t) = self.task(node) {
                        if cfg.tasks.iter().any(|t2| t2.name.value == t.name.value) {
                            self.err(
                                t.name.loc.span,
                                format!("task `{}` is defined twice in this file", t.name.value),
                                "second definition",
                                Some("task names must be unique".into()),
                            );
                        } else {
                            cfg.tasks.push(t);
                        }
                    }
                }
                "domains" => {
                    if let Some(g) = self.group(node) {
                        cfg.groups.push(g);
                    }
                }
                "image" => {
                    if let Some(i) = self.image(node) {
                        if cfg.images.iter().any(|i2| i2.name.value == i.name.value) {
                            self.err(
                                i.name.loc.span,
                                format!("image `{}` is defined twice in this file", i.name.value),
                                "second definition",
                                Some("image names must be unique".into()),
                            );
                        } else {
                            cfg.images.push(i);
                        }
                    }
                }
                _ => {
                    let all = TOP_NODES.iter().chain(SETTINGS_NODES);
                    self.setting(node, &mut cfg.base, all.copied());
                }
            }
        }
        cfg
    }

    /// A settings node (valid at the top level and inside `profile`). Unknown names are
    /// reported with the closest of `known` as a suggestion.
    fn setting<'k>(
        &mut self,
        node: &KdlNode,
        s: &mut Settings,
        known: impl Iterator<Item = &'k str>,
    ) {
        match node.name().value() {
            "project" => self.project(node, &mut s.project),
            "read-only" => {
                self.only_props(node, &[]);
                self.no_children(node);
                s.read_only = self.bool_arg_default_true(node);
            }
            "mount" => {
                if let Some(m) = self.mount(node) {
                    s.mounts.push(m);
                }
            }
            "tmpfs" => {
                if let Some(t) = self.tmpfs(node) {
                    s.tmpfs.push(t);
                }
            }
            "home" => {
                self.only_props(node, &[]);
                self.no_children(node);
                if let Some(e) = self.args(node, 1, 1, "one of: empty, ro, overlay").first() {
                    s.home = self.enumerated(e, &HomeMode::NAMES, HomeMode::parse);
                }
            }
            "xdg" => {
                self.only_props(node, &[]);
                self.no_children(node);
                if let Some(e) = self.args(node, 1, 1, "one of: home, sandbox").first() {
                    s.xdg = self.enumerated(e, &XdgMode::NAMES, XdgMode::parse);
                }
            }
            "block" | "allow" => {
                self.only_props(node, &[]);
                self.no_children(node);
                let list = if node.name().value() == "block" {
                    &mut s.block
                } else {
                    &mut s.allow
                };
                for e in self.args(node, 1, usize::MAX, "path globs") {
                    if let Some(g) = self.string(e) {
                        if let Err(msg) = crate::eval::masks::validate_pattern(&g.value) {
                            self.err(e.span(), format!("invalid glob `{}`: {msg}", g.value), "bad glob", Some(
                                "globs are relative to the project (`*.pem`, `config/*.yml`, `.aws/`); paths outside it start with `/` or `~/` and may not contain wildcards".into()));
                        } else {
                            list.push(g);
                        }
                    }
                }
            }
            "secrets" => self.secrets(node, &mut s.secrets),
            "env" => self.env(node, &mut s.env),
            "network" => self.network(node, &mut s.network),
            "process" => self.process(node, &mut s.process),
            "limits" => self.limits(node, &mut s.limits),
            "rootfs" => {
                self.only_props(node, &["dockerfile", "image", "from"]);
                let mut network_at = None;
                for child in self.children(node, &["network"]) {
                    s.build_network = self.build_network(child);
                    network_at = Some(child.span());
                }
                let props: Vec<(&str, Spanned<String>)> = ["dockerfile", "image", "from"]
                    .into_iter()
                    .filter_map(|k| Some((k, self.prop_string(node, k)?)))
                    .collect();
                let args = self.args(node, 0, 1, "`host`");
                let host = args.first().and_then(|e| self.string(e));
                let value = match (host, props.as_slice()) {
                    (Some(h), []) if h.value == "host" => Some(Spanned {
                        value: RootfsCfg::Host,
                        loc: h.loc,
                    }),
                    (None, [(k, v)]) => Some(Spanned {
                        value: match *k {
                            "dockerfile" => RootfsCfg::Dockerfile(v.value.clone()),
                            "image" => RootfsCfg::Image(v.value.clone()),
                            _ => RootfsCfg::From(v.value.clone()),
                        },
                        loc: v.loc,
                    }),
                    _ => {
                        self.err(
                            node.span(),
                            "rootfs takes `host` or exactly one of dockerfile=, image=, from=",
                            "ambiguous root",
                            Some("e.g. `rootfs dockerfile=\"Dockerfile\"`, `rootfs image=\"dev\"`, `rootfs from=\"oci:images/base:1\"`".into()),
                        );
                        None
                    }
                };
                if let (Some(span), Some(RootfsCfg::Host | RootfsCfg::From(_))) =
                    (network_at, value.as_ref().map(|v| &v.value))
                {
                    self.err(
                        span,
                        "nothing is built here: a build's network is for RUN steps",
                        "no RUN steps",
                        Some("the network inside the sandbox is the top-level `network` node; this one goes with `rootfs dockerfile=…` or `rootfs image=…`".into()),
                    );
                }
                s.rootfs = value;
            }
            "backend" => {
                self.only_props(node, &[]);
                self.no_children(node);
                if let Some(e) = self.args(node, 1, 1, "one of: libcontainer, bwrap").first() {
                    s.backend = self.enumerated(e, &BACKENDS, |b| {
                        BACKENDS.contains(&b).then(|| b.to_string())
                    });
                }
            }
            other => {
                let hint = suggest(other, known).map(|k| format!("did you mean `{k}`?"));
                self.err(
                    node.name().span(),
                    format!("unknown node `{other}`"),
                    "unknown node",
                    Some(hint.unwrap_or_else(|| {
                        format!("settings nodes are: {}", SETTINGS_NODES.join(", "))
                    })),
                );
            }
        }
    }

    fn profile(&mut self, node: &KdlNode) -> Option<ProfileDecl> {
        self.only_props(node, &["extends", "description"]);
        let name = self
            .args(node, 1, 1, "a profile name")
            .first()
            .and_then(|e| self.string(e))?;
        if name.value == "default" {
            self.err(
                name.loc.span,
                "`default` is the name of the top-level settings",
                "reserved name",
                Some("choose another name; `extends=\"default\"` refers to the top level".into()),
            );
        }
        let extends = self.prop_string(node, "extends");
        let description = self.prop_string(node, "description").map(|s| s.value);
        let mut settings = Settings::default();
        if let Some(children) = node.children() {
            for child in children.nodes() {
                self.setting(child, &mut settings, SETTINGS_NODES.iter().copied());
            }
        }
        Some(ProfileDecl {
            name,
            extends,
            description,
            settings,
        })
    }

    fn task(&mut self, node: &KdlNode) -> Option<TaskDecl> {
        self.only_props(node, &["description"]);
        let name = self
            .args(node, 1, 1, "a task name")
            .first()
            .and_then(|e| self.string(e))?;
        let description = self.prop_string(node, "description").map(|s| s.value);
        let mut run = None;
        let mut profile = None;
        let mut cwd = None;
        let mut env = Vec::new();
        for child in self.children(node, &["run", "profile", "cwd", "env"]) {
            self.only_props(child, &[]);
            self.no_children(child);
            match child.name().value() {
                "run" => {
                    let args: Vec<String> = self
                        .args(
                            child,
                            1,
                            usize::MAX,
                            "a shell command, or a program and its arguments",
                        )
                        .into_iter()
                        .filter_map(|e| self.string(e).map(|s| s.value))
                        .collect();
                    if !args.is_empty() {
                        run = Some(Spanned::new(args, self.loc(child.span())));
                    }
                }
                "profile" => {
                    profile = self
                        .args(child, 1, 1, "a profile name")
                        .first()
                        .and_then(|e| self.string(e))
                }
                "cwd" => {
                    cwd = self
                        .args(child, 1, 1, "a directory")
                        .first()
                        .and_then(|e| self.string(e))
                }
                "env" => {
                    let a = self.args(child, 2, 2, "a name and a value");
                    if let (Some(k), Some(v)) = (
                        a.first().and_then(|e| self.string(e)),
                        a.get(1).and_then(|e| self.string(e)),
                    ) {
                        env.push((k, v));
                    }
                }
                _ => {}
            }
        }
        let Some(run) = run else {
            self.err(
                node.span(),
                format!("task `{}` has no `run`", name.value),
                "this task",
                Some("add `run \"cargo test\"` inside the task's braces".into()),
            );
            return None;
        };
        Some(TaskDecl {
            name,
            description,
            run,
            profile,
            cwd,
            env,
        })
    }

    fn group(&mut self, node: &KdlNode) -> Option<GroupDecl> {
        self.only_props(node, &[]);
        self.no_children(node);
        let args = self.args(node, 2, usize::MAX, "a group name followed by domains");
        let name = args.first().and_then(|e| self.string(e))?;
        let mut domains = Vec::new();
        for e in &args[1..] {
            if let Some(d) = self.domain(e) {
                domains.push(d);
            }
        }
        Some(GroupDecl { name, domains })
    }

    /// `image "NAME" { from "…"; arg "K" "default"; env "K" "V"; run "…"; copy "SRC"… "DEST"
    /// chown=… chmod="0644"; add …; workdir "…"; user "…"; shell "…"… }`
    fn image(&mut self, node: &KdlNode) -> Option<ImageDecl> {
        use crate::image::{Cmd, Instr, Step};
        self.only_props(node, &[]);
        let name = self
            .args(node, 1, 1, "the image's name")
            .first()
            .and_then(|e| self.string(e))?;
        let file = self.sources[self.file].name.clone();
        let mut steps = Vec::new();
        let mut froms = 0;
        for child in self.children(
            node,
            &[
                "from", "arg", "env", "run", "copy", "add", "workdir", "user", "shell",
            ],
        ) {
            let kind = child.name().value();
            let (line, _) = self.sources[self.file].line_col(child.span().offset());
            let at = format!("{file}:{line}");
            let strings =
                |d: &mut Self, min: usize, max: usize, what: &str| -> Option<Vec<String>> {
                    let es = d.args(child, min, max, what);
                    let v: Vec<String> = es
                        .iter()
                        .filter_map(|e| d.string(e).map(|s| s.value))
                        .collect();
                    (v.len() == es.len() && v.len() >= min).then_some(v)
                };
            let props: &[&str] = if matches!(kind, "copy" | "add") {
                &["chown", "chmod"]
            } else {
                &[]
            };
            self.only_props(child, props);
            self.no_children(child);
            let instr = match kind {
                "from" => {
                    froms += 1;
                    if froms > 1 {
                        self.err(
                            child.span(),
                            "an image has one `from`",
                            "second from",
                            Some("copy artefacts in with `copy` instead".into()),
                        );
                    }
                    strings(
                        self,
                        1,
                        1,
                        "an image: oci:DIR[:TAG], oci-archive:FILE, REF or scratch",
                    )
                    .map(|v| Instr::From(v[0].clone()))
                }
                "arg" => strings(self, 1, 2, "a name and an optional default")
                    .map(|v| Instr::Arg(v[0].clone(), v.get(1).cloned())),
                "env" => strings(self, 2, 2, "a name and a value")
                    .map(|v| Instr::Env(vec![(v[0].clone(), v[1].clone())])),
                "run" => strings(
                    self,
                    1,
                    usize::MAX,
                    "a shell command, or several strings for an argv",
                )
                .map(|v| {
                    Instr::Run(if v.len() == 1 {
                        Cmd::Shell(v[0].clone())
                    } else {
                        Cmd::Exec(v)
                    })
                }),
                "copy" | "add" => {
                    strings(self, 2, usize::MAX, "sources and a destination").map(|mut v| {
                        let dest = v.pop().unwrap_or_default();
                        let chown = self.prop_string(child, "chown").map(|s| s.value);
                        let chmod = self.prop(child, "chmod").and_then(|e| {
                            let m = self.string(e)?;
                            let parsed = u32::from_str_radix(&m.value, 8)
                                .ok()
                                .filter(|m| *m <= 0o7777);
                            if parsed.is_none() {
                                self.err(
                                    e.span(),
                                    format!("`{}` is not an octal mode", m.value),
                                    "bad mode",
                                    Some("e.g. chmod=\"0755\"".into()),
                                );
                            }
                            parsed
                        });
                        Instr::Copy {
                            srcs: v,
                            dest,
                            chown,
                            chmod,
                            add: kind == "add",
                        }
                    })
                }
                "workdir" => {
                    strings(self, 1, 1, "a directory").map(|v| Instr::Workdir(v[0].clone()))
                }
                "user" => strings(self, 1, 1, "USER[:GROUP]").map(|v| Instr::User(v[0].clone())),
                _ => strings(self, 1, usize::MAX, "the shell's argv").map(Instr::Shell),
            };
            if let Some(instr) = instr {
                if froms == 0 && !matches!(instr, Instr::Arg(..) | Instr::From(_)) {
                    self.err(
                        child.span(),
                        format!("`{kind}` before `from`"),
                        "no base yet",
                        Some("start the image with `from \"…\"`".into()),
                    );
                }
                steps.push(Step { instr, at });
            }
        }
        if froms == 0 {
            self.err(
                node.name().span(),
                format!("image `{}` has no `from`", name.value),
                "no base",
                Some("add `from \"oci:DIR\"`, `from \"REF\"` or `from \"scratch\"`".into()),
            );
        }
        Some(ImageDecl { name, steps })
    }

    fn project(&mut self, node: &KdlNode, p: &mut ProjectCfg) {
        self.only_props(node, &["access"]);
        self.no_children(node);
        if let Some(e) = self.args(node, 0, 1, "the project root").first() {
            p.root = self.string(e);
        }
        if let Some(e) = self.prop(node, "access") {
            p.access = self.enumerated(e, &Access::NAMES, Access::parse);
        }
    }

    fn mount(&mut self, node: &KdlNode) -> Option<MountCfg> {
        self.only_props(node, &["access", "optional"]);
        self.no_children(node);
        let args = self.args(node, 1, 2, "a host path and an optional target path");
        let source = args.first().and_then(|e| self.string(e))?;
        let target = args.get(1).and_then(|e| self.string(e));
        let access = match self.prop(node, "access") {
            Some(e) => self
                .enumerated(e, &Access::NAMES, Access::parse)
                .map(|a| a.value)?,
            None => Access::Ro,
        };
        let optional = self
            .prop(node, "optional")
            .and_then(|e| self.boolean(e))
            .is_some_and(|b| b.value);
        Some(MountCfg {
            source,
            target,
            access,
            optional,
            loc: self.loc(node.span()),
        })
    }

    fn tmpfs(&mut self, node: &KdlNode) -> Option<TmpfsCfg> {
        self.only_props(node, &["size"]);
        self.no_children(node);
        let target = self
            .args(node, 1, 1, "a path inside the sandbox")
            .first()
            .and_then(|e| self.string(e))?;
        let size = match self.prop(node, "size") {
            Some(e) => Some(self.size(e)?),
            None => None,
        };
        Some(TmpfsCfg {
            target,
            size,
            loc: self.loc(node.span()),
        })
    }

    fn secrets(&mut self, node: &KdlNode, s: &mut SecretsCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(node, &["defaults", "gitignored", "git-crypt", "tool-dirs"]) {
            self.only_props(child, &[]);
            self.no_children(child);
            match child.name().value() {
                "defaults" => s.defaults = self.bool_arg_default_true(child),
                "gitignored" => s.gitignored = self.bool_arg_default_true(child),
                "git-crypt" => s.git_crypt = self.bool_arg_default_true(child),
                "tool-dirs" => {
                    for e in self.args(child, 1, usize::MAX, "directory globs") {
                        if let Some(g) = self.string(e) {
                            match crate::eval::masks::validate_pattern(&g.value) {
                                Ok(()) => s.tool_dirs.push(g),
                                Err(msg) => self.err(
                                    e.span(),
                                    format!("invalid glob `{}`: {msg}", g.value),
                                    "bad glob",
                                    None,
                                ),
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn env(&mut self, node: &KdlNode, env: &mut EnvCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(
            node,
            &[
                "inherit",
                "filter-secrets",
                "allow",
                "deny",
                "pass",
                "set",
                "from-file",
            ],
        ) {
            self.only_props(child, &[]);
            self.no_children(child);
            match child.name().value() {
                "inherit" => {
                    if let Some(e) = self.args(child, 1, 1, "one of: all, safe, none").first() {
                        env.inherit = self.enumerated(e, &Inherit::NAMES, Inherit::parse);
                    }
                }
                "filter-secrets" => env.filter_secrets = self.bool_arg_default_true(child),
                "allow" | "deny" | "pass" => {
                    let what = child.name().value().to_string();
                    for e in self.args(child, 1, usize::MAX, "variable names or globs") {
                        let Some(name) = self.string(e) else { continue };
                        let valid = if what == "pass" {
                            is_env_name(&name.value)
                        } else {
                            is_env_glob(&name.value)
                        };
                        if !valid {
                            self.err(
                                e.span(),
                                format!(
                                    "`{}` is not a valid variable name{}",
                                    name.value,
                                    if what == "pass" { "" } else { " or glob" }
                                ),
                                "invalid name",
                                Some(
                                    "names are letters, digits and `_`; globs may use `*` and `?`"
                                        .into(),
                                ),
                            );
                            continue;
                        }
                        match what.as_str() {
                            "allow" => env.allow.push(name),
                            "deny" => env.deny.push(name),
                            _ => env.pass.push(name),
                        }
                    }
                }
                "from-file" => {
                    let a = self.args(
                        child,
                        2,
                        usize::MAX,
                        "a dotenv file, then the keys to take from it",
                    );
                    let Some(file) = a.first().and_then(|e| self.string(e)) else {
                        continue;
                    };
                    let mut keys = Vec::new();
                    for e in &a[1..] {
                        let Some(k) = self.string(e) else { continue };
                        if is_env_name(&k.value) {
                            keys.push(k);
                        } else {
                            self.err(
                                e.span(),
                                format!("`{}` is not a valid variable name", k.value),
                                "invalid name",
                                Some(
                                    "name each key to take from the file: letters, digits and `_`"
                                        .into(),
                                ),
                            );
                        }
                    }
                    env.from_file.push((file, keys));
                }
                "set" => {
                    let a = self.args(child, 2, 2, "a name and a value");
                    if let (Some(k), Some(v)) = (
                        a.first().and_then(|e| self.string(e)),
                        a.get(1).and_then(|e| self.string(e)),
                    ) {
                        if is_env_name(&k.value) {
                            env.set.push((k, v));
                        } else {
                            self.err(
                                k.loc.span,
                                format!("`{}` is not a valid variable name", k.value),
                                "invalid name",
                                Some(
                                    "names are letters, digits and `_`, not starting with a digit"
                                        .into(),
                                ),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn network(&mut self, node: &KdlNode, net: &mut NetworkCfg) {
        self.only_props(node, &["domains", "transparent"]);
        if let Some(e) = self.prop(node, "domains") {
            net.domains = self.enumerated(e, &DomainsMode::NAMES, DomainsMode::parse);
        }
        if let Some(e) = self.prop(node, "transparent") {
            net.transparent = self.boolean(e);
        }
        if let Some(e) = self.args(node, 0, 1, "one of: none, allow, host").first() {
            net.mode = self.enumerated(e, &NetMode::NAMES, NetMode::parse);
        }
        let mut has_rules = false;
        for child in self.children(node, &["allow", "deny", "group", "localhost-port"]) {
            self.only_props(child, &[]);
            self.no_children(child);
            has_rules = true;
            match child.name().value() {
                "allow" | "deny" => {
                    let deny = child.name().value() == "deny";
                    for e in self.args(child, 1, usize::MAX, "domains") {
                        if let Some(d) = self.domain(e) {
                            if deny {
                                net.deny.push(d)
                            } else {
                                net.allow.push(d)
                            }
                        }
                    }
                }
                "group" => {
                    for e in self.args(child, 1, usize::MAX, "domain group names") {
                        if let Some(g) = self.string(e) {
                            net.groups.push(g);
                        }
                    }
                }
                "localhost-port" => {
                    for e in self.args(child, 1, usize::MAX, "port numbers") {
                        if let Some(p) = self.port(e) {
                            net.localhost_ports.push(p);
                        }
                    }
                }
                _ => {}
            }
        }
        if has_rules {
            match &net.mode {
                None => net.mode = Some(Spanned::new(NetMode::Allow, self.loc(node.name().span()))),
                Some(m) if m.value != NetMode::Allow => {
                    let span = m.loc.span;
                    self.err(
                        span,
                        "allow rules given with a network mode that ignores them",
                        "this mode",
                        Some("use `network { allow … }` (mode allow), or drop the rules".into()),
                    );
                }
                _ => {}
            }
        }
    }

    /// `rootfs … { network "none" }` or `{ network { group …; allow … } }`: what RUN steps may
    /// reach. Only names to allow: steps never get the host's network, its loopback ports,
    /// or a domain mode (there is no preset list to merge with).
    fn build_network(&mut self, node: &KdlNode) -> Option<NetworkCfg> {
        let mut net = NetworkCfg::default();
        self.network(node, &mut net);
        let host = net.mode.as_ref().filter(|m| m.value == NetMode::Host);
        let (what, span) = if let Some(m) = host {
            ("the host's network", m.loc.span)
        } else if let Some(d) = &net.domains {
            ("a domain mode", d.loc.span)
        } else if let Some(d) = net.deny.first() {
            ("deny rules", d.loc.span)
        } else if let Some(p) = net.localhost_ports.first() {
            ("the host's loopback ports", p.loc.span)
        } else {
            return Some(net);
        };
        self.err(
            span,
            format!("a build's network cannot include {what}"),
            "not for build steps",
            Some("RUN steps reach only what is allowed: `network \"none\"`, or `network { group \"registries\"; allow \"example.com\" }`".into()),
        );
        None
    }

    fn process(&mut self, node: &KdlNode, p: &mut ProcessCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(
            node,
            &["command", "cwd", "shell", "user", "rlimit", "hostname"],
        ) {
            match child.name().value() {
                "command" => {
                    self.only_props(child, &[]);
                    self.no_children(child);
                    let args: Vec<String> = self
                        .args(child, 1, usize::MAX, "a program and its arguments")
                        .into_iter()
                        .filter_map(|e| self.string(e).map(|s| s.value))
                        .collect();
                    if !args.is_empty() {
                        p.command = Some(Spanned::new(args, self.loc(child.span())));
                    }
                }
                "cwd" | "shell" | "hostname" => {
                    self.only_props(child, &[]);
                    self.no_children(child);
                    let v = self
                        .args(child, 1, 1, "a string")
                        .first()
                        .and_then(|e| self.string(e));
                    match child.name().value() {
                        "cwd" => p.cwd = v,
                        "shell" => p.shell = v,
                        _ => p.hostname = v,
                    }
                }
                "user" => {
                    self.only_props(child, &["uid", "gid", "name"]);
                    self.no_children(child);
                    self.args(child, 0, 0, "");
                    let uid = self.prop(child, "uid").and_then(|e| self.id(e));
                    let gid = self.prop(child, "gid").and_then(|e| self.id(e));
                    let name = self.prop_string(child, "name");
                    p.user = Some(UserCfg {
                        uid,
                        gid,
                        name,
                        loc: self.loc(child.span()),
                    });
                }
                "rlimit" => {
                    self.only_props(child, &["soft", "hard"]);
                    self.no_children(child);
                    let args = self.args(child, 1, 2, "a resource name and a limit");
                    let Some(res) = args.first().and_then(|e| self.string(e)) else {
                        continue;
                    };
                    if !RLIMITS.iter().any(|(n, _)| *n == res.value) {
                        let hint = suggest(&res.value, RLIMITS.iter().map(|(n, _)| *n));
                        self.err(
                            res.loc.span,
                            format!("unknown rlimit `{}`", res.value),
                            "unknown resource",
                            Some(hint.map_or_else(
                                || format!("known: {}", RLIMITS.map(|(n, _)| n).join(", ")),
                                |h| format!("did you mean `{h}`?"),
                            )),
                        );
                        continue;
                    }
                    let both = args.get(1).and_then(|e| self.limit(e));
                    let soft = self
                        .prop(child, "soft")
                        .and_then(|e| self.limit(e))
                        .or(both);
                    let hard = self
                        .prop(child, "hard")
                        .and_then(|e| self.limit(e))
                        .or(both);
                    match (soft, hard) {
                        (Some(soft), Some(hard)) if soft <= hard => p.rlimits.push(RlimitCfg {
                            resource: res,
                            soft,
                            hard,
                            loc: self.loc(child.span()),
                        }),
                        (Some(_), Some(_)) => self.err(
                            child.span(),
                            "soft limit is above the hard limit",
                            "here",
                            None,
                        ),
                        _ => self.err(
                            child.span(),
                            format!("rlimit `{}` needs a value", res.value),
                            "no limit",
                            Some("write `rlimit \"nofile\" 4096`, or soft=… hard=…".into()),
                        ),
                    }
                }
                _ => {}
            }
        }
    }

    fn limits(&mut self, node: &KdlNode, l: &mut LimitsCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(node, &["pids", "memory", "cpus"]) {
            self.only_props(child, &[]);
            self.no_children(child);
            let Some(e) = self.args(child, 1, 1, "a limit").first().copied() else {
                continue;
            };
            let loc = self.loc(e.span());
            match child.name().value() {
                "pids" => {
                    let help = "processes and threads at once, e.g. `pids 4096` (aisb's default); every sandbox has one";
                    match e.value() {
                        KdlValue::Integer(i) if (PIDS_MIN as i128..=PIDS_MAX as i128).contains(i) => {
                            l.pids = Some(Spanned::new(*i as u64, loc));
                        }
                        KdlValue::Integer(i) => self.err(
                            e.span(),
                            format!("a pids limit of {i} is out of range"),
                            "out of range",
                            Some(format!("use a number of processes between {PIDS_MIN} and {PIDS_MAX}: {help}")),
                        ),
                        other => self.err(
                            e.span(),
                            format!("expected a number of processes, found {}", kind_of(other)),
                            "not a number",
                            Some(help.into()),
                        ),
                    }
                }
                "memory" => {
                    let bytes = match e.value() {
                        KdlValue::String(s) if s == "unlimited" => Some(None),
                        KdlValue::String(s) => parse_size(s).map(Some),
                        KdlValue::Integer(i) if *i > 0 => {
                            Some(Some(u64::try_from(*i).unwrap_or(u64::MAX)))
                        }
                        _ => None,
                    };
                    let help = format!(
                        "write e.g. `memory \"8G\"` or `\"512M\"` (between {}M and {}T), or `\"unlimited\"`",
                        MEMORY_MIN >> 20,
                        MEMORY_MAX >> 40
                    );
                    match bytes {
                        Some(Some(b)) if !(MEMORY_MIN..=MEMORY_MAX).contains(&b) => self.err(
                            e.span(),
                            format!("a memory limit of {b} bytes is out of range"),
                            "out of range",
                            Some(help),
                        ),
                        Some(v) => l.memory = Some(Spanned::new(v, loc)),
                        None => self.err(
                            e.span(),
                            match e.value() {
                                KdlValue::String(s) => format!("invalid memory size `{s}`"),
                                KdlValue::Integer(i) => {
                                    format!("a memory limit of {i} bytes is out of range")
                                }
                                other => {
                                    format!("expected a memory size, found {}", kind_of(other))
                                }
                            },
                            "bad size",
                            Some(help),
                        ),
                    }
                }
                _ => {
                    let cpus = match e.value() {
                        KdlValue::String(s) if s == "unlimited" => Some(None),
                        KdlValue::Integer(i) => Some(Some(*i as f64)),
                        KdlValue::Float(f) => Some(Some(*f)),
                        _ => None,
                    };
                    let milli = |c: f64| (c * 1000.0).round();
                    let range = (CPUS_MILLI_MIN as f64)..=(CPUS_MILLI_MAX as f64);
                    let help = format!(
                        "write how many CPUs' worth of time the sandbox may use, e.g. `cpus 2` or `cpus 0.5` (between {} and {}), or `\"unlimited\"`",
                        CPUS_MILLI_MIN as f64 / 1000.0,
                        CPUS_MILLI_MAX / 1000
                    );
                    match cpus {
                        Some(None) => l.cpus = Some(Spanned::new(None, loc)),
                        Some(Some(c)) if c.is_finite() && range.contains(&milli(c)) => {
                            l.cpus = Some(Spanned::new(Some(milli(c) as u32), loc));
                        }
                        Some(Some(c)) => self.err(
                            e.span(),
                            format!("a CPU limit of {c} is out of range"),
                            "out of range",
                            Some(help),
                        ),
                        None => self.err(
                            e.span(),
                            format!("expected a number of CPUs, found {}", kind_of(e.value())),
                            "not a number",
                            Some(help),
                        ),
                    }
                }
            }
        }
    }

    // ---- helpers ----------------------------------------------------------------------------

    fn args<'n>(
        &mut self,
        node: &'n KdlNode,
        min: usize,
        max: usize,
        what: &str,
    ) -> Vec<&'n KdlEntry> {
        let args: Vec<&KdlEntry> = node
            .entries()
            .iter()
            .filter(|e| e.name().is_none())
            .collect();
        let name = node.name().value();
        if args.len() < min {
            self.err(
                node.span(),
                format!("`{name}` needs {what}"),
                "missing argument",
                Some(format!("write `{name}` followed by {what}")),
            );
        } else if args.len() > max {
            let extra = args[max];
            let message = if max == 0 {
                format!("`{name}` takes no arguments")
            } else {
                format!(
                    "`{name}` takes at most {max} argument{}",
                    if max == 1 { "" } else { "s" }
                )
            };
            self.err(
                extra.span(),
                message,
                "unexpected argument",
                (!what.is_empty()).then(|| format!("`{name}` expects {what}")),
            );
            return args[..max].to_vec();
        }
        args
    }

    fn prop<'n>(&mut self, node: &'n KdlNode, key: &str) -> Option<&'n KdlEntry> {
        node.entries()
            .iter()
            .rev()
            .find(|e| e.name().is_some_and(|n| n.value() == key))
    }

    fn prop_string(&mut self, node: &KdlNode, key: &str) -> Option<Spanned<String>> {
        let e = self.prop(node, key)?;
        self.string(e)
    }

    fn only_props(&mut self, node: &KdlNode, allowed: &[&str]) {
        for e in node.entries() {
            if let Some(n) = e.name() {
                if !allowed.contains(&n.value()) {
                    let help = match suggest(n.value(), allowed.iter().copied()) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None if allowed.is_empty() => {
                            format!("`{}` takes no properties", node.name().value())
                        }
                        None => format!("known properties: {}", allowed.join(", ")),
                    };
                    self.err(
                        n.span(),
                        format!(
                            "unknown property `{}` on `{}`",
                            n.value(),
                            node.name().value()
                        ),
                        "unknown property",
                        Some(help),
                    );
                }
            }
        }
    }

    fn no_children(&mut self, node: &KdlNode) {
        if let Some(c) = node.children() {
            self.err(
                c.span(),
                format!("`{}` takes no children block", node.name().value()),
                "unexpected block",
                Some("remove the braces and put the values on the node's line".into()),
            );
        }
    }

    /// Children of a block node, with unknown names reported.
    fn children<'n>(&mut self, node: &'n KdlNode, known: &[&str]) -> Vec<&'n KdlNode> {
        let mut out = Vec::new();
        let Some(doc) = node.children() else {
            return out;
        };
        for child in doc.nodes() {
            let name = child.name().value();
            if known.contains(&name) {
                out.push(child);
            } else {
                let help = match suggest(name, known.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("`{}` accepts: {}", node.name().value(), known.join(", ")),
                };
                self.err(
                    child.name().span(),
                    format!("unknown node `{name}` in `{}`", node.name().value()),
                    "unknown node",
                    Some(help),
                );
            }
        }
        out
    }

    fn string(&mut self, e: &KdlEntry) -> Option<Spanned<String>> {
        match e.value() {
            KdlValue::String(s) => Some(Spanned::new(s.clone(), self.loc(e.span()))),
            other => {
                self.err(
                    e.span(),
                    format!("expected a string, found {}", kind_of(other)),
                    "not a string",
                    Some("quote the value: \"…\"".into()),
                );
                None
            }
        }
    }

    fn boolean(&mut self, e: &KdlEntry) -> Option<Spanned<bool>> {
        match e.value() {
            KdlValue::Bool(b) => Some(Spanned::new(*b, self.loc(e.span()))),
            other => {
                self.err(
                    e.span(),
                    format!("expected a boolean, found {}", kind_of(other)),
                    "not a boolean",
                    Some("write #true or #false".into()),
                );
                None
            }
        }
    }

    /// `read-only` alone means `read-only #true`.
    fn bool_arg_default_true(&mut self, node: &KdlNode) -> Option<Spanned<bool>> {
        match self.args(node, 0, 1, "#true or #false").first() {
            Some(e) => self.boolean(e),
            None => Some(Spanned::new(true, self.loc(node.span()))),
        }
    }

    fn enumerated<T>(
        &mut self,
        e: &KdlEntry,
        names: &[&str],
        parse: fn(&str) -> Option<T>,
    ) -> Option<Spanned<T>> {
        let s = self.string(e)?;
        match parse(&s.value) {
            Some(v) => Some(Spanned::new(v, s.loc)),
            None => {
                let help = match suggest(&s.value, names.iter().copied()) {
                    Some(h) => format!("did you mean `{h}`?"),
                    None => format!("expected one of: {}", names.join(", ")),
                };
                self.err(
                    e.span(),
                    format!("unknown value `{}`", s.value),
                    "unknown value",
                    Some(help),
                );
                None
            }
        }
    }

    fn integer(&mut self, e: &KdlEntry, what: &str, min: i128, max: i128) -> Option<i128> {
        match e.value() {
            KdlValue::Integer(i) if (min..=max).contains(i) => Some(*i),
            KdlValue::Integer(i) => {
                self.err(
                    e.span(),
                    format!("{i} is out of range for {what}"),
                    "out of range",
                    Some(format!("use a value between {min} and {max}")),
                );
                None
            }
            other => {
                self.err(
                    e.span(),
                    format!("expected {what}, found {}", kind_of(other)),
                    "not an integer",
                    None,
                );
                None
            }
        }
    }

    fn port(&mut self, e: &KdlEntry) -> Option<Spanned<u16>> {
        let p = self.integer(e, "a port", 1, 65535)?;
        Some(Spanned::new(p as u16, self.loc(e.span())))
    }

    fn id(&mut self, e: &KdlEntry) -> Option<Spanned<u32>> {
        let v = self.integer(e, "an id", 0, u32::MAX as i128 - 1)?;
        Some(Spanned::new(v as u32, self.loc(e.span())))
    }

    fn limit(&mut self, e: &KdlEntry) -> Option<u64> {
        if let KdlValue::String(s) = e.value() {
            if s == "unlimited" {
                return Some(u64::MAX);
            }
        }
        self.integer(e, "a limit", 0, u64::MAX as i128)
            .map(|v| v as u64)
    }

    /// A size: bytes as an integer or a string with a K/M/G suffix.
    fn size(&mut self, e: &KdlEntry) -> Option<u64> {
        if let KdlValue::String(s) = e.value() {
            if let Some(v) = parse_size(s) {
                return Some(v);
            }
            self.err(
                e.span(),
                format!("invalid size `{s}`"),
                "bad size",
                Some("write a number of bytes, or e.g. \"512M\", \"2G\"".into()),
            );
            return None;
        }
        self.integer(e, "a size", 1, u64::MAX as i128)
            .map(|v| v as u64)
    }

    fn domain(&mut self, e: &KdlEntry) -> Option<Spanned<String>> {
        let s = self.string(e)?;
        match DomainRule::parse(&s.value) {
            Ok(_) => Some(s),
            Err(err) => {
                self.err(
                    e.span(),
                    format!("invalid domain `{}`: {err}", s.value),
                    "bad domain",
                    Some(err.help().into()),
                );
                None
            }
        }
    }
}

pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let mult = match s[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return None,
            };
            (&s[..i], mult)
        }
    };
    num.parse::<u64>()
        .ok()?
        .checked_mul(mult)
        .filter(|v| *v > 0)
}

pub fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_env_glob(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '*' || c == '?')
}
