//! Examples of embedding kvtier, one file each beside this one; `cargo xtask ci` runs
//! every one (`cargo run -p kvtier-examples --example NAME`).
