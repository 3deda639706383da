//! The language's vocabulary in one place: which nodes exist where, and their properties,
//! children and values. The decoder checks sandbox.kdl against these tables (an unknown name
//! is an error with the closest known one as a suggestion); the language server (`aisb lsp`)
//! completes from the same tables, so the two can never disagree.

use super::decode::BACKENDS;
use super::model::{Access, DomainsMode, HomeMode, Inherit, NetMode, XdgMode};

/// Nodes only the top level of a file has.
pub const TOP_NODES: &[&str] = &[
    "import",
    "default-profile",
    "profile",
    "task",
    "domains",
    "image",
];
/// Settings: at the top level and inside `profile`.
pub const SETTINGS_NODES: &[&str] = &[
    "project",
    "read-only",
    "mount",
    "tmpfs",
    "home",
    "xdg",
    "block",
    "allow",
    "unprotect",
    "secrets",
    "env",
    "network",
    "process",
    "limits",
    "tools",
    "backend",
    "rootfs",
    "credential",
];
pub const PROFILE_PROPS: &[&str] = &["extends", "description"];
pub const TASK_PROPS: &[&str] = &["description"];
pub const TASK_CHILDREN: &[&str] = &["run", "profile", "cwd", "env"];
pub const IMAGE_CHILDREN: &[&str] = &[
    "from", "arg", "env", "run", "copy", "add", "workdir", "user", "shell",
];
pub const COPY_PROPS: &[&str] = &["chown", "chmod"];
pub const ROOTFS_PROPS: &[&str] = &["dockerfile", "image", "from"];
pub const ROOTFS_CHILDREN: &[&str] = &["network"];
pub const PROJECT_PROPS: &[&str] = &["access"];
pub const MOUNT_PROPS: &[&str] = &["access", "optional"];
pub const HOME_PROPS: &[&str] = &["toolchains"];
pub const TMPFS_PROPS: &[&str] = &["size"];
pub const SECRETS_CHILDREN: &[&str] = &[
    "defaults",
    "gitignored",
    "git-crypt",
    "tool-dirs",
    "dependency-dirs",
    "not-dependency-dirs",
    "write-through",
];
pub const ENV_CHILDREN: &[&str] = &[
    "inherit",
    "filter-secrets",
    "allow",
    "deny",
    "pass",
    "set",
    "from-file",
];
pub const NETWORK_PROPS: &[&str] = &["domains", "transparent"];
pub const NETWORK_CHILDREN: &[&str] = &["allow", "deny", "group", "localhost-port"];
pub const PROCESS_CHILDREN: &[&str] = &["command", "cwd", "shell", "user", "rlimit", "hostname"];
pub const USER_PROPS: &[&str] = &["uid", "gid", "name"];
pub const RLIMIT_PROPS: &[&str] = &["soft", "hard"];
pub const LIMITS_CHILDREN: &[&str] = &["pids", "memory", "cpus", "disk"];
pub const TOOLS_CHILDREN: &[&str] = &["allow", "deny"];
pub const CREDENTIAL_PROPS: &[&str] = &["env"];
pub const CREDENTIAL_CHILDREN: &[&str] =
    &["from", "hosts", "header", "allow-request", "deny-request"];
pub const CREDENTIAL_FROM_PROPS: &[&str] = &["env", "file", "command"];
pub const HEADER_PROPS: &[&str] = &["scheme"];
const BOOLS: &[&str] = &["#true", "#false"];

/// What may appear on a node, found by its path of node names from the top of the file
/// (`["profile", "network"]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    pub props: &'static [&'static str],
    pub children: &'static [&'static str],
    /// Values of its first argument, when they are a closed set.
    pub values: &'static [&'static str],
    /// Values of each property that has a closed set.
    pub prop_values: &'static [(&'static str, &'static [&'static str])],
}

/// The names valid as children of the node at `path` (`[]`: the top level).
pub fn children_at(path: &[&str]) -> Vec<&'static str> {
    match path {
        [] => TOP_NODES.iter().chain(SETTINGS_NODES).copied().collect(),
        ["profile"] => SETTINGS_NODES.to_vec(),
        _ => shape(path).map(|s| s.children.to_vec()).unwrap_or_default(),
    }
}

/// The shape of the node at `path`; None for a name that is not valid there.
pub fn shape(path: &[&str]) -> Option<Shape> {
    let (last, parents) = path.split_last()?;
    let parent_ok = match parents {
        [] => true,
        ["profile"] => SETTINGS_NODES.contains(last),
        _ => children_at(parents).contains(last),
    };
    if !parent_ok {
        return None;
    }
    let in_image = parents.last() == Some(&"image");
    let in_task = parents.last() == Some(&"task");
    let s = |props, children, values| Shape {
        props,
        children,
        values,
        prop_values: &[],
    };
    Some(match *last {
        _ if in_image => match *last {
            "copy" | "add" => s(COPY_PROPS, &[], &[]),
            _ => Shape::default(),
        },
        _ if in_task => Shape::default(),
        "profile" => s(PROFILE_PROPS, SETTINGS_NODES, &[]),
        "task" => s(TASK_PROPS, TASK_CHILDREN, &[]),
        "image" => s(&[], IMAGE_CHILDREN, &[]),
        "rootfs" => s(ROOTFS_PROPS, ROOTFS_CHILDREN, &["host"]),
        "project" => Shape {
            prop_values: &[("access", &Access::NAMES)],
            ..s(PROJECT_PROPS, &[], &[])
        },
        "mount" => Shape {
            prop_values: &[("access", &Access::NAMES), ("optional", BOOLS)],
            ..s(MOUNT_PROPS, &[], &[])
        },
        "tmpfs" => s(TMPFS_PROPS, &[], &[]),
        "home" => Shape {
            prop_values: &[("toolchains", BOOLS)],
            ..s(HOME_PROPS, &[], &HomeMode::NAMES)
        },
        "xdg" => s(&[], &[], &XdgMode::NAMES),
        "read-only" => s(&[], &[], BOOLS),
        "backend" => s(&[], &[], &BACKENDS),
        "secrets" => s(&[], SECRETS_CHILDREN, &[]),
        "defaults" | "gitignored" | "git-crypt" | "filter-secrets" => s(&[], &[], BOOLS),
        "env" => s(&[], ENV_CHILDREN, &[]),
        "inherit" => s(&[], &[], &Inherit::NAMES),
        "network" => Shape {
            prop_values: &[("domains", &DomainsMode::NAMES), ("transparent", BOOLS)],
            ..s(NETWORK_PROPS, NETWORK_CHILDREN, &NET_VALUES)
        },
        "process" => s(&[], PROCESS_CHILDREN, &[]),
        "user" => s(USER_PROPS, &[], &[]),
        "rlimit" => s(RLIMIT_PROPS, &[], &[]),
        "limits" => s(&[], LIMITS_CHILDREN, &[]),
        "tools" => s(&[], TOOLS_CHILDREN, &[]),
        "credential" => s(CREDENTIAL_PROPS, CREDENTIAL_CHILDREN, &[]),
        "from" => s(CREDENTIAL_FROM_PROPS, &[], &[]),
        "header" => Shape {
            prop_values: &[("scheme", &crate::config::credential::Scheme::NAMES)],
            ..s(HEADER_PROPS, &[], &[])
        },
        _ => Shape::default(),
    })
}

/// `network "none"` and `network "host"` (`allow` is what a block means, not a value).
const NET_VALUES: [&str; 2] = [NetMode::NAMES[0], NetMode::NAMES[2]];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_the_nesting() {
        assert!(children_at(&[]).contains(&"import"));
        assert!(!children_at(&["profile"]).contains(&"import"));
        assert_eq!(children_at(&["profile", "network"]), NETWORK_CHILDREN);
        assert_eq!(shape(&["home"]).unwrap().values, HomeMode::NAMES);
        assert!(shape(&["profile", "task"]).is_none());
        assert_eq!(shape(&["image", "copy"]).unwrap().props, COPY_PROPS);
    }
}
