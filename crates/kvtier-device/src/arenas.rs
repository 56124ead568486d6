//! The device and host KV arenas and the checked copy operations over them.

use std::ops::Range;

use cxx::UniquePtr;
use kvtier_types::{PageId, Tier, TransferKind, TransferPair};

use crate::ffi::bridge::{self, ArenaSpec, Direction};
use crate::{DeviceError, KvGeometry};

/// Device arena (layer-first) and host arena (page-first), each with page 0 reserved.
pub struct KvArenas {
    inner: UniquePtr<bridge::KvArenas>,
    geometry: KvGeometry,
    device_pages: u32,
    host_pages: u32,
}

impl std::fmt::Debug for KvArenas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvArenas")
            .field("geometry", &self.geometry)
            .field("device_pages", &self.device_pages)
            .field("host_pages", &self.host_pages)
            .finish()
    }
}

impl KvArenas {
    /// Allocates both arenas (pool sizes include page 0), zeroed. Copies of large batches
    /// use up to `threads` threads.
    pub fn new(
        geometry: KvGeometry,
        device_pages: u32,
        host_pages: u32,
        threads: u32,
    ) -> Result<Self, DeviceError> {
        geometry.validate()?;
        let page = geometry.page_bytes();
        let bytes = page
            .checked_mul(u64::from(device_pages) + u64::from(host_pages))
            .ok_or(DeviceError::Allocation { bytes: u64::MAX })?;
        let spec = ArenaSpec {
            layers: geometry.layers,
            planes: geometry.planes,
            item_bytes: geometry.item_bytes(),
            device_pages,
            host_pages,
            threads: threads.max(1),
        };
        let inner = bridge::new_arenas(&spec);
        if inner.is_null() {
            return Err(DeviceError::Allocation { bytes });
        }
        Ok(Self {
            inner,
            geometry,
            device_pages,
            host_pages,
        })
    }

    /// The KV geometry.
    pub fn geometry(&self) -> &KvGeometry {
        &self.geometry
    }

    /// The kernel backend in use.
    pub fn backend(&self) -> &str {
        self.inner.as_ref().map_or("none", |a| a.backend_name())
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

    fn run(&mut self, dir: Direction, src: &[PageId], dst: &[PageId], layers: Range<u32>) {
        let count = layers.end - layers.start;
        bridge::copy_pages(self.inner.pin_mut(), dir, src, dst, layers.start, count);
    }

    /// Copies device pages to host pages, all layers (`src` = device, `dst` = host).
    pub fn write_back(&mut self, pairs: &[TransferPair]) -> Result<(), DeviceError> {
        let (src, dst) = self.lists(pairs, Tier::Device, Tier::Host)?;
        self.run(Direction::DeviceToHost, &src, &dst, 0..self.geometry.layers);
        Ok(())
    }

    /// Copies host pages to device pages for `layers` (`src` = host, `dst` = device); a
    /// forward can start on a layer as soon as its load has landed.
    pub fn load_back(
        &mut self,
        pairs: &[TransferPair],
        layers: Range<u32>,
    ) -> Result<(), DeviceError> {
        self.check_layers(&layers)?;
        let (src, dst) = self.lists(pairs, Tier::Host, Tier::Device)?;
        self.run(Direction::HostToDevice, &src, &dst, layers);
        Ok(())
    }

    /// Copies device pages to other device pages, all layers.
    pub fn copy_device(&mut self, pairs: &[TransferPair]) -> Result<(), DeviceError> {
        let (src, dst) = self.lists(pairs, Tier::Device, Tier::Device)?;
        self.run(
            Direction::DeviceToDevice,
            &src,
            &dst,
            0..self.geometry.layers,
        );
        Ok(())
    }

    /// Zeroes device pages, all layers.
    pub fn zero_device(&mut self, pages: &[PageId]) -> Result<(), DeviceError> {
        for &page in pages {
            self.check(Tier::Device, page)?;
        }
        bridge::zero_device_pages(self.inner.pin_mut(), pages);
        Ok(())
    }

    /// The bytes of one page of one plane of one layer on `tier`.
    pub fn item_mut(
        &mut self,
        tier: Tier,
        page: PageId,
        layer: u32,
        plane: u32,
    ) -> Result<&mut [u8], DeviceError> {
        self.check(tier, page)?;
        self.check_layers(&(layer..layer + 1))?;
        if plane >= self.geometry.planes {
            return Err(DeviceError::InvalidGeometry(format!(
                "plane {plane} of {}",
                self.geometry.planes
            )));
        }
        let arenas = self.inner.pin_mut();
        Ok(match tier {
            Tier::Device => arenas.device_item(page, layer, plane),
            Tier::Host => arenas.host_item(page, layer, plane),
        })
    }
}
