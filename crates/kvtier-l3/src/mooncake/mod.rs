//! `MooncakeStore`: a real Mooncake cluster as the L3 store.
//!
//! Semantics respected (spec/mooncake-and-device.md §5): puts are write-once (a put of an
//! existing key succeeds and keeps the old value); exists and gets grant leases; the
//! master evicts silently, so an exists is only a hint and a get may miss; every error is
//! per key. Gets and puts are zero-copy from buffers inside regions registered with
//! [`MooncakeStore::register`] (the host arena); a buffer outside them reads as a miss.

mod ffi;
#[cfg(feature = "testing")]
pub mod testing;

use std::path::PathBuf;

use cxx::UniquePtr;

use crate::backend::{Capabilities, L3Backend, L3Stats, PutOutcome, check_batch};
use crate::{L3Error, L3Key};
use ffi::bridge;

/// How to reach a Mooncake cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MooncakeConfig {
    /// `libmooncake_store.so` (from the `tokenspeed-mooncake` wheel).
    pub library: PathBuf,
    /// A `libcuda.so.1` stand-in to load when no real driver loads (machines without a
    /// GPU); `None` in production.
    pub cuda_stub: Option<PathBuf>,
    /// Master RPC address, e.g. `127.0.0.1:50051`.
    pub master: String,
    /// Metadata server URL, e.g. `http://127.0.0.1:8080/metadata`.
    pub metadata: String,
    /// This client's address as others reach it.
    pub local_hostname: String,
    /// Memory this client contributes to the cluster.
    pub global_segment_bytes: u64,
    /// Staging buffer for non-zero-copy calls.
    pub local_buffer_bytes: u64,
    /// Transport: `tcp` or `rdma`.
    pub protocol: String,
}

impl MooncakeConfig {
    /// The config `cargo xtask mooncake run` describes in the environment
    /// (`MOONCAKE_STORE_LIBRARY`, `MC_CUDA_STUB`, `KVTIER_MOONCAKE_MASTER`,
    /// `KVTIER_MOONCAKE_METADATA`); `None` when the library is not named.
    pub fn from_env() -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Some(Self {
            library: var("MOONCAKE_STORE_LIBRARY")?.into(),
            cuda_stub: var("MC_CUDA_STUB").map(PathBuf::from),
            master: var("KVTIER_MOONCAKE_MASTER").unwrap_or_else(|| "127.0.0.1:50051".into()),
            metadata: var("KVTIER_MOONCAKE_METADATA")
                .unwrap_or_else(|| "http://127.0.0.1:8080/metadata".into()),
            local_hostname: "127.0.0.1".into(),
            global_segment_bytes: 64 << 20,
            local_buffer_bytes: 16 << 20,
            protocol: "tcp".into(),
        })
    }
}

/// A Mooncake client as an L3 backend.
pub struct MooncakeStore {
    client: UniquePtr<bridge::MooncakeClient>,
    stats: L3Stats,
}

impl std::fmt::Debug for MooncakeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MooncakeStore")
            .field("stats", &self.stats)
            .finish()
    }
}

fn failed(what: &str, code: i32) -> L3Error {
    L3Error::Io {
        path: format!("mooncake {what}"),
        source: std::io::Error::other(format!("code {code}")),
    }
}

impl MooncakeStore {
    /// Loads the library and joins the cluster.
    pub fn connect(cfg: &MooncakeConfig) -> Result<Self, L3Error> {
        let stub = cfg
            .cuda_stub
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let client =
            bridge::mooncake_open(&cfg.library.display().to_string(), &stub).map_err(|e| {
                L3Error::Io {
                    path: cfg.library.display().to_string(),
                    source: std::io::Error::other(e.what().to_owned()),
                }
            })?;
        let code = client.setup(
            &cfg.local_hostname,
            &cfg.metadata,
            cfg.global_segment_bytes,
            cfg.local_buffer_bytes,
            &cfg.protocol,
            &cfg.master,
        );
        if code != 0 {
            return Err(failed("setup", code));
        }
        Ok(Self {
            client,
            stats: L3Stats::default(),
        })
    }

    /// Registers a memory region (the host arena) for zero-copy gets and puts. The
    /// region must stay allocated while registered; Mooncake touches it only during
    /// calls that name buffers inside it.
    pub fn register(&mut self, region: &mut [u8]) -> Result<(), L3Error> {
        let code = self
            .client
            .register_buffer(region.as_mut_ptr() as u64, region.len() as u64);
        if code != 0 {
            return Err(failed("register_buffer", code));
        }
        Ok(())
    }

    /// Registers the host arena for zero-copy prefetches and backups. The arena must
    /// outlive this store (`L3Core` holds both and drops the store first).
    pub fn register_arena(&mut self, arena: &kvtier_host::HostArena) -> Result<(), L3Error> {
        let (addr, len) = arena.region();
        let code = self.client.register_buffer(addr, len);
        if code != 0 {
            return Err(failed("register_buffer", code));
        }
        Ok(())
    }

    /// Unregisters a region registered before.
    pub fn unregister(&mut self, region: &mut [u8]) -> Result<(), L3Error> {
        let code = self.client.unregister_buffer(region.as_mut_ptr() as u64);
        if code != 0 {
            return Err(failed("unregister_buffer", code));
        }
        Ok(())
    }
}

fn key_strings(keys: &[L3Key]) -> Vec<String> {
    keys.iter().map(|k| k.as_str().to_owned()).collect()
}

impl L3Backend for MooncakeStore {
    fn capabilities(&self) -> Capabilities {
        // Mooncake's C ABI has no existence options: the hint is not supported.
        Capabilities {
            prefetch_on_exist: false,
        }
    }

    fn exists(&mut self, keys: &[L3Key], _prefetch_to_memory: bool) -> Result<usize, L3Error> {
        if keys.is_empty() {
            return Ok(0);
        }
        let mut out = vec![0i32; keys.len()];
        let code = self.client.batch_is_exist(&key_strings(keys), &mut out);
        if code != 0 {
            return Err(failed("batch_is_exist", code));
        }
        Ok(out.iter().take_while(|&&r| r == 1).count())
    }

    fn get(&mut self, keys: &[L3Key], buffers: &mut [&mut [u8]]) -> Result<Vec<bool>, L3Error> {
        check_batch(keys.len(), buffers.len())?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let addrs: Vec<u64> = buffers.iter_mut().map(|b| b.as_mut_ptr() as u64).collect();
        let sizes: Vec<u64> = buffers.iter().map(|b| b.len() as u64).collect();
        let mut out = vec![0i64; keys.len()];
        // Per-key results carry the outcome; a batch-level failure is a miss everywhere.
        let _ = self
            .client
            .batch_get_into(&key_strings(keys), &addrs, &sizes, &mut out);
        let hits: Vec<bool> = out
            .iter()
            .zip(&sizes)
            .map(|(&r, &len)| r >= 0 && r as u64 == len)
            .collect();
        for &hit in &hits {
            if hit {
                self.stats.get_hits += 1;
            } else {
                self.stats.get_misses += 1;
            }
        }
        Ok(hits)
    }

    fn put(&mut self, keys: &[L3Key], buffers: &[&[u8]]) -> Result<Vec<PutOutcome>, L3Error> {
        check_batch(keys.len(), buffers.len())?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let addrs: Vec<u64> = buffers.iter().map(|b| b.as_ptr() as u64).collect();
        let sizes: Vec<u64> = buffers.iter().map(|b| b.len() as u64).collect();
        let mut out = vec![-1i32; keys.len()];
        let _ = self
            .client
            .batch_put_from(&key_strings(keys), &addrs, &sizes, &mut out);
        // Mooncake reports an existing key as success and keeps the old value.
        Ok(out
            .iter()
            .map(|&r| {
                if r == 0 {
                    PutOutcome::Stored
                } else {
                    PutOutcome::Failed
                }
            })
            .collect())
    }

    fn remove(&mut self, keys: &[L3Key]) -> Result<usize, L3Error> {
        Ok(keys
            .iter()
            .filter(|k| self.client.remove(k.as_str(), true) == 0)
            .count())
    }

    fn stats(&self) -> L3Stats {
        self.stats
    }
}
