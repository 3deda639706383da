use crate::Error;

/// List the built-in presets, or print one
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb presets\n  aisb presets show claude\n  aisb presets claude"
)]
pub struct Args {
    /// `show NAME` (or just NAME): print that preset's KDL
    #[arg(num_args = 0..=2, value_name = "[show] NAME")]
    pub args: Vec<String>,
}

pub fn run(a: Args) -> Result<i32, Error> {
    let name = match a.args.as_slice() {
        [] => None,
        [show, name] if show == "show" => Some(name.clone()),
        [name] => Some(name.clone()),
        _ => return Err(Error::Usage("usage: aisb presets [show] NAME".into())),
    };
    match name {
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
