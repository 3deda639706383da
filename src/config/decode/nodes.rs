//! One function per node of the configuration (the `image` block's are in `image`).

use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};

use super::values::{is_env_glob, is_env_name, kind_of, parse_size};
use super::Decoder;
use super::BACKENDS;
use crate::config::diag::{suggest, Spanned};
use crate::config::model::*;
use crate::config::schema::*;

impl Decoder<'_> {
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
    pub(super) fn setting<'k>(
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
                self.only_props(node, HOME_PROPS);
                self.no_children(node);
                if let Some(e) = self.args(node, 1, 1, "one of: empty, ro, overlay").first() {
                    s.home = self.enumerated(e, &HomeMode::NAMES, HomeMode::parse);
                }
                if let Some(e) = self.prop(node, "toolchains") {
                    s.toolchains = self.boolean(e);
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
                        if let Err(msg) = crate::config::pattern::validate(&g.value) {
                            self.err(e.span(), format!("invalid glob `{}`: {msg}", g.value), "bad glob", Some(
                                "globs are relative to the project (`*.pem`, `config/*.yml`, `.aws/`); paths outside it start with `/` or `~/` and may not contain wildcards".into()));
                        } else {
                            list.push(g);
                        }
                    }
                }
            }
            "unprotect" => {
                self.only_props(node, &[]);
                self.no_children(node);
                for e in self.args(node, 1, usize::MAX, "protected files") {
                    let Some(p) = self.string(e) else { continue };
                    let bad = if p.value.starts_with('/') || p.value.starts_with('~') {
                        Some("a protected file is named relative to the project")
                    } else if p.value.is_empty()
                        || p.value
                            .trim_end_matches('/')
                            .split('/')
                            .any(|c| c.is_empty() || c == "." || c == "..")
                    {
                        Some("a plain relative path, without `.`, `..` or empty parts")
                    } else if p.value.contains(['*', '?', '[', '{']) {
                        Some("one file or directory by name, no wildcards")
                    } else {
                        None
                    };
                    match bad {
                        Some(why) => self.err(
                            e.span(),
                            format!("`{}` is not a protected file's name", p.value),
                            why,
                            Some("`aisb plan` lists the protected files (`.vscode/`, `.envrc`, `sub/.npmrc`, …); name one as it shows it".into()),
                        ),
                        None => s.unprotect.push(p),
                    }
                }
            }
            "secrets" => self.secrets(node, &mut s.secrets),
            "env" => self.env(node, &mut s.env),
            "network" => self.network(node, &mut s.network),
            "process" => self.process(node, &mut s.process),
            "limits" => self.limits(node, &mut s.limits),
            "tools" => self.tools(node, &mut s.tools),
            "credential" => {
                if let Some(c) = self.credential(node) {
                    s.credentials.push(c);
                }
            }
            "rootfs" => {
                self.only_props(node, ROOTFS_PROPS);
                let mut network_at = None;
                for child in self.children(node, ROOTFS_CHILDREN) {
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

    pub(super) fn profile(&mut self, node: &KdlNode) -> Option<ProfileDecl> {
        self.only_props(node, PROFILE_PROPS);
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

    pub(super) fn task(&mut self, node: &KdlNode) -> Option<TaskDecl> {
        self.only_props(node, TASK_PROPS);
        let name = self
            .args(node, 1, 1, "a task name")
            .first()
            .and_then(|e| self.string(e))?;
        let description = self.prop_string(node, "description").map(|s| s.value);
        let mut run = None;
        let mut profile = None;
        let mut cwd = None;
        let mut env = Vec::new();
        for child in self.children(node, TASK_CHILDREN) {
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
                        .filter_map(|e| self.text(e).map(|s| s.value))
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
                        a.get(1).and_then(|e| self.text(e)),
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

    pub(super) fn group(&mut self, node: &KdlNode) -> Option<GroupDecl> {
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

    pub(super) fn project(&mut self, node: &KdlNode, p: &mut ProjectCfg) {
        self.only_props(node, PROJECT_PROPS);
        self.no_children(node);
        if let Some(e) = self.args(node, 0, 1, "the project root").first() {
            p.root = self.string(e);
        }
        if let Some(e) = self.prop(node, "access") {
            p.access = self.enumerated(e, &Access::NAMES, Access::parse);
        }
    }

    pub(super) fn mount(&mut self, node: &KdlNode) -> Option<MountCfg> {
        self.only_props(node, MOUNT_PROPS);
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

    pub(super) fn tmpfs(&mut self, node: &KdlNode) -> Option<TmpfsCfg> {
        self.only_props(node, TMPFS_PROPS);
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

    pub(super) fn secrets(&mut self, node: &KdlNode, s: &mut SecretsCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(node, SECRETS_CHILDREN) {
            self.only_props(child, &[]);
            self.no_children(child);
            match child.name().value() {
                "defaults" => s.defaults = self.bool_arg_default_true(child),
                "gitignored" => s.gitignored = self.bool_arg_default_true(child),
                "git-crypt" => s.git_crypt = self.bool_arg_default_true(child),
                name @ ("tool-dirs"
                | "dependency-dirs"
                | "not-dependency-dirs"
                | "write-through") => {
                    let list = match name {
                        "tool-dirs" => &mut s.tool_dirs,
                        "dependency-dirs" => &mut s.dependency_dirs,
                        "not-dependency-dirs" => &mut s.not_dependency_dirs,
                        _ => &mut s.write_through,
                    };
                    for e in self.args(child, 1, usize::MAX, "directory globs") {
                        if let Some(g) = self.string(e) {
                            match crate::config::pattern::validate(&g.value) {
                                Ok(()) if crate::config::pattern::is_outside(&g.value) => self
                                    .err(
                                        e.span(),
                                        format!("`{}` is outside the project", g.value),
                                        "not a project path",
                                        Some("these globs name directories of the project, relative to its root".into()),
                                    ),
                                Ok(()) => list.push(g),
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

    pub(super) fn env(&mut self, node: &KdlNode, env: &mut EnvCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(node, ENV_CHILDREN) {
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
                        a.get(1).and_then(|e| self.text(e)),
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

    /// `tools { allow …; deny … }` (issue 23): tool rules, checked by `crate::tools::parse`.
    fn tools(&mut self, node: &KdlNode, tools: &mut ToolsCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(node, TOOLS_CHILDREN) {
            self.only_props(child, &[]);
            self.no_children(child);
            for e in self.args(child, 1, usize::MAX, "tool names or rules") {
                let Some(rule) = self.string(e) else { continue };
                if let Err(why) = crate::tools::parse(&rule.value) {
                    self.err(
                        e.span(),
                        format!("`{}` is not a tool rule: {why}", rule.value.escape_debug()),
                        "bad tool rule",
                        Some("write a tool name (`Read`, `Write`, `Edit`, `Bash`, `WebFetch`, … or an agent's own), optionally with a specifier: `Bash(git push:*)`, `Read(//etc/**)`, `WebFetch(domain:example.com)`".into()),
                    );
                    continue;
                }
                if child.name().value() == "allow" {
                    tools.allow.push(rule);
                } else {
                    tools.deny.push(rule);
                }
            }
        }
    }

    /// `credential "NAME" env="VAR" { from env="VAR"|file="PATH"|command="…"; hosts "a.com";
    /// header "x-api-key" scheme="raw|bearer|basic" }` (issue 31).
    fn credential(&mut self, node: &KdlNode) -> Option<CredentialCfg> {
        self.only_props(node, CREDENTIAL_PROPS);
        let name = self
            .args(node, 1, 1, "the credential's name")
            .first()
            .and_then(|e| self.string(e))?;
        let help_all = "e.g. credential \"anthropic\" env=\"ANTHROPIC_API_KEY\" { from env=\"ANTHROPIC_API_KEY\"; hosts \"api.anthropic.com\"; header \"x-api-key\" }";
        let env = self.prop_string(node, "env");
        if let Some(v) = &env {
            if !is_env_name(&v.value) {
                self.err(
                    v.loc.span,
                    format!("`{}` is not a valid variable name", v.value.escape_debug()),
                    "invalid name",
                    Some(
                        "the variable that holds the placeholder inside: letters, digits and `_`"
                            .into(),
                    ),
                );
            }
        }
        let mut c = CredentialCfg {
            name,
            env,
            from: None,
            hosts: Vec::new(),
            allow_requests: Vec::new(),
            deny_requests: Vec::new(),
            header: None,
            scheme: None,
            loc: self.loc(node.span()),
        };
        for child in self.children(node, CREDENTIAL_CHILDREN) {
            self.no_children(child);
            match child.name().value() {
                "from" => {
                    self.only_props(child, CREDENTIAL_FROM_PROPS);
                    self.args(child, 0, 0, "");
                    let said: Vec<(&str, Spanned<String>)> = ["env", "file", "command"]
                        .into_iter()
                        .filter_map(|k| Some((k, self.prop_string(child, k)?)))
                        .collect();
                    match said.as_slice() {
                        [(k, v)] if !v.value.trim().is_empty() && !v.value.contains(['\0', '\n', '\r']) => {
                            let value = match *k {
                                "env" => CredentialSource::Env(v.value.clone()),
                                "file" => CredentialSource::File(v.value.clone()),
                                _ => CredentialSource::Command(v.value.clone()),
                            };
                            c.from = Some(Spanned::new(value, v.loc));
                        }
                        _ => self.err(
                            child.span(),
                            "`from` takes exactly one of env=, file=, command=, not empty",
                            "where the real value comes from",
                            Some("e.g. `from env=\"GH_TOKEN\"`, `from file=\"~/.config/openai/key\"`, `from command=\"gh auth token\"`".into()),
                        ),
                    }
                }
                "allow-request" | "deny-request" => {
                    self.only_props(child, &[]);
                    let deny = child.name().value() == "deny-request";
                    for e in self.args(child, 1, usize::MAX, "request rules") {
                        let Some(r) = self.string(e) else { continue };
                        if let Err(why) = crate::config::credential::RequestRule::parse(&r.value) {
                            self.err(
                                e.span(),
                                format!("`{}` is not a request rule: {why}", r.value.escape_debug()),
                                "bad rule",
                                Some("write `METHOD PATH`, `*` for any run of characters: `GET *`, `POST */git-upload-pack`, `* /repos/me/*`".into()),
                            );
                        } else if deny {
                            c.deny_requests.push(r);
                        } else {
                            c.allow_requests.push(r);
                        }
                    }
                }
                "hosts" => {
                    self.only_props(child, &[]);
                    for e in self.args(child, 1, usize::MAX, "host names") {
                        let Some(h) = self.string(e) else { continue };
                        match crate::config::domain::normalise_name(&h.value) {
                            Ok(_) if !h.value.contains(['*', ':', '/']) => c.hosts.push(h),
                            _ => self.err(
                                e.span(),
                                format!("`{}` is not a host name", h.value.escape_debug()),
                                "not a host",
                                Some("a credential is bound to exact names (`api.github.com`): no wildcard, port or path".into()),
                            ),
                        }
                    }
                }
                _ => {
                    self.only_props(child, HEADER_PROPS);
                    let Some(h) = self
                        .args(child, 1, 1, "a header name")
                        .first()
                        .and_then(|e| self.string(e))
                    else {
                        continue;
                    };
                    let token = !h.value.is_empty()
                        && h.value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
                    // Headers the proxy writes itself, or that say how the message is read, and
                    // names a server may drop (`_`) or log widely: never where a credential goes.
                    let reserved = [
                        "host",
                        "content-length",
                        "transfer-encoding",
                        "expect",
                        "connection",
                        "te",
                        "upgrade",
                        "http2-settings",
                        "user-agent",
                        "referer",
                    ];
                    if !token
                        || h.value.contains('_')
                        || reserved.iter().any(|r| h.value.eq_ignore_ascii_case(r))
                    {
                        self.err(
                            h.loc.span,
                            format!("`{}` is not a header a credential can go in", h.value.escape_debug()),
                            "bad header",
                            Some("name the header, e.g. `header \"x-api-key\"` or `header \"Authorization\" scheme=\"bearer\"`".into()),
                        );
                        continue;
                    }
                    c.header = Some(h);
                    if let Some(e) = self.prop(child, "scheme") {
                        c.scheme = self
                            .enumerated(
                                e,
                                &crate::config::credential::Scheme::NAMES,
                                crate::config::credential::Scheme::parse,
                            )
                            .map(|s| Spanned::new(s.value.name().to_string(), s.loc));
                    }
                }
            }
        }
        let missing: Vec<&str> = [
            (c.env.is_none(), "env= (the variable inside)"),
            (c.from.is_none(), "from (where the real value is)"),
            (c.hosts.is_empty(), "hosts (where it may be sent)"),
            (c.header.is_none(), "header (where in a request it goes)"),
        ]
        .into_iter()
        .filter_map(|(m, what)| m.then_some(what))
        .collect();
        if !missing.is_empty() {
            self.err(
                node.span(),
                format!(
                    "credential `{}` does not say {}",
                    c.name.value,
                    missing.join(", ")
                ),
                "incomplete",
                Some(help_all.into()),
            );
            return None;
        }
        Some(c)
    }

    pub(super) fn network(&mut self, node: &KdlNode, net: &mut NetworkCfg) {
        self.only_props(node, NETWORK_PROPS);
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
        for child in self.children(node, NETWORK_CHILDREN) {
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
    pub(super) fn build_network(&mut self, node: &KdlNode) -> Option<NetworkCfg> {
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

    pub(super) fn process(&mut self, node: &KdlNode, p: &mut ProcessCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(node, PROCESS_CHILDREN) {
            match child.name().value() {
                "command" => {
                    self.only_props(child, &[]);
                    self.no_children(child);
                    let args: Vec<String> = self
                        .args(child, 1, usize::MAX, "a program and its arguments")
                        .into_iter()
                        .filter_map(|e| self.text(e).map(|s| s.value))
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
                    self.only_props(child, USER_PROPS);
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
                    self.only_props(child, RLIMIT_PROPS);
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

    /// A size limit's value (`memory`, `disk`): bytes, or `None` for `"unlimited"`; an error
    /// at its span (and `None` returned) when it is no size or out of `min..=max`.
    fn size_limit(
        &mut self,
        e: &KdlEntry,
        which: &str,
        min: u64,
        max: u64,
        eg: &str,
        eg2: &str,
    ) -> Option<Option<u64>> {
        let bytes = match e.value() {
            KdlValue::String(s) if s == "unlimited" => Some(None),
            KdlValue::String(s) => parse_size(s).map(Some),
            KdlValue::Integer(i) if *i > 0 => Some(Some(u64::try_from(*i).unwrap_or(u64::MAX))),
            _ => None,
        };
        let help = format!(
            "write e.g. `{which} \"{eg}\"` or `\"{eg2}\"` (between {}M and {}T), or `\"unlimited\"`",
            min >> 20,
            max >> 40
        );
        match bytes {
            Some(Some(b)) if !(min..=max).contains(&b) => {
                self.err(
                    e.span(),
                    format!("a {which} limit of {b} bytes is out of range"),
                    "out of range",
                    Some(help),
                );
                None
            }
            Some(v) => Some(v),
            None => {
                self.err(
                    e.span(),
                    match e.value() {
                        KdlValue::String(s) => format!("invalid {which} size `{s}`"),
                        KdlValue::Integer(i) => {
                            format!("a {which} limit of {i} bytes is out of range")
                        }
                        other => format!("expected a {which} size, found {}", kind_of(other)),
                    },
                    "bad size",
                    Some(help),
                );
                None
            }
        }
    }

    pub(super) fn limits(&mut self, node: &KdlNode, l: &mut LimitsCfg) {
        self.only_props(node, &[]);
        self.args(node, 0, 0, "");
        for child in self.children(node, LIMITS_CHILDREN) {
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
                    if let Some(v) =
                        self.size_limit(e, "memory", MEMORY_MIN, MEMORY_MAX, "8G", "512M")
                    {
                        l.memory = Some(Spanned::new(v, loc));
                    }
                }
                "disk" => {
                    if let Some(v) = self.size_limit(e, "disk", DISK_MIN, DISK_MAX, "20G", "2G") {
                        l.disk = Some(Spanned::new(v, loc));
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
}
