//! The Python extension module `kvtier._native`.
//!
//! Two APIs over the same scheduler:
//! * [`compat`]: the API of the reference scheduler's module (`tokenspeed_scheduler`
//!   0.1.0), which the pure-Python package `tokenspeed_scheduler` re-exports, so that a
//!   Python engine written against the reference swaps schedulers without changes;
//! * [`api`]: kvtier's own (`import kvtier`): typed configuration, plans and events, the
//!   actor system behind a handle, and the trace tools.
//!
//! Nothing here decides anything: both translate between Python objects and
//! `kvtier_types`, and every error becomes a Python exception (`errors`).

mod api;
mod compat;
mod errors;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    compat::register(m)?;
    api::register(m)?;
    Ok(())
}
