//! Content-addressed store entries that a sandbox needs realised on the host:
//! `$XDG_CACHE_HOME/aisb/store/<hash>-<name>/`, written to a temporary directory and renamed
//! into place, so an entry that exists is complete.
//!
//! | entry | what goes into its hash | never |
//! |-------|-------------------------|-------|
//! | `etc` | each allowlisted /etc entry and every directory below it: relative path, kind, mode, size, mtime (ns), symlink target | file contents; files below the top level (their directory's mtime stands for them) |

pub mod etc;
