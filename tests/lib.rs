//! End-to-end tests across kvtier's crates live in `e2e/` (one test binary); this
//! library holds what other crates' tests share with them.

/// A tool the test checks kvtier's output with, from `var` (`cargo xtask ci` sets it),
/// or `None` after saying loudly that the test skipped; under CI a missing tool fails.
pub fn tool_from_env(var: &str, what: &str) -> Option<String> {
    if let Ok(path) = std::env::var(var) {
        return Some(path);
    }
    let msg = format!("{what} is not set up ({var} unset): run `cargo xtask ci`");
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true"),
        "{msg} (CI must not skip it)"
    );
    eprintln!("SKIPPED: {msg}");
    None
}
