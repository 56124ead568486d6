//! kvtier's own Python API (`import kvtier`): typed configuration, requests, events and
//! plans; the actor system behind a handle ([`System`]); and the trace tools.
//!
//! The Python package `kvtier` re-exports these and ships their type stubs
//! (`kvtier/__init__.pyi`). Values cross as plain Python types (lists, tuples, dicts),
//! so an engine can hand them to its kernels without conversion.

mod config;
mod events;
mod plan;
mod system;
mod tools;

use pyo3::prelude::*;

pyo3::create_exception!(
    kvtier,
    RejectedError,
    pyo3::exceptions::PyValueError,
    "Some items of a submit or advance were refused (the others were applied); \
     `.rejected` lists `(index, message)` of each."
);

/// Registers the API's classes and functions on the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("RejectedError", py.get_type::<RejectedError>())?;
    m.add_class::<config::Config>()?;
    m.add_class::<config::Mamba>()?;
    m.add_class::<config::Group>()?;
    m.add_class::<config::Request>()?;
    events::register(m)?;
    m.add_class::<plan::Plan>()?;
    m.add_class::<plan::Row>()?;
    m.add_class::<plan::Copy>()?;
    m.add_class::<plan::Prefetch>()?;
    m.add_class::<plan::Backup>()?;
    m.add_class::<plan::KvEvent>()?;
    m.add_class::<system::System>()?;
    m.add_class::<tools::TraceRequest>()?;
    m.add_function(wrap_pyfunction!(tools::read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(tools::replay, m)?)?;
    m.add_function(wrap_pyfunction!(tools::run_workload, m)?)?;
    Ok(())
}
