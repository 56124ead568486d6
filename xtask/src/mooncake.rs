//! `cargo xtask mooncake up|down|env`: a real Mooncake master on loopback for the L3
//! tests, from registry packages only.
//!
//! `up` installs the runtime libraries (apt), the pinned `tokenspeed-mooncake` wheel into
//! a venv under `target/mooncake/`, builds a CUDA-driver stand-in generated from the
//! library's own undefined `cu*` symbols (every call answers "no device"), starts
//! `mooncake_master` on 127.0.0.1 and waits until it reports ready. It writes the
//! environment the tests need to `target/mooncake/env`. `down` stops the master.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

const WHEEL: &str = "tokenspeed-mooncake==0.3.13.post20261027";
const RPC_PORT: u16 = 50051;
const METADATA_PORT: u16 = 8080;
const METRICS_PORT: u16 = 9003;

fn dir(root: &Path) -> PathBuf {
    root.join("target/mooncake")
}

/// The environment the Mooncake tests read, as (name, value) pairs.
pub fn env(root: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(dir(root).join("env"))
        .context("Mooncake is not set up: run `cargo xtask mooncake up`")?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("up") => up(root),
        Some("down") => down(root),
        Some("env") => {
            for (k, v) in env(root)? {
                println!("export {k}={v}");
            }
            Ok(())
        }
        _ => bail!("usage: cargo xtask mooncake up|down|env"),
    }
}

fn have_library(name: &str) -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(name))
        .unwrap_or(false)
}

fn sh(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: cannot start"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

pub fn up(root: &Path) -> Result<()> {
    let dir = dir(root);
    std::fs::create_dir_all(&dir)?;
    if !have_library("libibverbs.so.1") {
        println!("mooncake: installing libibverbs1 ibverbs-providers libnuma1 libcurl4 (apt)");
        sh(
            Command::new("apt-get").args(["update", "-qq"]),
            "apt-get update",
        )?;
        sh(
            Command::new("apt-get").args([
                "install",
                "-y",
                "-qq",
                "libibverbs1",
                "ibverbs-providers",
                "libnuma1",
                "libcurl4",
            ]),
            "apt-get install",
        )?;
    }
    let venv = dir.join("venv");
    let python = venv.join("bin/python");
    let installed = Command::new(&python)
        .args(["-c", "import mooncake"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        println!("mooncake: installing {WHEEL} into {}", venv.display());
        sh(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        )?;
        sh(
            Command::new(venv.join("bin/pip")).args(["install", "-q", WHEEL]),
            "pip install",
        )?;
    }
    let out = Command::new(&python)
        .args([
            "-c",
            "import mooncake, os; print(os.path.dirname(mooncake.__file__))",
        ])
        .output()?;
    let mc_dir = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    let library = mc_dir.join("libmooncake_store.so");
    let stub = build_cuda_stub(&dir, &library)?;
    down(root)?;
    let log = std::fs::File::create(dir.join("master.log"))?;
    let master = Command::new("setsid")
        .arg(mc_dir.join("mooncake_master"))
        .args([
            "--rpc_address=127.0.0.1",
            &format!("--rpc_port={RPC_PORT}"),
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            &format!("--http_metadata_server_port={METADATA_PORT}"),
            "--metrics_host=127.0.0.1",
            &format!("--metrics_port={METRICS_PORT}"),
            "--default_kv_lease_ttl=500",
            "--logtostderr",
        ])
        .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting mooncake_master")?;
    std::fs::write(dir.join("master.pid"), master.id().to_string())?;
    wait_ready(Duration::from_secs(30))?;
    let env = [
        ("MOONCAKE_STORE_LIBRARY", library.display().to_string()),
        ("MC_CUDA_STUB", stub.display().to_string()),
        ("MC_TCP_BIND_ADDRESS", "127.0.0.1".to_owned()),
        ("KVTIER_MOONCAKE_MASTER", format!("127.0.0.1:{RPC_PORT}")),
        (
            "KVTIER_MOONCAKE_METADATA",
            format!("http://127.0.0.1:{METADATA_PORT}/metadata"),
        ),
        ("KVTIER_MOONCAKE_PID", master.id().to_string()),
    ];
    let text: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(dir.join("env"), text)?;
    println!(
        "mooncake: master ready on 127.0.0.1:{RPC_PORT} (pid {})",
        master.id()
    );
    Ok(())
}

/// A `libcuda.so.1` whose every symbol the library needs answers CUDA_ERROR_NO_DEVICE,
/// generated from the library's own undefined `cu*` symbols.
fn build_cuda_stub(dir: &Path, library: &Path) -> Result<PathBuf> {
    let out = Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(library)
        .output()?;
    let mut symbols: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| s.starts_with("cu") && s[2..].starts_with(|c: char| c.is_ascii_uppercase()))
        .map(str::to_owned)
        .collect();
    symbols.sort();
    symbols.dedup();
    if symbols.is_empty() {
        bail!("no cu* symbols found in {}", library.display());
    }
    let mut c =
        String::from("/* Generated by cargo xtask mooncake: a CUDA driver with no device. */\n");
    for s in &symbols {
        if s.starts_with("cuGetError") {
            c.push_str(&format!(
                "int {s}(int e, const char **out) {{ (void)e; if (out) *out = \"no CUDA device (kvtier stand-in)\"; return 0; }}\n"
            ));
        } else {
            c.push_str(&format!("int {s}(void) {{ return 100; }}\n"));
        }
    }
    let source = dir.join("cuda_stub.c");
    std::fs::write(&source, c)?;
    let stub = dir.join("libcuda.so.1");
    sh(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(&stub)
            .arg(&source),
        "building the CUDA driver stand-in",
    )?;
    Ok(stub)
}

/// One `/health` probe. The server keeps connections open, so read with a timeout and
/// stop as soon as the whole answer is in.
fn health_ready() -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", METRICS_PORT)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if s.write_all(request).is_err() {
        return false;
    }
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if let Some(health) = health_body(&seen) {
            return health.service_ready;
        }
    }
    false
}

/// The part of the master's `/health` answer we read.
#[derive(Debug, Deserialize)]
struct Health {
    service_ready: bool,
}

/// The JSON body of an HTTP `/health` response, once all of it has arrived.
fn health_body(response: &[u8]) -> Option<Health> {
    let end_of_headers = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    serde_json::from_slice(&response[end_of_headers + 4..]).ok()
}

fn wait_ready(limit: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if health_ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("mooncake_master did not become ready within {limit:?}; see target/mooncake/master.log")
}

pub fn down(root: &Path) -> Result<()> {
    let pid_file = dir(root).join("master.pid");
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        let pid = pid.trim().to_owned();
        let _ = Command::new("kill")
            .arg(&pid)
            .stderr(Stdio::null())
            .status();
        // Wait for it to exit, so a restart can bind the same ports.
        // Exited, or a zombie waiting for us (its parent) to reap it, counts as gone.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
            })
        };
        let start = Instant::now();
        while alive() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(&pid_file);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n";

    #[test]
    fn reads_readiness_from_the_health_body() {
        // As mooncake_master 0.3.13 answers.
        let ready = format!(
            "{HEAD}{{\"status\":\"ok\",\"role\":\"leader\",\"ha_state\":\"serving\",\
             \"service_ready\":true,\"leader_address\":null,\"view_version\":null}}"
        );
        assert!(health_body(ready.as_bytes()).is_some_and(|h| h.service_ready));
        let spaced = format!("{HEAD}{{ \"service_ready\" : true }}");
        assert!(health_body(spaced.as_bytes()).is_some_and(|h| h.service_ready));
        let starting = format!("{HEAD}{{\"status\":\"ok\",\"service_ready\":false}}");
        assert!(health_body(starting.as_bytes()).is_some_and(|h| !h.service_ready));
    }

    #[test]
    fn waits_for_the_whole_body() {
        assert!(health_body(HEAD.as_bytes()).is_none());
        assert!(health_body(format!("{HEAD}{{\"service_ready\":tr").as_bytes()).is_none());
        // The flag inside the headers is not the answer.
        assert!(health_body(b"HTTP/1.1 200 OK\r\nX: \"service_ready\":true\r\n").is_none());
    }
}
