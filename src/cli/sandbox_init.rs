use std::ffi::OsString;

use crate::init::{self, Options};
use crate::Error;

/// The sandbox's init (runs inside the sandbox; not for direct use)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Bring the loopback interface up
    #[arg(long)]
    pub loopback: bool,
    /// RLIMIT_NAME=SOFT:HARD
    #[arg(long = "rlimit", value_parser = parse_rlimit)]
    pub rlimits: Vec<(String, u64, u64)>,
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

fn parse_rlimit(s: &str) -> Result<(String, u64, u64), String> {
    let (name, limits) = s.split_once('=').ok_or("expected NAME=SOFT:HARD")?;
    let (soft, hard) = limits.split_once(':').ok_or("expected NAME=SOFT:HARD")?;
    let n = |v: &str| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
    Ok((name.to_string(), n(soft)?, n(hard)?))
}

pub fn run(a: Args) -> Result<i32, Error> {
    let opts = Options {
        loopback: a.loopback,
        rlimits: a.rlimits,
        command: a.command,
    };
    // 125: the sandbox could not start (distinct from any exit code of the workload's own).
    match init::run(&opts) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("{:?}", miette::Report::new(Error::Init(e)));
            Ok(125)
        }
    }
}
