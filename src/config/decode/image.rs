//! An `image` block: the build steps written in KDL, decoded to the instructions a
//! `Dockerfile` would give.

use kdl::KdlNode;

use super::Decoder;
use crate::config::model::*;
use crate::config::schema::*;

impl Decoder<'_> {
    /// `image "NAME" { from "…"; arg "K" "default"; env "K" "V"; run "…"; copy "SRC"… "DEST"
    /// chown=… chmod="0644"; add …; workdir "…"; user "…"; shell "…"… }`
    pub(super) fn image(&mut self, node: &KdlNode) -> Option<ImageDecl> {
        use crate::config::instr::{Cmd, Instr, Step};
        self.only_props(node, &[]);
        let name = self
            .args(node, 1, 1, "the image's name")
            .first()
            .and_then(|e| self.string(e))?;
        let file = self.sources[self.file].name.clone();
        let mut steps = Vec::new();
        let mut froms = 0;
        for child in self.children(node, IMAGE_CHILDREN) {
            let kind = child.name().value();
            let (line, _) = self.sources[self.file].line_col(child.span().offset());
            let at = format!("{file}:{line}");
            // Commands and values may span lines; everything else is one line (names, paths).
            let multi_line = matches!(kind, "run" | "env" | "shell");
            let strings =
                |d: &mut Self, min: usize, max: usize, what: &str| -> Option<Vec<String>> {
                    let es = d.args(child, min, max, what);
                    let v: Vec<String> = es
                        .iter()
                        .filter_map(|e| {
                            if multi_line {
                                d.text(e).map(|s| s.value)
                            } else {
                                d.string(e).map(|s| s.value)
                            }
                        })
                        .collect();
                    (v.len() == es.len() && v.len() >= min).then_some(v)
                };
            let props: &[&str] = if matches!(kind, "copy" | "add") {
                COPY_PROPS
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
}
