use crate::Error;

/// List the built-in presets, or print one
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  aisb presets\n  aisb presets claude")]
pub struct Args {
    /// Print this preset's KDL
    pub name: Option<String>,
}

pub fn run(a: Args) -> Result<i32, Error> {
    match a.name {
        None => {
            for n in crate::presets::names().filter(|n| *n != "default") {
                println!("{n}");
            }
        }
        Some(n) => match crate::presets::get(&n) {
            Some(text) => print!("{text}"),
            None => {
                return Err(Error::UnknownPreset {
                    hint: crate::config::diag::suggest(&n, crate::presets::names())
                        .map(str::to_string),
                    name: n,
                })
            }
        },
    }
    Ok(0)
}
