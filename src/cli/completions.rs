use clap::CommandFactory;

use crate::Error;

/// Print shell completions
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb completions bash > /etc/bash_completion.d/aisb\n  aisb completions fish > ~/.config/fish/completions/aisb.fish"
)]
pub struct Args {
    pub shell: clap_complete::Shell,
}

pub fn run(a: Args) -> Result<i32, Error> {
    clap_complete::generate(
        a.shell,
        &mut super::Cli::command(),
        "aisb",
        &mut std::io::stdout(),
    );
    Ok(0)
}
