use crate::runtime::rootless;
use crate::Error;

/// One-time root step so USER can run the libcontainer backend rootless
///
/// Gives USER subordinate ids (/etc/subuid, /etc/subgid) when they have none, and on cgroup v1
/// hosts a cgroup they own in every controller hierarchy (`<hierarchy>/aisb/user-<uid>`), in
/// which their sandboxes' cgroups are created. Safe to run again: it does only what is missing.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  sudo aisb setup-user alice\n  sudo aisb setup-user \"$USER\"")]
pub struct Args {
    /// The account to set up
    pub user: String,
}

pub fn run(a: Args) -> Result<i32, Error> {
    let done = rootless::setup_user(&a.user)?;
    if done.is_empty() {
        eprintln!(
            "{} is already set up for rootless libcontainer runs and image builds",
            a.user
        );
    }
    for line in done {
        eprintln!("{line}");
    }
    Ok(0)
}
