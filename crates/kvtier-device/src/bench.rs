//! Copy bandwidth of the kernel library against plain memcpy of the same bytes.

use std::time::Instant;

use kvtier_types::TransferPair;

use crate::{DeviceError, KvArenas, KvGeometry};

/// One page size's result.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyBench {
    /// Bytes of one page (all layers).
    pub page_bytes: u64,
    /// Pages per batch.
    pub pages: u32,
    /// Write-back (device → host) bandwidth, GB/s (median of runs).
    pub kernel_gbps: f64,
    /// Plain memcpy of the same bytes, page by page, one thread, GB/s (median).
    pub memcpy_gbps: f64,
}

impl CopyBench {
    /// Kernel bandwidth as a fraction of memcpy's.
    pub fn ratio(&self) -> f64 {
        self.kernel_gbps / self.memcpy_gbps
    }
}

/// The median of `v` (the upper one of an even count); `v` must not be empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures pages of `page_kib` KiB (8 layers × K/V, so one item is `page_kib / 16` KiB),
/// batches of about 64 MiB, `runs` interleaved runs of each side.
pub fn measure_copy(page_kib: u32, runs: usize, threads: u32) -> Result<CopyBench, DeviceError> {
    let geometry = KvGeometry {
        layers: 8,
        planes: 2,
        heads: 1,
        head_dim: 64,
        dtype_bytes: 2,
        page_size: (page_kib * 1024 / 16 / 128).max(1),
    };
    geometry.validate()?;
    let page_bytes = geometry.page_bytes();
    let pages = ((64u64 << 20) / page_bytes).clamp(16, 4096) as u32;
    let mut arenas = KvArenas::new(geometry, pages + 1, pages + 1, threads)?;
    let pairs: Vec<TransferPair> = (1..=pages)
        .map(|p| TransferPair::kv(p, pages + 1 - p))
        .collect();
    let total = page_bytes as usize * pages as usize;
    let src = vec![7u8; total];
    let mut dst = vec![0u8; total];
    let (mut kernel, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        arenas.write_back(&pairs)?;
        kernel.push(total as f64 / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        for (d, s) in dst
            .chunks_exact_mut(page_bytes as usize)
            .zip(src.chunks_exact(page_bytes as usize))
        {
            d.copy_from_slice(s);
        }
        plain.push(total as f64 / t.elapsed().as_secs_f64() / 1e9);
        std::hint::black_box(&dst);
    }
    Ok(CopyBench {
        page_bytes,
        pages,
        kernel_gbps: median(kernel),
        memcpy_gbps: median(plain),
    })
}
