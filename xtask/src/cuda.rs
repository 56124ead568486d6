//! `cargo xtask cuda-toolchain`: nvcc and the CUDA runtime from PyPI, in a venv under
//! `target/cuda-venv/`, for building kvtier-device with `--features cuda`.
//!
//! PyPI has no CUDA 12 compiler: the `nvidia-cuda-nvcc-cu12` wheels (every release from
//! 12.0.76 to 12.9.86) hold only ptxas, libnvvm and the crt headers, not nvcc, cicc,
//! cudafe++ or fatbinary. The CUDA 13 wheels are complete and install into one
//! toolkit-shaped tree, `site-packages/nvidia/cu13/{bin,include,lib,nvvm}` (with
//! `libcudart_static.a`), so this pins CUDA 13.0: the first 13.x release, whose nvcc
//! accepts gcc up to 15 as host compiler and still builds sm_80 and sm_90. Running what
//! it builds needs a driver for CUDA 13 (r580 or later).
//!
//! The venv is made once; a stamp file records the pinned packages, and a later run with
//! the same pins only checks that nvcc answers. Informational lines go to stderr and the
//! `export NVCC=… CUDA_HOME=…` lines to stdout, so `eval "$(cargo xtask cuda-toolchain)"`
//! sets up a shell.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{capture_stdout, run_command};

/// The pinned wheels (checked with `pip index versions` and `pip download`).
const PACKAGES: [&str; 4] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
];
/// What `nvcc --version` must say of the pinned nvcc.
const RELEASE: &str = "release 13.0";
const STAMP: &str = "kvtier-cuda-toolchain.txt";

/// An installed toolchain.
#[derive(Debug, Clone)]
pub struct Toolchain {
    /// The nvcc binary.
    pub nvcc: PathBuf,
    /// The toolkit-shaped tree nvcc lives in (`…/nvidia/cu13`).
    pub cuda_home: PathBuf,
    /// nvcc's version line, e.g. `Cuda compilation tools, release 13.0, V13.0.88`.
    pub version: String,
}

impl Toolchain {
    /// The environment a `--features cuda` build reads.
    pub fn env(&self) -> [(&'static str, OsString); 2] {
        [
            ("NVCC", self.nvcc.clone().into_os_string()),
            ("CUDA_HOME", self.cuda_home.clone().into_os_string()),
        ]
    }
}

/// `target/cuda-venv` (under `$CARGO_TARGET_DIR` when that is set).
fn venv_dir(root: &Path) -> PathBuf {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    root.join(target).join("cuda-venv")
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!(
            "`cargo xtask cuda-toolchain` takes no arguments, got: {}",
            args.join(" ")
        );
    }
    let toolchain = install(root)?;
    eprintln!(
        "cuda-toolchain: {} at {}",
        toolchain.version,
        toolchain.nvcc.display()
    );
    eprintln!("cuda-toolchain: build with the environment below, e.g.");
    eprintln!(
        "    eval \"$(cargo xtask cuda-toolchain)\" && cargo build -p kvtier-device --features cuda"
    );
    for (name, value) in toolchain.env() {
        println!("export {name}={}", value.to_string_lossy());
    }
    Ok(())
}

/// Installs the pinned wheels into the venv unless its stamp says they are there, and
/// returns the toolchain after checking that its nvcc runs.
pub fn install(root: &Path) -> Result<Toolchain> {
    let venv = venv_dir(root);
    let stamp = venv.join(STAMP);
    let wanted = format!("{}\n", PACKAGES.join("\n"));
    if std::fs::read_to_string(&stamp).is_ok_and(|text| text == wanted) {
        match locate(&venv) {
            Ok(toolchain) => return Ok(toolchain),
            Err(err) => eprintln!("cuda-toolchain: reinstalling: {err:#}"),
        }
    }
    eprintln!(
        "cuda-toolchain: installing {} into {}",
        PACKAGES.join(" "),
        venv.display()
    );
    let python = venv.join("bin/python");
    if !python.is_file() {
        let mut create = Command::new("python3");
        create
            .args(["-m", "venv"])
            .arg(&venv)
            .stdout(Stdio::from(std::io::stderr()));
        run_command(&mut create).context("creating the venv (needs python3 with venv)")?;
    }
    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .args(PACKAGES)
    .stdout(Stdio::from(std::io::stderr()));
    run_command(&mut pip).context("installing the CUDA wheels from PyPI")?;
    let toolchain = locate(&venv)?;
    std::fs::write(&stamp, wanted).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(toolchain)
}

/// Finds nvcc in the venv and checks that it runs and is the pinned release.
fn locate(venv: &Path) -> Result<Toolchain> {
    let mut purelib = Command::new(venv.join("bin/python"));
    purelib.args([
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
    ]);
    let site = PathBuf::from(capture_stdout(&mut purelib)?.trim());
    let cuda_home = site.join("nvidia/cu13");
    let nvcc = cuda_home.join("bin/nvcc");
    if !nvcc.is_file() {
        bail!("no nvcc at {}", nvcc.display());
    }
    let mut version = Command::new(&nvcc);
    version.arg("--version");
    let out = capture_stdout(&mut version)?;
    if !out.contains(RELEASE) {
        bail!(
            "{} is not the pinned nvcc ({RELEASE}): {out}",
            nvcc.display()
        );
    }
    let version = out
        .lines()
        .find(|line| line.contains(RELEASE))
        .unwrap_or_default()
        .trim()
        .to_owned();
    Ok(Toolchain {
        nvcc,
        cuda_home,
        version,
    })
}
