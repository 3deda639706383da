//! Content-addressed store entries that a sandbox needs realised on the host:
//! `$XDG_CACHE_HOME/aisb/store/<hash>-<name>/`, written to a temporary directory and renamed
//! into place, so an entry that exists is complete.
//!
//! | entry | what goes into its hash | never |
//! |-------|-------------------------|-------|
//! | `etc` | each allowlisted /etc path: relative path, kind, mode, size, mtime (ns), symlink target | file contents of unlisted paths |

pub mod etc;
