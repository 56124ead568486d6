//! End-to-end tests across kvtier's crates live in `e2e/` (one test binary); this
//! library is empty.
