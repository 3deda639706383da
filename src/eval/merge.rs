//! Profile inheritance and merging.
//!
//! Rules (also in `sandbox.kdl.example`):
//! - scalars (`project`, `home`, `read-only`, `env inherit`, `network` mode, `process` fields,
//!   each of `limits`' `pids`, `memory`, `cpus`):
//!   the child's value replaces the parent's;
//! - lists (`mount`, `tmpfs`, `block`, `allow`, `tool-dirs`, env `allow`/`deny`/`pass`/`set`,
//!   network `allow`/`deny`/`group`/`localhost-port`, `rlimit`, `tools` `allow`/`deny`): the
//!   child's entries are appended; for mounts, env `set` and rlimits a later entry for the same target/name wins;
//! - `block` and `tools deny` can never be removed, and the masking layers (`secrets defaults`, `gitignored`,
//!   `git-crypt`) can only be turned off in the top-level settings, never by a profile.

use crate::config::model::Settings;
use crate::config::{Errors, SourceFile, Spanned};

/// Merge `over` (a profile, or an imported file's top level when `is_profile` is false) into
/// `base`.
pub fn merge(
    base: &mut Settings,
    over: &Settings,
    is_profile: bool,
    sources: &[SourceFile],
    errors: &mut Errors,
) {
    fn scalar<T: Clone>(b: &mut Option<T>, o: &Option<T>) {
        if o.is_some() {
            b.clone_from(o);
        }
    }
    scalar(&mut base.backend, &over.backend);
    scalar(&mut base.rootfs, &over.rootfs);
    scalar(&mut base.build_network, &over.build_network);
    scalar(&mut base.project.root, &over.project.root);
    scalar(&mut base.project.access, &over.project.access);
    scalar(&mut base.read_only, &over.read_only);
    scalar(&mut base.home, &over.home);
    scalar(&mut base.toolchains, &over.toolchains);
    scalar(&mut base.xdg, &over.xdg);
    base.mounts.extend(over.mounts.iter().cloned());
    base.tmpfs.extend(over.tmpfs.iter().cloned());
    base.block.extend(over.block.iter().cloned());
    base.allow.extend(over.allow.iter().cloned());
    base.unprotect.extend(over.unprotect.iter().cloned());

    for (b, o, name) in [
        (
            &mut base.secrets.defaults,
            &over.secrets.defaults,
            "defaults",
        ),
        (
            &mut base.secrets.gitignored,
            &over.secrets.gitignored,
            "gitignored",
        ),
        (
            &mut base.secrets.git_crypt,
            &over.secrets.git_crypt,
            "git-crypt",
        ),
    ] {
        match o {
            Some(Spanned { value: false, loc }) if is_profile => errors.push(
                sources,
                *loc,
                format!("a profile cannot turn off the `{name}` masking layer"),
                "turns masking off",
                Some("masking layers can only be turned off in the top-level settings; use `allow` to expose single paths".into()),
            ),
            Some(_) => b.clone_from(o),
            None => {}
        }
    }
    base.secrets
        .tool_dirs
        .extend(over.secrets.tool_dirs.iter().cloned());
    base.secrets
        .dependency_dirs
        .extend(over.secrets.dependency_dirs.iter().cloned());
    base.secrets
        .not_dependency_dirs
        .extend(over.secrets.not_dependency_dirs.iter().cloned());
    base.secrets
        .write_through
        .extend(over.secrets.write_through.iter().cloned());

    scalar(&mut base.env.inherit, &over.env.inherit);
    scalar(&mut base.env.filter_secrets, &over.env.filter_secrets);
    base.env.allow.extend(over.env.allow.iter().cloned());
    base.env.deny.extend(over.env.deny.iter().cloned());
    base.env.pass.extend(over.env.pass.iter().cloned());
    base.env.set.extend(over.env.set.iter().cloned());
    base.env
        .from_file
        .extend(over.env.from_file.iter().cloned());

    scalar(&mut base.network.mode, &over.network.mode);
    scalar(&mut base.network.domains, &over.network.domains);
    scalar(&mut base.network.transparent, &over.network.transparent);
    base.network
        .allow
        .extend(over.network.allow.iter().cloned());
    base.network.deny.extend(over.network.deny.iter().cloned());
    base.network
        .groups
        .extend(over.network.groups.iter().cloned());
    base.network
        .localhost_ports
        .extend(over.network.localhost_ports.iter().cloned());

    scalar(&mut base.process.command, &over.process.command);
    scalar(&mut base.process.cwd, &over.process.cwd);
    scalar(&mut base.process.shell, &over.process.shell);
    scalar(&mut base.process.user, &over.process.user);
    scalar(&mut base.process.hostname, &over.process.hostname);
    base.process
        .rlimits
        .extend(over.process.rlimits.iter().cloned());

    scalar(&mut base.limits.pids, &over.limits.pids);
    scalar(&mut base.limits.memory, &over.limits.memory);
    scalar(&mut base.limits.cpus, &over.limits.cpus);
    scalar(&mut base.limits.disk, &over.limits.disk);

    // Tool rules append: a child profile adds denials and allowances, never removes a denial.
    base.tools.allow.extend(over.tools.allow.iter().cloned());
    base.tools.deny.extend(over.tools.deny.iter().cloned());
    // A credential said again by name is the later one's, whole.
    for c in &over.credentials {
        base.credentials.retain(|b| b.name.value != c.name.value);
        base.credentials.push(c.clone());
    }
}
