//! `cargo xtask mooncake run -- CMD`: CMD with a real Mooncake master on loopback, from
//! registry packages only, inside a private network namespace.
//!
//! Outside the namespace (these need the network) it installs the runtime libraries
//! (apt), the pinned `tokenspeed-mooncake` wheel into a venv under `target/mooncake/`,
//! and builds a CUDA-driver stand-in generated from the library's own undefined `cu*`
//! symbols (every call answers "no device"). Then it re-runs itself under `unshare
//! --net`: there it brings `lo` up, starts `mooncake_master` on free 127.0.0.1 ports,
//! waits until it reports ready (failing at once if it exits), runs CMD with the
//! environment the tests read, and stops the master. The namespace is there because the
//! master's HTTP metadata server listens on every interface whatever it is told: in a
//! namespace of its own, "every interface" is loopback, and CMD (the tests) shares it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::{display_command, run_command};

const WHEEL: &str = "tokenspeed-mooncake==0.3.13.post20261027";

/// The hidden subcommand the namespace runs.
const INSIDE: &str = "__inside-netns";

fn dir(root: &Path) -> PathBuf {
    root.join("target/mooncake")
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let usage = "usage: cargo xtask mooncake run -- COMMAND [ARGS..]";
    match args.first().map(String::as_str) {
        Some("run") => {
            let command = match args.get(1).map(String::as_str) {
                Some("--") => &args[2..],
                _ => &args[1..],
            };
            let (program, rest) = command.split_first().context(usage)?;
            let mut command = Command::new(program);
            command.args(rest);
            run_isolated(&prepare(root)?, &mut command)
        }
        Some(INSIDE) => inside(root, &args[1..]),
        _ => bail!(usage),
    }
}

/// What the master and its clients need, prepared outside the namespace.
pub struct Installed {
    /// The wheel's package directory (the master binary and the client library).
    package: PathBuf,
    /// The environment the clients read.
    env: Vec<(String, String)>,
}

/// Installs what the master needs and checks that a private network namespace can be
/// made here.
pub fn prepare(root: &Path) -> Result<Installed> {
    let installed = install(root)?;
    sh(
        Command::new("unshare").args(["--net", "--", "true"]),
        "unshare --net (a private network namespace for the master)",
    )?;
    Ok(installed)
}

/// Runs `command` with a master beside it, both in a private network namespace.
pub fn run_isolated(installed: &Installed, command: &mut Command) -> Result<()> {
    let xtask = std::env::current_exe().context("finding the xtask binary")?;
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["--net", "--"])
        .arg(xtask)
        .args(["mooncake", INSIDE])
        .arg(&installed.package)
        .arg("--")
        .arg(command.get_program())
        .args(command.get_args())
        .envs(installed.env.iter().cloned());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        wrapped.current_dir(dir);
    }
    println!(
        "mooncake: in a private network namespace: {}",
        display_command(command)
    );
    run_command(&mut wrapped)
}

/// Inside the namespace: loopback up, the master on free ports, the command, the master
/// stopped.
fn inside(root: &Path, args: &[String]) -> Result<()> {
    let [package, separator, program, rest @ ..] = args else {
        bail!("{INSIDE} needs the package directory, `--` and a command");
    };
    if separator != "--" {
        bail!("{INSIDE}: expected `--`, got `{separator}`");
    }
    sh(
        Command::new("ip").args(["link", "set", "lo", "up"]),
        "ip link set lo up",
    )?;
    let [rpc_port, metadata_port, metrics_port] = free_ports()?;
    let log_path = dir(root).join("master.log");
    let log = std::fs::File::create(&log_path)?;
    let mut master = Command::new(Path::new(package).join("mooncake_master"))
        .args([
            "--rpc_address=127.0.0.1",
            &format!("--rpc_port={rpc_port}"),
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            &format!("--http_metadata_server_port={metadata_port}"),
            "--metrics_host=127.0.0.1",
            &format!("--metrics_port={metrics_port}"),
            "--default_kv_lease_ttl=500",
            "--logtostderr",
        ])
        .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting mooncake_master")?;
    let result = wait_ready(
        &mut master,
        metrics_port,
        Duration::from_secs(30),
        &log_path,
    )
    .and_then(|()| {
        println!(
            "mooncake: master ready on 127.0.0.1:{rpc_port} (pid {})",
            master.id()
        );
        let mut command = Command::new(program);
        command
            .args(rest)
            .env("KVTIER_MOONCAKE_MASTER", format!("127.0.0.1:{rpc_port}"))
            .env(
                "KVTIER_MOONCAKE_METADATA",
                format!("http://127.0.0.1:{metadata_port}/metadata"),
            )
            .env("KVTIER_MOONCAKE_PID", master.id().to_string());
        run_command(&mut command)
    });
    let _ = master.kill();
    let _ = master.wait();
    result
}

/// Three distinct ports free on 127.0.0.1 now (the kernel picks them); the master binds
/// them a moment later, and fails loudly if one was taken in between.
fn free_ports() -> Result<[u16; 3]> {
    let listeners = (0..3)
        .map(|_| TcpListener::bind(("127.0.0.1", 0)))
        .collect::<std::io::Result<Vec<_>>>()
        .context("binding 127.0.0.1:0")?;
    let mut ports = [0; 3];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
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
        bail!("{what} failed with {status}");
    }
    Ok(())
}

/// The libraries, the wheel and the CUDA stand-in (cached under `target/mooncake`).
fn install(root: &Path) -> Result<Installed> {
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
    let package = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    let library = package.join("libmooncake_store.so");
    let stub = build_cuda_stub(&dir, &library)?;
    let env = vec![
        (
            "MOONCAKE_STORE_LIBRARY".into(),
            library.display().to_string(),
        ),
        ("MC_CUDA_STUB".into(), stub.display().to_string()),
        ("MC_TCP_BIND_ADDRESS".into(), "127.0.0.1".into()),
    ];
    Ok(Installed { package, env })
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
fn health_ready(metrics_port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", metrics_port)) else {
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

/// Waits until the master reports ready; fails at once if it exits meanwhile.
fn wait_ready(master: &mut Child, metrics_port: u16, limit: Duration, log: &Path) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = master.try_wait()? {
            bail!(
                "mooncake_master exited ({status}) before it was ready; see {}",
                log.display()
            );
        }
        if health_ready(metrics_port) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!(
        "mooncake_master did not become ready within {limit:?}; see {}",
        log.display()
    )
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
