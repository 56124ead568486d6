//! Support for tests that need a real Mooncake cluster, here and in downstream crates.
//! Behind the `testing` feature, which only dev-dependencies turn on: it starts
//! processes, nothing a library user needs.
//!
//! * [`cluster_from_env`]: the cluster `cargo xtask mooncake up` describes; without one a
//!   test says loudly that it skipped, and under CI (`CI=true`) it is an error instead,
//!   so a missing install step cannot hide.
//! * [`LoopbackMaster`]: a `mooncake_master` of a test's own on loopback ports, for tests
//!   that kill it mid-run without disturbing the shared one.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::MooncakeConfig;
use crate::L3Error;

/// The cluster the environment describes. `Ok(None)` (after printing `SKIPPED` with the
/// reason) when there is none outside CI; `Err` under CI.
pub fn cluster_from_env() -> Result<Option<MooncakeConfig>, L3Error> {
    if let Some(config) = MooncakeConfig::from_env() {
        return Ok(Some(config));
    }
    let msg = "Mooncake is not set up (MOONCAKE_STORE_LIBRARY unset): run `cargo xtask \
               mooncake up` and `eval $(cargo xtask mooncake env)`";
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
}

impl LoopbackMaster {
    /// Starts the `mooncake_master` that sits beside `cluster.library` (the wheel ships
    /// both) on the given ports, and waits up to 10 s until both accept connections.
    pub fn start(
        cluster: &MooncakeConfig,
        rpc_port: u16,
        metadata_port: u16,
        metrics_port: u16,
    ) -> Result<Self, L3Error> {
        let binary = cluster.library.with_file_name("mooncake_master");
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| L3Error::Io {
                path: binary.display().to_string(),
                source,
            })?;
        let master = Self {
            child,
            rpc_port,
            metadata_port,
        };
        let listening = |port| TcpStream::connect(("127.0.0.1", port)).is_ok();
        let ready = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            listening(rpc_port) && listening(metadata_port)
        });
        if !ready {
            return Err(L3Error::Config(format!(
                "{} did not listen on 127.0.0.1:{rpc_port} and :{metadata_port}",
                binary.display()
            )));
        }
        Ok(master)
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
    }
}
