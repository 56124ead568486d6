//! The CUDA backend of the kernel library (feature `cuda`).
//!
//! [`probe`] says which GPU the backend would use, or why there is none, as a typed
//! [`DeviceError::NoCudaDevice`] (never a crash: on a machine without a driver or a GPU the
//! CUDA runtime answers with an error code, which this reports).
//!
//! [`CudaArenas`] holds the same two arenas as [`crate::KvArenas`], in the same layouts,
//! with the device arena in GPU memory (`cudaMalloc`) and the host arena in pinned host
//! memory (`cudaHostAlloc`), and runs the same checked operations: write-back (device →
//! host), load-back (host → device, all layers or a layer range), device → device and
//! zeroing. Each batch runs on the arenas' stream and has landed when the call returns.
//! Device bytes are reached through [`CudaArenas::read_item`] and
//! [`CudaArenas::write_item`], which copy.

use std::ops::Range;

use cxx::UniquePtr;
use kvtier_types::{PageId, Tier, TransferKind, TransferPair};

use crate::cuda_ffi::bridge::{self, CudaArenaSpec, CudaCopy, CudaDeviceInfo, CudaStatus};
use crate::{DeviceError, KvGeometry};

/// The GPU the backend uses (device 0), as [`probe`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDevice {
    /// Its CUDA ordinal.
    pub ordinal: u32,
    /// How many devices the runtime sees.
    pub device_count: u32,
    /// Its name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0).
    pub compute_capability: (u32, u32),
    /// Global memory, bytes.
    pub total_memory: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// The driver's CUDA version, `1000 * major + 10 * minor`.
    pub driver_version: u32,
    /// The linked CUDA runtime's version, `1000 * major + 10 * minor`.
    pub runtime_version: u32,
}

/// How host ↔ device copies run. Device → device copies and zeroing always use kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostCopy {
    /// A gather/scatter kernel that reads or writes the pinned host arena directly: one
    /// launch per batch.
    #[default]
    Kernel,
    /// One `cudaMemcpy2DAsync` per page on the copy engines, leaving the SMs free.
    CopyEngine,
}

fn non_negative(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

fn empty_info() -> CudaDeviceInfo {
    CudaDeviceInfo {
        ordinal: 0,
        device_count: 0,
        driver_version: 0,
        runtime_version: 0,
        name: String::new(),
        major: 0,
        minor: 0,
        total_memory: 0,
        multiprocessors: 0,
    }
}

fn empty_status() -> CudaStatus {
    CudaStatus {
        code: 0,
        no_device: false,
        call: String::new(),
        name: String::new(),
        message: String::new(),
    }
}

/// The typed error for a failed status (`status.code != 0`).
fn cuda_error(status: CudaStatus, info: &CudaDeviceInfo) -> DeviceError {
    if status.no_device {
        DeviceError::NoCudaDevice {
            call: status.call,
            code: status.code,
            name: status.name,
            message: status.message,
            driver_version: non_negative(info.driver_version),
            runtime_version: non_negative(info.runtime_version),
        }
    } else {
        DeviceError::Cuda {
            call: status.call,
            code: status.code,
            name: status.name,
            message: status.message,
        }
    }
}

fn check_status(status: CudaStatus) -> Result<(), DeviceError> {
    if status.code == 0 {
        Ok(())
    } else {
        Err(cuda_error(status, &empty_info()))
    }
}

/// Finds device 0 and its properties. Without a driver or a GPU this is
/// [`DeviceError::NoCudaDevice`], whose message starts with
/// `no CUDA device: cudaGetDeviceCount returned …`.
pub fn probe() -> Result<CudaDevice, DeviceError> {
    let mut info = empty_info();
    let status = bridge::cuda_probe(&mut info);
    if status.code != 0 {
        return Err(cuda_error(status, &info));
    }
    Ok(CudaDevice {
        ordinal: non_negative(info.ordinal),
        device_count: non_negative(info.device_count),
        name: info.name,
        compute_capability: (non_negative(info.major), non_negative(info.minor)),
        total_memory: info.total_memory,
        multiprocessors: non_negative(info.multiprocessors),
        driver_version: non_negative(info.driver_version),
        runtime_version: non_negative(info.runtime_version),
    })
}

/// Device arena (layer-first, GPU memory) and host arena (page-first, pinned host memory),
/// each with page 0 reserved; the CUDA counterpart of [`crate::KvArenas`].
pub struct CudaArenas {
    inner: UniquePtr<bridge::CudaArenas>,
    geometry: KvGeometry,
    device_pages: u32,
    host_pages: u32,
    device: CudaDevice,
    host_copy: HostCopy,
}

impl std::fmt::Debug for CudaArenas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaArenas")
            .field("geometry", &self.geometry)
            .field("device_pages", &self.device_pages)
            .field("host_pages", &self.host_pages)
            .field("device", &self.device.name)
            .field("host_copy", &self.host_copy)
            .finish()
    }
}

impl CudaArenas {
    /// Allocates both arenas on device 0 (pool sizes include page 0), zeroed, with host
    /// copies by kernel ([`HostCopy::Kernel`]).
    pub fn new(
        geometry: KvGeometry,
        device_pages: u32,
        host_pages: u32,
    ) -> Result<Self, DeviceError> {
        Self::with_host_copy(geometry, device_pages, host_pages, HostCopy::default())
    }

    /// Allocates both arenas on device 0, zeroed, with host copies run as `host_copy` says.
    /// Without a device this is [`DeviceError::NoCudaDevice`]; out of memory,
    /// [`DeviceError::Allocation`].
    pub fn with_host_copy(
        geometry: KvGeometry,
        device_pages: u32,
        host_pages: u32,
        host_copy: HostCopy,
    ) -> Result<Self, DeviceError> {
        geometry.validate()?;
        let page = geometry.page_bytes();
        let bytes = page
            .checked_mul(u64::from(device_pages) + u64::from(host_pages))
            .ok_or(DeviceError::Allocation { bytes: u64::MAX })?;
        let device = probe()?;
        let spec = CudaArenaSpec {
            layers: geometry.layers,
            planes: geometry.planes,
            item_bytes: geometry.item_bytes(),
            device_pages,
            host_pages,
            copy_engine: host_copy == HostCopy::CopyEngine,
        };
        let mut status = empty_status();
        let inner = bridge::cuda_new_arenas(&spec, &mut status);
        if inner.is_null() || status.code != 0 {
            if status.code == 0 || status.name == "cudaErrorMemoryAllocation" {
                return Err(DeviceError::Allocation { bytes });
            }
            return Err(cuda_error(status, &empty_info()));
        }
        Ok(Self {
            inner,
            geometry,
            device_pages,
            host_pages,
            device,
            host_copy,
        })
    }

    /// The KV geometry.
    pub fn geometry(&self) -> &KvGeometry {
        &self.geometry
    }

    /// The kernel backend in use: `cuda`.
    pub fn backend(&self) -> &str {
        "cuda"
    }

    /// The GPU holding the device arena.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// How host ↔ device copies run.
    pub fn host_copy(&self) -> HostCopy {
        self.host_copy
    }

    fn check(&self, tier: Tier, page: PageId) -> Result<(), DeviceError> {
        let pages = match tier {
            Tier::Device => self.device_pages,
            Tier::Host => self.host_pages,
        };
        if page == 0 || page >= pages {
            return Err(DeviceError::PageOutOfRange { tier, page, pages });
        }
        Ok(())
    }

    fn check_layers(&self, layers: &Range<u32>) -> Result<(), DeviceError> {
        if layers.start > layers.end || layers.end > self.geometry.layers {
            return Err(DeviceError::LayerOutOfRange {
                first: layers.start,
                end: layers.end,
                layers: self.geometry.layers,
            });
        }
        Ok(())
    }

    fn check_item(
        &self,
        tier: Tier,
        page: PageId,
        layer: u32,
        plane: u32,
    ) -> Result<(), DeviceError> {
        self.check(tier, page)?;
        self.check_layers(&(layer..layer.saturating_add(1)))?;
        if plane >= self.geometry.planes {
            return Err(DeviceError::InvalidGeometry(format!(
                "plane {plane} of {}",
                self.geometry.planes
            )));
        }
        Ok(())
    }

    /// Splits KV pairs into source and destination lists after checking every page.
    fn lists(
        &self,
        pairs: &[TransferPair],
        from: Tier,
        to: Tier,
    ) -> Result<(Vec<PageId>, Vec<PageId>), DeviceError> {
        let mut src = Vec::with_capacity(pairs.len());
        let mut dst = Vec::with_capacity(pairs.len());
        for pair in pairs {
            if pair.kind != TransferKind::Kv {
                return Err(DeviceError::WrongKind("Mamba"));
            }
            self.check(from, pair.src)?;
            self.check(to, pair.dst)?;
            src.push(pair.src);
            dst.push(pair.dst);
        }
        Ok((src, dst))
    }

    fn run(
        &mut self,
        dir: CudaCopy,
        src: &[PageId],
        dst: &[PageId],
        layers: Range<u32>,
    ) -> Result<(), DeviceError> {
        let count = layers.end - layers.start;
        check_status(bridge::cuda_copy_pages(
            self.inner.pin_mut(),
            dir,
            src,
            dst,
            layers.start,
            count,
        ))
    }

    /// Copies device pages to host pages, all layers (`src` = device, `dst` = host).
    pub fn write_back(&mut self, pairs: &[TransferPair]) -> Result<(), DeviceError> {
        let (src, dst) = self.lists(pairs, Tier::Device, Tier::Host)?;
        self.run(CudaCopy::DeviceToHost, &src, &dst, 0..self.geometry.layers)
    }

    /// Copies host pages to device pages for `layers` (`src` = host, `dst` = device).
    pub fn load_back(
        &mut self,
        pairs: &[TransferPair],
        layers: Range<u32>,
    ) -> Result<(), DeviceError> {
        self.check_layers(&layers)?;
        let (src, dst) = self.lists(pairs, Tier::Host, Tier::Device)?;
        self.run(CudaCopy::HostToDevice, &src, &dst, layers)
    }

    /// Copies device pages to other device pages, all layers.
    pub fn copy_device(&mut self, pairs: &[TransferPair]) -> Result<(), DeviceError> {
        let (src, dst) = self.lists(pairs, Tier::Device, Tier::Device)?;
        self.run(
            CudaCopy::DeviceToDevice,
            &src,
            &dst,
            0..self.geometry.layers,
        )
    }

    /// Zeroes device pages, all layers.
    pub fn zero_device(&mut self, pages: &[PageId]) -> Result<(), DeviceError> {
        for &page in pages {
            self.check(Tier::Device, page)?;
        }
        check_status(bridge::cuda_zero_device_pages(self.inner.pin_mut(), pages))
    }

    /// A copy of the bytes of one page of one plane of one layer on `tier`.
    pub fn read_item(
        &mut self,
        tier: Tier,
        page: PageId,
        layer: u32,
        plane: u32,
    ) -> Result<Vec<u8>, DeviceError> {
        self.check_item(tier, page, layer, plane)?;
        let len = usize::try_from(self.geometry.item_bytes())
            .map_err(|_| DeviceError::InvalidGeometry("item larger than memory".into()))?;
        let mut out = vec![0u8; len];
        check_status(bridge::cuda_read_item(
            self.inner.pin_mut(),
            tier == Tier::Device,
            page,
            layer,
            plane,
            &mut out,
        ))?;
        Ok(out)
    }

    /// Overwrites one page of one plane of one layer on `tier` with `bytes` (exactly one
    /// item long).
    pub fn write_item(
        &mut self,
        tier: Tier,
        page: PageId,
        layer: u32,
        plane: u32,
        bytes: &[u8],
    ) -> Result<(), DeviceError> {
        self.check_item(tier, page, layer, plane)?;
        if bytes.len() as u64 != self.geometry.item_bytes() {
            return Err(DeviceError::InvalidGeometry(format!(
                "{} bytes given for an item of {}",
                bytes.len(),
                self.geometry.item_bytes()
            )));
        }
        check_status(bridge::cuda_write_item(
            self.inner.pin_mut(),
            tier == Tier::Device,
            page,
            layer,
            plane,
            bytes,
        ))
    }
}
