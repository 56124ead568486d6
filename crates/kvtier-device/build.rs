//! Builds the C++ kernel library and its cxx bridge with the system C++ compiler.
//!
//! With the feature `cuda`, it also compiles the CUDA backend (`cpp/kernels_cuda.cu`) with
//! nvcc for sm_80 and sm_90 and links the CUDA runtime. nvcc is `$NVCC`, else
//! `$CUDA_HOME/bin/nvcc`, else the first `nvcc` on `PATH`; without one the build fails
//! saying how to install it (`cargo xtask cuda-toolchain`). Without the feature nothing
//! of CUDA is needed or looked for.

use std::path::{Path, PathBuf};
use std::process::Command;

const CPU_SOURCES: [&str; 3] = ["src/ffi.rs", "cpp/kernels.h", "cpp/kernels_cpu.cc"];
const CUDA_SOURCES: [&str; 5] = [
    "src/cuda_ffi.rs",
    "cpp/kernels_cuda.h",
    "cpp/kernels_cuda.cu",
    "cpp/cuda_bridge.h",
    "cpp/cuda_bridge.cc",
];
/// Real (SASS) code for A100-class and H100-class GPUs.
const GENCODE: [&str; 4] = [
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=sm_90",
];

fn main() {
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build_with_cuda();
        return;
    }
    cxx_build::bridge("src/ffi.rs")
        .file("cpp/kernels_cpu.cc")
        .std("c++17")
        .flag_if_supported("-O3")
        .flag_if_supported("-pthread")
        .compile("kvtier_kernels");
    println!("cargo:rustc-link-lib=pthread");
    for file in CPU_SOURCES {
        println!("cargo:rerun-if-changed={file}");
    }
}

/// Stops the build with `message` (cargo shows the build script's stderr).
fn fail(message: &str) -> ! {
    eprintln!("\nerror: {message}\n");
    std::process::exit(1);
}

fn build_with_cuda() {
    let nvcc = find_nvcc();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let object = out_dir.join("kernels_cuda.o");
    let mut command = Command::new(&nvcc);
    command
        .args(["-c", "cpp/kernels_cuda.cu", "-o"])
        .arg(&object)
        .args(["-std=c++17", "-O3", "-Xcompiler", "-fPIC"])
        .args(GENCODE);
    let shown = format!("{command:?}");
    match command.status() {
        Ok(status) if status.success() => {}
        Ok(status) => fail(&format!(
            "kvtier-device: nvcc failed ({status}) compiling the CUDA backend:\n    {shown}"
        )),
        Err(err) => fail(&format!(
            "kvtier-device: cannot run nvcc at {}: {err}",
            nvcc.display()
        )),
    }

    cxx_build::bridges(["src/ffi.rs", "src/cuda_ffi.rs"])
        .file("cpp/kernels_cpu.cc")
        .file("cpp/cuda_bridge.cc")
        .object(&object)
        .std("c++17")
        .flag_if_supported("-O3")
        .flag_if_supported("-pthread")
        .compile("kvtier_kernels");
    link_cudart(&nvcc);
    println!("cargo:rustc-link-lib=pthread");

    for file in CPU_SOURCES.iter().chain(CUDA_SOURCES.iter()) {
        println!("cargo:rerun-if-changed={file}");
    }
    for var in ["NVCC", "CUDA_HOME", "NVCC_CCBIN", "PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed={}", nvcc.display());
}

fn is_file(path: &Path) -> bool {
    path.is_file()
}

/// `$NVCC`, else `$CUDA_HOME/bin/nvcc`, else `nvcc` on `PATH`; fails the build otherwise.
fn find_nvcc() -> PathBuf {
    if let Some(nvcc) = std::env::var_os("NVCC").filter(|v| !v.is_empty()) {
        let nvcc = PathBuf::from(nvcc);
        if !is_file(&nvcc) {
            fail(&format!(
                "kvtier-device: NVCC={} is not a file. {}",
                nvcc.display(),
                install_hint()
            ));
        }
        return nvcc;
    }
    if let Some(home) = std::env::var_os("CUDA_HOME").filter(|v| !v.is_empty()) {
        let nvcc = Path::new(&home).join("bin/nvcc");
        if is_file(&nvcc) {
            return nvcc;
        }
    }
    if let Some(nvcc) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("nvcc"))
            .find(|candidate| is_file(candidate))
    }) {
        return nvcc;
    }
    let cuda_home = std::env::var("CUDA_HOME").map_or_else(
        |_| "CUDA_HOME is unset".to_owned(),
        |home| format!("no {home}/bin/nvcc"),
    );
    fail(&format!(
        "kvtier-device: the `cuda` feature needs nvcc, the CUDA compiler, and none was found \
         (NVCC is unset, {cuda_home}, no nvcc on PATH). {}",
        install_hint()
    ))
}

fn install_hint() -> String {
    let mut hint = String::from(
        "To install it from PyPI into target/cuda-venv, run\n\n    \
         cargo xtask cuda-toolchain\n\n\
         and build with the NVCC it prints (eval \"$(cargo xtask cuda-toolchain)\" exports it). \
         By hand: pip install the pinned nvidia-cuda-nvcc, nvidia-nvvm, nvidia-cuda-crt and \
         nvidia-cuda-runtime wheels (versions in xtask/src/cuda.rs) into a venv and set \
         NVCC=<venv site-packages>/nvidia/cu13/bin/nvcc; or set CUDA_HOME to a CUDA toolkit \
         (12.x or 13.x).",
    );
    if let Some(nvcc) = installed_venv_nvcc() {
        hint.push_str(&format!(
            "\nA toolchain is already installed: export NVCC={}",
            nvcc.display()
        ));
    }
    hint
}

/// nvcc in the workspace's `target/cuda-venv`, if `cargo xtask cuda-toolchain` ran.
fn installed_venv_nvcc() -> Option<PathBuf> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let lib = manifest.join("../../target/cuda-venv/lib");
    std::fs::read_dir(lib)
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages/nvidia/cu13/bin/nvcc"))
        .find(|nvcc| is_file(nvcc))
        .and_then(|nvcc| std::fs::canonicalize(nvcc).ok())
}

/// Links the CUDA runtime: `cudart_static` when the toolkit has it, else the shared
/// library with an rpath (which only this package's own tests and binaries get; others
/// need it on `LD_LIBRARY_PATH`).
fn link_cudart(nvcc: &Path) {
    let nvcc = std::fs::canonicalize(nvcc).unwrap_or_else(|_| nvcc.to_path_buf());
    let mut roots: Vec<PathBuf> = nvcc
        .parent()
        .and_then(Path::parent)
        .into_iter()
        .map(Path::to_path_buf)
        .collect();
    if let Some(home) = std::env::var_os("CUDA_HOME").filter(|v| !v.is_empty()) {
        roots.push(PathBuf::from(home));
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    for root in &roots {
        for sub in [
            "lib64",
            "lib",
            "targets/x86_64-linux/lib",
            "../cuda_runtime/lib",
        ] {
            dirs.push(root.join(sub));
        }
    }
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));

    if let Some(dir) = dirs.iter().find(|d| is_file(&d.join("libcudart_static.a"))) {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static=cudart_static");
        for lib in ["dl", "rt"] {
            println!("cargo:rustc-link-lib={lib}");
        }
        return;
    }
    for dir in &dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut shared: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.starts_with("libcudart.so"))
            .collect();
        shared.sort();
        let Some(first) = shared.first() else {
            continue;
        };
        println!("cargo:rustc-link-search=native={}", dir.display());
        if shared.iter().any(|name| name == "libcudart.so") {
            println!("cargo:rustc-link-lib=dylib=cudart");
        } else {
            println!("cargo:rustc-link-lib=dylib:+verbatim={first}");
        }
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        return;
    }
    let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    fail(&format!(
        "kvtier-device: found nvcc at {} but no CUDA runtime library (libcudart_static.a or \
         libcudart.so*) in any of: {}. {}",
        nvcc.display(),
        searched.join(", "),
        install_hint()
    ))
}
