//! Image build instructions, as written in a `Dockerfile` or in a `sandbox.kdl` `image` block:
//! the decoded form both share, before variables are expanded. `image` builds from them.

use serde::{Deserialize, Serialize};

/// A `RUN`'s command: shell form (run by the image's `SHELL`) or exec form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cmd {
    Shell(String),
    Exec(Vec<String>),
}

/// One instruction, as written (variables not expanded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Instr {
    From(String),
    Arg(String, Option<String>),
    Env(Vec<(String, String)>),
    Run(Cmd),
    Copy {
        srcs: Vec<String>,
        dest: String,
        chown: Option<String>,
        chmod: Option<u32>,
        add: bool,
    },
    Workdir(String),
    User(String),
    Shell(Vec<String>),
}

/// An instruction and where it was written (`Dockerfile:3`, `sandbox.kdl:12`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub instr: Instr,
    pub at: String,
}

impl Instr {
    /// The instruction as one line, for display (`RUN apt-get …`).
    pub fn display(&self) -> String {
        match self {
            Instr::From(r) => format!("FROM {r}"),
            Instr::Arg(k, Some(v)) => format!("ARG {k}={v}"),
            Instr::Arg(k, None) => format!("ARG {k}"),
            Instr::Env(kv) => format!(
                "ENV {}",
                kv.iter()
                    .map(|(k, v)| format!("{k}={v:?}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Instr::Run(Cmd::Shell(s)) => format!("RUN {s}"),
            Instr::Run(Cmd::Exec(a)) => format!("RUN {a:?}"),
            Instr::Copy {
                srcs, dest, add, ..
            } => format!(
                "{} {} {dest}",
                if *add { "ADD" } else { "COPY" },
                srcs.join(" ")
            ),
            Instr::Workdir(w) => format!("WORKDIR {w}"),
            Instr::User(u) => format!("USER {u}"),
            Instr::Shell(s) => format!("SHELL {s:?}"),
        }
    }
}
