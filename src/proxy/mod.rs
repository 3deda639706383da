//! Egress policy. The domain rules are shared by the configuration (validated at their span) and
//! by the host-side proxy that enforces them.

pub mod domain;
pub mod policy;
pub mod request;
pub mod server;
