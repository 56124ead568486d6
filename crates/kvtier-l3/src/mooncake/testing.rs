//! Support for tests that need a real Mooncake cluster, here and in downstream crates.
//! Behind the `testing` feature, which only dev-dependencies turn on: it starts
//! processes, nothing a library user needs.
//!
//! * [`cluster_from_env`]: the cluster `cargo xtask mooncake run` describes; without one a
//!   test says loudly that it skipped, and under CI (`CI=true`) it is an error instead,
//!   so a missing install step cannot hide.
//! * [`LoopbackMaster`]: a `mooncake_master` of a test's own on free loopback ports (the
//!   kernel picks them), watched while it starts, for tests that kill it mid-run without
//!   disturbing the shared one.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use super::MooncakeConfig;
use crate::L3Error;

/// The cluster the environment describes. `Ok(None)` (after printing `SKIPPED` with the
/// reason) when there is none outside CI; `Err` under CI.
pub fn cluster_from_env() -> Result<Option<MooncakeConfig>, L3Error> {
    if let Some(config) = MooncakeConfig::from_env() {
        return Ok(Some(config));
    }
    let msg = "Mooncake is not set up (MOONCAKE_STORE_LIBRARY unset): run the tests under \
               `cargo xtask mooncake run -- cargo test ...`";
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        return Err(L3Error::Config(msg.into()));
    }
    eprintln!("SKIPPED: {msg}");
    Ok(None)
}

/// A `mooncake_master` on 127.0.0.1 with ports of its own, killed when dropped.
#[derive(Debug)]
pub struct LoopbackMaster {
    child: Child,
    rpc_port: u16,
    metadata_port: u16,
    /// Where its output goes (read into the error when it does not come up).
    log: PathBuf,
}

/// `N` distinct ports free on 127.0.0.1 now: the kernel picks them (port 0), all bound at
/// once so they differ. The master binds them a moment later; `LoopbackMaster::start`
/// retries with fresh ports if another process took one in between.
pub fn free_loopback_ports<const N: usize>() -> Result<[u16; N], L3Error> {
    let io = |source| L3Error::Io {
        path: "127.0.0.1:0".into(),
        source,
    };
    let listeners = (0..N)
        .map(|_| TcpListener::bind(("127.0.0.1", 0)).map_err(io))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr().map_err(io)?.port();
    }
    Ok(ports)
}

impl LoopbackMaster {
    /// Starts the `mooncake_master` that sits beside `cluster.library` (the wheel ships
    /// both) on free loopback ports, and waits up to 10 s until both of its servers
    /// accept connections. A master that exits meanwhile (a port taken under it) is
    /// started again on fresh ports, twice at most; then the error carries its exit
    /// status and the end of its output.
    pub fn start(cluster: &MooncakeConfig) -> Result<Self, L3Error> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(cluster)? {
                Ok(master) => return Ok(master),
                Err(exited) => last = Some(exited),
            }
        }
        Err(L3Error::Config(last.unwrap_or_default()))
    }

    /// `Ok(Err(why))` when the master exited before it was ready.
    fn start_once(cluster: &MooncakeConfig) -> Result<Result<Self, String>, L3Error> {
        let binary = cluster.library.with_file_name("mooncake_master");
        let [rpc_port, metadata_port, metrics_port] = free_loopback_ports()?;
        let log = std::env::temp_dir().join(format!(
            "kvtier-mooncake-master-{}-{rpc_port}.log",
            std::process::id()
        ));
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| L3Error::Io { path, source }
        };
        let out = File::create(&log).map_err(io(&log))?;
        let err = out.try_clone().map_err(io(&log))?;
        let child = Command::new(&binary)
            .args([
                "--rpc_address=127.0.0.1".to_string(),
                format!("--rpc_port={rpc_port}"),
                "--enable_http_metadata_server=true".to_string(),
                "--http_metadata_server_host=127.0.0.1".to_string(),
                format!("--http_metadata_server_port={metadata_port}"),
                "--metrics_host=127.0.0.1".to_string(),
                format!("--metrics_port={metrics_port}"),
            ])
            .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(&binary))?;
        let mut master = Self {
            child,
            rpc_port,
            metadata_port,
            log,
        };
        let listening = |port| TcpStream::connect(("127.0.0.1", port)).is_ok();
        for _ in 0..100 {
            if let Some(status) = master.child.try_wait().map_err(io(&binary))? {
                let tail = master.log_tail();
                return Ok(Err(format!(
                    "{} exited ({status}) before it was ready on 127.0.0.1:{rpc_port} and \
                     :{metadata_port}; its output ends with:\n{tail}",
                    binary.display()
                )));
            }
            if listening(rpc_port) && listening(metadata_port) {
                return Ok(Ok(master));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(L3Error::Config(format!(
            "{} did not listen on 127.0.0.1:{rpc_port} and :{metadata_port} within 10 s; \
             its output ends with:\n{}",
            binary.display(),
            master.log_tail()
        )))
    }

    /// The last lines the master wrote.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kills the master and waits for it to exit.
    pub fn kill(mut self) -> Result<(), L3Error> {
        let io = |source| L3Error::Io {
            path: "mooncake_master".into(),
            source,
        };
        self.child.kill().map_err(io)?;
        self.child.wait().map_err(io)?;
        Ok(())
    }

    /// `cluster` pointed at this master.
    pub fn config(&self, cluster: &MooncakeConfig) -> MooncakeConfig {
        MooncakeConfig {
            master: format!("127.0.0.1:{}", self.rpc_port),
            metadata: format!("http://127.0.0.1:{}/metadata", self.metadata_port),
            ..cluster.clone()
        }
    }
}

impl Drop for LoopbackMaster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
