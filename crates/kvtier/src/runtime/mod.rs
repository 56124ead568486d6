//! The two runtimes over the same cores: actix (default) and the deterministic bus.

pub mod actix;
pub mod deterministic;
