//! sandbox.kdl projects built from the fuzzer's bytes: a root file and up to three files it
//! imports (one in a subdirectory), and a dotenv file, all valid KDL made of the language's own
//! nodes (src/config/decode.rs), properties and values, nested as the language nests them:
//! profiles that extend each other, tasks, images, imports that cycle. Each value is usually
//! one the node takes and sometimes any value at all, so that decode's and eval's checks are
//! reached as well as the paths behind them.

use std::fmt::Write;
use std::marker::PhantomData;

use arbitrary::Arbitrary;

/// A KDL value of any type.
#[derive(Arbitrary, Debug)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Null,
    Float(f64),
}

impl Value {
    fn render(&self, out: &mut String) {
        match self {
            Value::Str(s) => quote(s, out),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::Bool(b) => out.push_str(if *b { "#true" } else { "#false" }),
            Value::Null => out.push_str("#null"),
            Value::Float(f) if f.is_nan() => out.push_str("#nan"),
            Value::Float(f) if f.is_infinite() => {
                out.push_str(if *f > 0.0 { "#inf" } else { "#-inf" })
            }
            Value::Float(f) => {
                let _ = write!(out, "{f:?}");
            }
        }
    }
}

/// A KDL v2 quoted string: what is not plain printable text is escaped.
pub fn quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c == ' ' || c.is_ascii_graphic() || (c.is_alphanumeric() && !c.is_ascii()) => {
                out.push(c)
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    out.push('"');
}

/// A value drawn from a node's vocabulary (KDL source text), or now and then any value.
pub trait Vocab {
    const WORDS: &'static [&'static str];
}

#[derive(Debug)]
pub struct W<T> {
    pick: u8,
    other: Option<Value>,
    _t: PhantomData<T>,
}

impl<'a, T> Arbitrary<'a> for W<T> {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        let pick = u8::arbitrary(u)?;
        // One in sixteen: any value, so that the type and range checks are reached too.
        let other = if pick % 16 == 15 {
            Some(Value::arbitrary(u)?)
        } else {
            None
        };
        Ok(W {
            pick,
            other,
            _t: PhantomData,
        })
    }
}

impl<T: Vocab> W<T> {
    fn render(&self, out: &mut String) {
        match &self.other {
            Some(v) => v.render(out),
            None => out.push_str(T::WORDS[self.pick as usize % T::WORDS.len()]),
        }
    }
}

/// A value from a vocabulary, never any other: for the few values where an arbitrary one
/// would make an input slow rather than interesting (`project "/"` walks the whole disk).
#[derive(Debug)]
pub struct Only<T> {
    pick: u8,
    _t: PhantomData<T>,
}

impl<'a, T> Arbitrary<'a> for Only<T> {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Only {
            pick: u8::arbitrary(u)?,
            _t: PhantomData,
        })
    }
}

impl<T: Vocab> Only<T> {
    fn render(&self, out: &mut String) {
        out.push_str(T::WORDS[self.pick as usize % T::WORDS.len()]);
    }
}

macro_rules! vocab {
    ($($name:ident: [$($w:expr),+ $(,)?];)+) => {$(
        #[derive(Debug)]
        pub struct $name;
        impl Vocab for $name {
            const WORDS: &'static [&'static str] = &[$($w),+];
        }
    )+};
}

vocab! {
    PathV: [r#"".""#, r#""/tmp""#, r#""~/.ssh""#, r#""$HOME/x""#, r#""${XDG_CACHE_HOME:-/c}""#,
        r#""$PROJECT""#, r#""/""#, r#""..""#, r#""../x""#, r#""sub""#, r#""/data""#, r#""$$""#,
        r#""${""#, r#""~""#, r#""/proc""#, r#""/run/aisb""#, r#""~/.claude""#, r#""$NOPE""#,
        r#""/etc/passwd""#, r#""sub/../..""#, r#""""#];
    ProjectV: [r#"".""#, r#""sub""#, r#""..""#, r#""sub/..""#, r#""missing""#,
        r#""$PROJECT""#, r#""""#, r#""./sub/""#];
    AccessV: [r#""rw""#, r#""ro""#, r#""overlay""#];
    HomeV: [r#""empty""#, r#""ro""#, r#""overlay""#];
    XdgV: [r#""home""#, r#""sandbox""#];
    PatternV: [r#""*.pem""#, r#""config/prod.yml""#, r#"".env""#, r#""secrets/""#,
        r#""~/.config/gcloud""#, r#""/etc/shadow""#, r#""a/[b""#, r#""**""#, r#""!x""#,
        r#"".env.agent""#, r#""sub/""#, r#""*""#];
    EnvNameV: [r#""CI""#, r#""HOME""#, r#""PATH""#, r#""A""#, r#""B""#, r#""GH_TOKEN""#,
        r#""MY_*""#, r#""AWS_*""#, r#""?""#, r#""1X""#, r#""A-B""#];
    EnvValueV: [r#""x""#, r#""$HOME""#, r#""${A:-b}""#, r#""$XDG_CACHE_HOME/app""#, r#""""#,
        r#""a b""#, r#""\u{0}""#];
    InheritV: [r#""all""#, r#""safe""#, r#""none""#];
    DomainV: [r#""example.com""#, r#""*.example.com""#, r#""*""#, r#""*.com""#,
        r#""a.com:443""#, r#""x.com:0""#, r#""[::1]:80""#, r#""10.0.0.1""#,
        r#""ëxample.com""#, r#""github.com""#, r#""a..b""#, r#""*.*.x.org""#];
    NetModeV: [r#""none""#, r#""host""#, r#""allow""#];
    DomainsModeV: [r#""merge""#, r#""strict""#, r#""replace""#];
    GroupV: [r#""github""#, r#""registries""#, r#""os-packages""#, r#""anthropic""#,
        r#""openai""#, r#""google""#, r#""corp""#, r#""nope""#];
    PortV: ["5432", "0", "70000", "-1", "22", r#""80""#];
    CommandV: [r#""bash""#, r#""-l""#, r#""true""#, r#""sh""#, r#""-c""#, r#""echo $HOME""#,
        r#""claude""#, r#""""#];
    RlimitV: [r#""nofile""#, r#""nproc""#, r#""core""#, r#""nope""#];
    LimitV: ["4096", "0", "-1", r#""unlimited""#, "18446744073709551615", r#""1k""#];
    IdV: ["0", "1000", "65534", "-1", "4294967295", "4294967296"];
    NameV: [r#""dev""#, r#""root""#, r#""""#, r#""a b""#, r#""sandbox""#, r#""x.y""#];
    SizeV: [r#""256M""#, r#""1G""#, r#""0""#, "1024", r#""-1""#, r#""99999999999G""#, r#""1.5K""#];
    BackendV: [r#""libcontainer""#, r#""bwrap""#, r#""nope""#];
    BoolV: ["#true", "#false"];
    ProfileV: [r#""investigate""#, r#""fix""#, r#""implement""#, r#""p0""#, r#""p1""#,
        r#""p2""#, r#""default""#, r#""review""#];
    ImageV: [r#""dev""#, r#""base""#, r#""missing""#];
    PresetV: [r#""preset:claude""#, r#""preset:codex""#, r#""preset:aider""#,
        r#""preset:opencode""#, r#""preset:gemini""#, r#""preset:default""#,
        r#""preset:profiles""#, r#""preset:nope""#];
    FromV: [r#""scratch""#, r#""oci:images/x:1""#, r#""debian:12""#, r#""oci-archive:x.tar""#,
        r#""docker.io/library/debian@sha256:00""#];
    StepTextV: [r#""apt-get update""#, r#""/opt/tools/""#, r#""tools/""#, r#""USER_NAME""#,
        r#""LANG""#, r#""C.UTF-8""#, r#""/work""#, r#""1000:1000""#, r#""/bin/sh""#, r#""-c""#];
    ModeV: [r#""0755""#, r#""0644""#, r#""7777""#, r#""17777""#, r#""9""#];
    WordV: [r#""test""#, r#""lint""#, r#""t""#, r#""a b""#, r#""""#];
    TextV: [r#""a description""#, r#""""#, r#""ünï""#];
}

#[derive(Arbitrary, Debug)]
pub struct Project {
    pub root: Doc,
    /// inc0.kdl, sub/inc1.kdl, inc2.kdl (those given).
    pub imported: Vec<Doc>,
    /// .env.agent, as `KEY=value` lines.
    pub dotenv: Vec<(W<EnvNameV>, W<EnvValueV>)>,
    pub profile: Option<W<ProfileV>>,
}

/// Where imported files live, relative to the project root.
pub const IMPORTED: [&str; 3] = ["inc0.kdl", "sub/inc1.kdl", "inc2.kdl"];

#[derive(Arbitrary, Debug)]
pub struct Doc {
    pub nodes: Vec<Top>,
}

#[derive(Arbitrary, Debug)]
pub enum Top {
    Import(Vec<ImportRef>),
    DefaultProfile(W<ProfileV>),
    Profile {
        name: W<ProfileV>,
        extends: Option<W<ProfileV>>,
        description: Option<W<TextV>>,
        body: Vec<Setting>,
    },
    Task {
        name: W<WordV>,
        description: Option<W<TextV>>,
        children: Vec<TaskChild>,
    },
    Domains(W<GroupV>, Vec<W<DomainV>>),
    Image {
        name: W<ImageV>,
        steps: Vec<Step>,
    },
    Setting(Setting),
    /// `/-`: the node is a comment.
    SlashDash(Box<Top>),
}

#[derive(Arbitrary, Debug)]
pub enum ImportRef {
    Preset(W<PresetV>),
    File(u8),
    Missing,
    /// The root file, from wherever: a cycle when the root imports the importer.
    Root,
}

#[derive(Arbitrary, Debug)]
pub enum TaskChild {
    Run(Vec<W<CommandV>>),
    Profile(W<ProfileV>),
    Cwd(W<PathV>),
    Env(W<EnvNameV>, W<EnvValueV>),
}

#[derive(Arbitrary, Debug)]
pub enum Step {
    From(W<FromV>),
    Arg(W<StepTextV>, Option<W<StepTextV>>),
    Env(W<StepTextV>, W<StepTextV>),
    Run(Vec<W<StepTextV>>),
    Copy {
        add: bool,
        srcs: Vec<W<StepTextV>>,
        chown: Option<W<StepTextV>>,
        chmod: Option<W<ModeV>>,
    },
    Workdir(W<StepTextV>),
    User(W<StepTextV>),
    Shell(Vec<W<StepTextV>>),
}

#[derive(Arbitrary, Debug)]
pub enum Setting {
    Project {
        root: Option<Only<ProjectV>>,
        access: Option<W<AccessV>>,
    },
    ReadOnly(W<BoolV>),
    Mount {
        source: W<PathV>,
        target: Option<W<PathV>>,
        access: Option<W<AccessV>>,
        optional: Option<W<BoolV>>,
    },
    Tmpfs {
        target: W<PathV>,
        size: Option<W<SizeV>>,
    },
    Home(W<HomeV>),
    Xdg(W<XdgV>),
    Block(Vec<W<PatternV>>),
    Allow(Vec<W<PatternV>>),
    Secrets(Vec<SecretsChild>),
    Env(Vec<EnvChild>),
    Network {
        mode: Option<W<NetModeV>>,
        domains: Option<W<DomainsModeV>>,
        rules: Option<Vec<NetRule>>,
    },
    Process(Vec<ProcessChild>),
    Backend(W<BackendV>),
    Rootfs {
        how: RootfsHow,
        network: Option<(Option<W<NetModeV>>, Vec<NetRule>)>,
    },
    /// A node the language does not have (a typo of one it has).
    Unknown(W<WordV>),
}

#[derive(Arbitrary, Debug)]
pub enum SecretsChild {
    Defaults(Option<W<BoolV>>),
    Gitignored(Option<W<BoolV>>),
    GitCrypt(Option<W<BoolV>>),
    ToolDirs(Vec<W<PatternV>>),
}

#[derive(Arbitrary, Debug)]
pub enum EnvChild {
    Inherit(W<InheritV>),
    FilterSecrets(Option<W<BoolV>>),
    Allow(Vec<W<EnvNameV>>),
    Deny(Vec<W<EnvNameV>>),
    Pass(Vec<W<EnvNameV>>),
    Set(W<EnvNameV>, W<EnvValueV>),
    /// `.env.agent` (written beside sandbox.kdl) or another path, then keys.
    FromFile(Option<W<PathV>>, Vec<W<EnvNameV>>),
}

#[derive(Arbitrary, Debug)]
pub enum NetRule {
    Allow(Vec<W<DomainV>>),
    Deny(Vec<W<DomainV>>),
    Group(Vec<W<GroupV>>),
    LocalhostPort(Vec<W<PortV>>),
}

#[derive(Arbitrary, Debug)]
pub enum ProcessChild {
    Command(Vec<W<CommandV>>),
    Cwd(W<PathV>),
    Shell(W<CommandV>),
    User {
        uid: Option<W<IdV>>,
        gid: Option<W<IdV>>,
        name: Option<W<NameV>>,
    },
    Rlimit {
        name: W<RlimitV>,
        value: Option<W<LimitV>>,
        soft: Option<W<LimitV>>,
        hard: Option<W<LimitV>>,
    },
    Hostname(W<NameV>),
}

#[derive(Arbitrary, Debug)]
pub enum RootfsHow {
    Host,
    Dockerfile,
    Image(W<ImageV>),
    From(W<FromV>),
    /// Two at once (an error).
    Both(W<ImageV>, W<FromV>),
}

/// Lists longer than this are cut: a document stays small enough to evaluate quickly.
const MAX_LIST: usize = 8;

struct Out {
    text: String,
    depth: usize,
    /// Whether the file being written lives in `sub/` (its imports go through `..`).
    in_sub: bool,
}

impl Out {
    fn open(&mut self, name: &str) {
        for _ in 0..self.depth {
            self.text.push_str("    ");
        }
        self.text.push_str(name);
    }
    fn arg(&mut self) -> &mut String {
        self.text.push(' ');
        &mut self.text
    }
    fn prop(&mut self, key: &str) -> &mut String {
        self.text.push(' ');
        self.text.push_str(key);
        self.text.push('=');
        &mut self.text
    }
    fn end(&mut self) {
        self.text.push('\n');
    }
    fn children(&mut self, body: impl FnOnce(&mut Out)) {
        self.text.push_str(" {\n");
        self.depth += 1;
        body(self);
        self.depth -= 1;
        for _ in 0..self.depth {
            self.text.push_str("    ");
        }
        self.text.push_str("}\n");
    }
    fn args<T: Vocab>(&mut self, name: &str, list: &[W<T>]) {
        self.open(name);
        for w in list.iter().take(MAX_LIST) {
            w.render(self.arg());
        }
        self.end();
    }
}

impl Doc {
    /// The document's text; `in_sub`: it is written in `sub/`.
    pub fn render(&self, in_sub: bool) -> String {
        let mut o = Out {
            text: String::new(),
            depth: 0,
            in_sub,
        };
        for n in self.nodes.iter().take(24) {
            n.render(&mut o);
        }
        o.text
    }
}

impl Top {
    fn render(&self, o: &mut Out) {
        match self {
            Top::Import(refs) => {
                o.open("import");
                for r in refs.iter().take(4) {
                    let up = if o.in_sub { "../" } else { "" };
                    let path = match r {
                        ImportRef::Preset(p) => {
                            p.render(o.arg());
                            continue;
                        }
                        ImportRef::File(i) => format!("{up}{}", IMPORTED[*i as usize % 3]),
                        ImportRef::Missing => "missing.kdl".into(),
                        ImportRef::Root => format!("{up}sandbox.kdl"),
                    };
                    quote(&path, o.arg());
                }
                o.end();
            }
            Top::DefaultProfile(p) => {
                o.open("default-profile");
                p.render(o.arg());
                o.end();
            }
            Top::Profile {
                name,
                extends,
                description,
                body,
            } => {
                o.open("profile");
                name.render(o.arg());
                if let Some(e) = extends {
                    e.render(o.prop("extends"));
                }
                if let Some(d) = description {
                    d.render(o.prop("description"));
                }
                o.children(|o| {
                    for s in body.iter().take(MAX_LIST) {
                        s.render(o);
                    }
                });
            }
            Top::Task {
                name,
                description,
                children,
            } => {
                o.open("task");
                name.render(o.arg());
                if let Some(d) = description {
                    d.render(o.prop("description"));
                }
                o.children(|o| {
                    for c in children.iter().take(MAX_LIST) {
                        match c {
                            TaskChild::Run(cmd) => o.args("run", cmd),
                            TaskChild::Profile(p) => o.args("profile", std::slice::from_ref(p)),
                            TaskChild::Cwd(p) => o.args("cwd", std::slice::from_ref(p)),
                            TaskChild::Env(k, v) => {
                                o.open("env");
                                k.render(o.arg());
                                v.render(o.arg());
                                o.end();
                            }
                        }
                    }
                });
            }
            Top::Domains(name, list) => {
                o.open("domains");
                name.render(o.arg());
                for d in list.iter().take(MAX_LIST) {
                    d.render(o.arg());
                }
                o.end();
            }
            Top::Image { name, steps } => {
                o.open("image");
                name.render(o.arg());
                o.children(|o| {
                    for s in steps.iter().take(MAX_LIST) {
                        s.render(o);
                    }
                });
            }
            Top::Setting(s) => s.render(o),
            Top::SlashDash(inner) => {
                let mut inner = inner;
                while let Top::SlashDash(i) = &**inner {
                    inner = i;
                }
                o.open("/- ");
                let depth = o.depth;
                o.depth = 0;
                inner.render(o);
                o.depth = depth;
            }
        }
    }
}

impl Step {
    fn render(&self, o: &mut Out) {
        match self {
            Step::From(f) => o.args("from", std::slice::from_ref(f)),
            Step::Arg(k, v) => {
                o.open("arg");
                k.render(o.arg());
                if let Some(v) = v {
                    v.render(o.arg());
                }
                o.end();
            }
            Step::Env(k, v) => {
                o.open("env");
                k.render(o.arg());
                v.render(o.arg());
                o.end();
            }
            Step::Run(a) => o.args("run", a),
            Step::Copy {
                add,
                srcs,
                chown,
                chmod,
            } => {
                o.open(if *add { "add" } else { "copy" });
                for s in srcs.iter().take(MAX_LIST) {
                    s.render(o.arg());
                }
                if let Some(c) = chown {
                    c.render(o.prop("chown"));
                }
                if let Some(m) = chmod {
                    m.render(o.prop("chmod"));
                }
                o.end();
            }
            Step::Workdir(w) => o.args("workdir", std::slice::from_ref(w)),
            Step::User(u) => o.args("user", std::slice::from_ref(u)),
            Step::Shell(a) => o.args("shell", a),
        }
    }
}

fn net_rules(o: &mut Out, rules: &[NetRule]) {
    for r in rules.iter().take(MAX_LIST) {
        match r {
            NetRule::Allow(d) => o.args("allow", d),
            NetRule::Deny(d) => o.args("deny", d),
            NetRule::Group(g) => o.args("group", g),
            NetRule::LocalhostPort(p) => o.args("localhost-port", p),
        }
    }
}

impl Setting {
    fn render(&self, o: &mut Out) {
        match self {
            Setting::Project { root, access } => {
                o.open("project");
                if let Some(r) = root {
                    r.render(o.arg());
                }
                if let Some(a) = access {
                    a.render(o.prop("access"));
                }
                o.end();
            }
            Setting::ReadOnly(b) => o.args("read-only", std::slice::from_ref(b)),
            Setting::Mount {
                source,
                target,
                access,
                optional,
            } => {
                o.open("mount");
                source.render(o.arg());
                if let Some(t) = target {
                    t.render(o.arg());
                }
                if let Some(a) = access {
                    a.render(o.prop("access"));
                }
                if let Some(b) = optional {
                    b.render(o.prop("optional"));
                }
                o.end();
            }
            Setting::Tmpfs { target, size } => {
                o.open("tmpfs");
                target.render(o.arg());
                if let Some(s) = size {
                    s.render(o.prop("size"));
                }
                o.end();
            }
            Setting::Home(h) => o.args("home", std::slice::from_ref(h)),
            Setting::Xdg(x) => o.args("xdg", std::slice::from_ref(x)),
            Setting::Block(p) => o.args("block", p),
            Setting::Allow(p) => o.args("allow", p),
            Setting::Secrets(children) => {
                o.open("secrets");
                o.children(|o| {
                    for c in children.iter().take(MAX_LIST) {
                        let (name, b) = match c {
                            SecretsChild::Defaults(b) => ("defaults", b),
                            SecretsChild::Gitignored(b) => ("gitignored", b),
                            SecretsChild::GitCrypt(b) => ("git-crypt", b),
                            SecretsChild::ToolDirs(p) => {
                                o.args("tool-dirs", p);
                                continue;
                            }
                        };
                        o.open(name);
                        if let Some(b) = b {
                            b.render(o.arg());
                        }
                        o.end();
                    }
                });
            }
            Setting::Env(children) => {
                o.open("env");
                o.children(|o| {
                    for c in children.iter().take(MAX_LIST) {
                        match c {
                            EnvChild::Inherit(i) => o.args("inherit", std::slice::from_ref(i)),
                            EnvChild::FilterSecrets(b) => {
                                o.open("filter-secrets");
                                if let Some(b) = b {
                                    b.render(o.arg());
                                }
                                o.end();
                            }
                            EnvChild::Allow(n) => o.args("allow", n),
                            EnvChild::Deny(n) => o.args("deny", n),
                            EnvChild::Pass(n) => o.args("pass", n),
                            EnvChild::Set(k, v) => {
                                o.open("set");
                                k.render(o.arg());
                                v.render(o.arg());
                                o.end();
                            }
                            EnvChild::FromFile(path, keys) => {
                                o.open("from-file");
                                match path {
                                    Some(p) => p.render(o.arg()),
                                    None => quote(
                                        if o.in_sub {
                                            "../.env.agent"
                                        } else {
                                            ".env.agent"
                                        },
                                        o.arg(),
                                    ),
                                }
                                for k in keys.iter().take(MAX_LIST) {
                                    k.render(o.arg());
                                }
                                o.end();
                            }
                        }
                    }
                });
            }
            Setting::Network {
                mode,
                domains,
                rules,
            } => {
                o.open("network");
                if let Some(m) = mode {
                    m.render(o.arg());
                }
                if let Some(d) = domains {
                    d.render(o.prop("domains"));
                }
                match rules {
                    Some(r) => o.children(|o| net_rules(o, r)),
                    None => o.end(),
                }
            }
            Setting::Process(children) => {
                o.open("process");
                o.children(|o| {
                    for c in children.iter().take(MAX_LIST) {
                        match c {
                            ProcessChild::Command(a) => o.args("command", a),
                            ProcessChild::Cwd(p) => o.args("cwd", std::slice::from_ref(p)),
                            ProcessChild::Shell(s) => o.args("shell", std::slice::from_ref(s)),
                            ProcessChild::User { uid, gid, name } => {
                                o.open("user");
                                if let Some(u) = uid {
                                    u.render(o.prop("uid"));
                                }
                                if let Some(g) = gid {
                                    g.render(o.prop("gid"));
                                }
                                if let Some(n) = name {
                                    n.render(o.prop("name"));
                                }
                                o.end();
                            }
                            ProcessChild::Rlimit {
                                name,
                                value,
                                soft,
                                hard,
                            } => {
                                o.open("rlimit");
                                name.render(o.arg());
                                if let Some(v) = value {
                                    v.render(o.arg());
                                }
                                if let Some(s) = soft {
                                    s.render(o.prop("soft"));
                                }
                                if let Some(h) = hard {
                                    h.render(o.prop("hard"));
                                }
                                o.end();
                            }
                            ProcessChild::Hostname(n) => {
                                o.args("hostname", std::slice::from_ref(n))
                            }
                        }
                    }
                });
            }
            Setting::Backend(b) => o.args("backend", std::slice::from_ref(b)),
            Setting::Rootfs { how, network } => {
                o.open("rootfs");
                match how {
                    RootfsHow::Host => quote("host", o.arg()),
                    RootfsHow::Dockerfile => quote("Dockerfile", o.prop("dockerfile")),
                    RootfsHow::Image(i) => i.render(o.prop("image")),
                    RootfsHow::From(f) => f.render(o.prop("from")),
                    RootfsHow::Both(i, f) => {
                        i.render(o.prop("image"));
                        f.render(o.prop("from"));
                    }
                }
                match network {
                    Some((mode, rules)) => o.children(|o| {
                        o.open("network");
                        if let Some(m) = mode {
                            m.render(o.arg());
                        }
                        if rules.is_empty() {
                            o.end();
                        } else {
                            o.children(|o| net_rules(o, rules));
                        }
                    }),
                    None => o.end(),
                }
            }
            Setting::Unknown(w) => {
                // A near miss of a real node name, so the suggestion code runs.
                let name = ["porject", "mounts", "netwrok", "envv", "x"][w.pick as usize % 5];
                o.open(name);
                w.render(o.arg());
                o.end();
            }
        }
    }
}

impl Project {
    /// `KEY=value` lines for `.env.agent`, in the forms dotenv files take.
    pub fn dotenv_text(&self) -> String {
        let mut s = String::new();
        for (i, (k, v)) in self.dotenv.iter().take(MAX_LIST).enumerate() {
            let mut key = String::new();
            k.render(&mut key);
            let mut value = String::new();
            v.render(&mut value);
            let key = key.trim_matches('"');
            let value = value.trim_matches('"');
            let _ = match i % 4 {
                0 => writeln!(s, "{key}={value}"),
                1 => writeln!(s, "export {key} = \"{value}\""),
                2 => writeln!(s, "# comment\n{key}='{value}'"),
                _ => writeln!(s, "  {key}={value}  "),
            };
        }
        s
    }

    pub fn profile_name(&self) -> Option<String> {
        self.profile.as_ref().map(|p| {
            let mut s = String::new();
            p.render(&mut s);
            s.trim_matches('"').to_string()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Projects from pseudo-random bytes (xorshift, fixed seed).
    fn projects(n: usize, len: usize) -> Vec<Project> {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        (0..n)
            .filter_map(|_| {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed as u8
                    })
                    .collect();
                Project::arbitrary(&mut arbitrary::Unstructured::new(&bytes)).ok()
            })
            .collect()
    }

    /// Every document the generator writes is KDL that kdl-rs parses, whatever the bytes.
    #[test]
    fn documents_parse_as_kdl() {
        let mut parsed = 0;
        for p in projects(2000, 512) {
            for (doc, sub) in std::iter::once((&p.root, false)).chain(
                p.imported
                    .iter()
                    .take(3)
                    .enumerate()
                    .map(|(i, d)| (d, i == 1)),
            ) {
                let text = doc.render(sub);
                if let Err(e) = text.parse::<kdl::KdlDocument>() {
                    panic!("{e:?}\n{text}");
                }
                parsed += 1;
            }
        }
        assert!(parsed > 1000, "{parsed}");
    }

    /// The point of generating documents: many get through decoding and imports without an
    /// error, and evaluation then runs (and often succeeds) on them.
    #[test]
    fn many_projects_reach_evaluation() {
        let f = crate::fixture::fixture();
        let (mut clean, mut planned, mut total) = (0, 0, 0);
        for p in projects(400, 256) {
            total += 1;
            let root = f.proj.join("sandbox.kdl");
            std::fs::write(&root, p.root.render(false)).unwrap();
            for (i, name) in IMPORTED.iter().enumerate() {
                let path = f.proj.join(name);
                match p.imported.get(i) {
                    Some(doc) => {
                        std::fs::write(&path, doc.render(name.starts_with("sub/"))).unwrap()
                    }
                    None => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            std::fs::write(f.proj.join(".env.agent"), p.dotenv_text()).unwrap();
            let mut errors = aisb::config::Errors::default();
            let Ok(loaded) = aisb::eval::load(aisb::eval::Root::File(root), &mut errors) else {
                continue;
            };
            if !errors.is_empty() {
                continue;
            }
            clean += 1;
            let req = aisb::eval::Request {
                profile: p.profile_name(),
                ..Default::default()
            };
            if aisb::eval::evaluate(&loaded, &f.host, &req).is_ok() {
                planned += 1;
            }
        }
        eprintln!(
            "{total} projects: {clean} decoded without an error, {planned} evaluated to a plan"
        );
        assert!(clean * 5 > total, "{clean} of {total}");
        assert!(planned * 10 > total, "{planned} of {total}");
    }
}
