//! Egress policy, enforced by the host-side proxy. The domain-rule syntax is the
//! configuration's ([`crate::config::domain`], validated at its span); the proxy matches by it.

pub mod broker;
pub mod ca;
pub mod feedback;
pub mod listen;
pub mod policy;
pub mod request;
pub mod serve;
pub mod server;
pub mod splice;
