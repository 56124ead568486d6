//! kvtier's errors as Python exceptions, of the types the reference module raises for
//! the same mistakes (nanobind's mapping: `std::invalid_argument` → `ValueError`, a
//! state machine refusal → `RuntimeError`, `std::out_of_range` → `IndexError`).

use kvtier_fsm::SchedError;
use pyo3::PyErr;
use pyo3::exceptions::{PyRuntimeError, PyValueError};

/// The exception for a scheduler refusal.
pub fn sched_error(error: &SchedError) -> PyErr {
    let message = error.to_string();
    match error {
        // The request is in a state where the event means nothing: the reference's
        // "FSM transition invalid" RuntimeError.
        SchedError::InvalidTransition { .. }
        | SchedError::Busy
        | SchedError::UnexpectedReply
        | SchedError::LateLoadBackFailure(_)
        | SchedError::Unsupported(_) => PyRuntimeError::new_err(message),
        // Bad input: a config, a prompt, an id.
        _ => PyValueError::new_err(message),
    }
}

/// The exception for a failed call of the actor system (refused batch items are
/// `RejectedError`s, made by the caller).
pub fn kv_error(error: &kvtier::KvError) -> PyErr {
    match error {
        kvtier::KvError::Sched(e) => sched_error(e),
        kvtier::KvError::Setup(_) => PyValueError::new_err(error.to_string()),
        _ => PyRuntimeError::new_err(error.to_string()),
    }
}
