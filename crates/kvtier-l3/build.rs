//! Builds the C++ shim that loads Mooncake's C ABI at run time.

fn main() {
    cxx_build::bridge("src/mooncake/ffi.rs")
        .file("cpp/mooncake_shim.cc")
        .std("c++17")
        .flag_if_supported("-O2")
        .compile("kvtier_mooncake_shim");
    println!("cargo:rustc-link-lib=dl");
    for file in [
        "src/mooncake/ffi.rs",
        "cpp/mooncake_shim.h",
        "cpp/mooncake_shim.cc",
    ] {
        println!("cargo:rerun-if-changed={file}");
    }
}
