//! Builds the C++ kernel library and its cxx bridge with the system C++ compiler.

fn main() {
    cxx_build::bridge("src/ffi.rs")
        .file("cpp/kernels_cpu.cc")
        .std("c++17")
        .flag_if_supported("-O3")
        .flag_if_supported("-pthread")
        .compile("kvtier_kernels");
    println!("cargo:rustc-link-lib=pthread");
    for file in ["src/ffi.rs", "cpp/kernels.h", "cpp/kernels_cpu.cc"] {
        println!("cargo:rerun-if-changed={file}");
    }
}
