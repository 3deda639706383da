use super::Global;
use crate::config::{ConfigError, SourceFile};
use crate::eval::{self, EvalError, Host};
use crate::Error;

/// Validate sandbox.kdl: syntax, every profile, every task
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb check\n  aisb check sandbox.kdl.example other.kdl\n  aisb check --format short     # file:line:col: error: … for problem matchers\n  aisb check --format json\n  aisb check --format github    # GitHub Actions annotations on the file's lines\n\nExit status: 0 when every file is valid, 1 when one has errors, 2 on a usage error."
)]
pub struct Args {
    /// The files to check (default: sandbox.kdl in this directory or a parent, or `-f`'s)
    #[arg(value_name = "FILE")]
    pub files: Vec<std::path::PathBuf>,
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    /// Rendered diagnostics with the source and a help line
    Human,
    /// `file:line:col: error: message`, one per line
    Short,
    /// A JSON array of diagnostics
    Json,
    /// GitHub Actions workflow commands (`::error file=…,line=…,col=…::message`), shown as
    /// annotations on the pull request's lines
    Github,
}

/// Evaluate the top level and every profile, collecting every configuration error once.
pub fn collect(
    g: &Global,
    host: &Host,
) -> Result<(Vec<SourceFile>, Vec<ConfigError>, usize, usize), Error> {
    let (loaded, errors) = g.load_with_errors(host)?;
    let mut all = errors.list;
    let profiles = eval::profile_names(&loaded);
    if all.is_empty() {
        for p in std::iter::once(None).chain(profiles.iter().map(|p| Some(p.clone()))) {
            let req = g.request(p, vec![]);
            match eval::evaluate(&loaded, host, &req) {
                Ok(plan) => {
                    super::evaluated(plan);
                }
                Err(EvalError::Config(c)) => {
                    for e in c.errors {
                        if !all
                            .iter()
                            .any(|x| x.file == e.file && x.span == e.span && x.message == e.message)
                        {
                            all.push(e);
                        }
                    }
                }
                Err(other) => return Err(Error::Eval(other)),
            }
        }
    }
    let root = loaded.root;
    Ok((loaded.sources, all, profiles.len(), root))
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let files: Vec<Option<std::path::PathBuf>> = if a.files.is_empty() {
        vec![None]
    } else {
        a.files.into_iter().map(Some).collect()
    };
    let mut json = Vec::new();
    let mut failed = false;
    for file in files {
        let g = g.with_file(file)?;
        let (sources, errors, n_profiles, root) = collect(&g, &host)?;
        failed |= !errors.is_empty();
        match a.format {
            Format::Json => json.extend(errors.iter().map(|e| e.to_json(&sources))),
            Format::Short => {
                for e in &errors {
                    println!("{}", e.to_short(&sources));
                }
            }
            Format::Github => {
                for e in &errors {
                    let j = e.to_json(&sources);
                    let file = crate::ci::repo_relative(&j.file);
                    let at = crate::ci::At {
                        file: Some(&file),
                        line: Some(j.line),
                        col: Some(j.column),
                        end_line: Some(j.end_line),
                        end_col: Some(j.end_column),
                    };
                    let message = match &j.help {
                        Some(h) => format!("{} ({})\nhelp: {h}", j.message, j.label),
                        None => format!("{} ({})", j.message, j.label),
                    };
                    println!(
                        "{}",
                        crate::ci::annotation("error", &at, "aisb check", &message)
                    );
                }
                if errors.is_empty() {
                    let name = sources.get(root).map_or("<none>", |s| s.name.as_str());
                    println!("{name}: ok ({n_profiles} profiles)");
                }
            }
            Format::Human if errors.is_empty() => {
                let name = sources.get(root).map_or("<none>", |s| s.name.as_str());
                eprintln!("{name}: ok ({n_profiles} profiles)");
            }
            Format::Human => {
                let e = Error::Config(crate::config::ConfigErrors::new(errors));
                eprintln!("{:?}", miette::Report::new(e));
            }
        }
    }
    if let Format::Json = a.format {
        println!(
            "{}",
            serde_json::to_string_pretty(&json).unwrap_or_default()
        );
    }
    Ok(if failed { crate::exit::CONFIG } else { 0 })
}
