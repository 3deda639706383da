//! Content-addressed store entries that a sandbox needs realised on the host:
//! `$XDG_CACHE_HOME/aisb/store/<hash>-<name>/`, written to a temporary directory and renamed
//! into place, then marked ready (see `store`).
//!
//! | entry | what goes into its hash | never |
//! |-------|-------------------------|-------|
//! | `etc` | each allowlisted /etc entry and every directory below it: relative path, kind, mode, size, mtime (ns), symlink target | file contents; files below the top level (their directory's mtime stands for them) |

//! | `claude-managed` | the settings file's text (`agents`) | – |

pub mod etc;
pub mod store;
