//! The device and host KV arenas and the checked copy operations over them.

use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

use cxx::UniquePtr;
use kvtier_host::{HostArena, PagesWrite};
use kvtier_types::{PageId, Tier, TransferKind, TransferPair};

use crate::ffi::bridge::{self, ArenaSpec, Direction};
use crate::{DeviceError, KvGeometry};

/// Device arena (layer-first) and host arena (page-first), each with page 0 reserved.
///
/// The host arena is a [`HostArena`] shared with the L3 actor ([`Self::host_arena`]):
/// every copy borrows the host pages it touches, so a copy and an L3 transfer can never
/// meet on a page (a conflict is [`DeviceError::Host`], and the copy moves nothing).
pub struct KvArenas {
    // Declared before `host`: the C++ arenas point into it and must go first.
    inner: UniquePtr<bridge::KvArenas>,
    host: Arc<HostArena>,
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
            .checked_mul(u64::from(device_pages))
            .ok_or(DeviceError::Allocation { bytes: u64::MAX })?;
        let host = Arc::new(HostArena::new(host_pages.max(1), page)?);
        let spec = ArenaSpec {
            layers: geometry.layers,
            planes: geometry.planes,
            item_bytes: geometry.item_bytes(),
            device_pages,
            host_pages,
            host_base: host.region().0,
            threads: threads.max(1),
        };
        let inner = bridge::new_arenas(&spec);
        if inner.is_null() {
            return Err(DeviceError::Allocation { bytes });
        }
        Ok(Self {
            inner,
            host,
            geometry,
            device_pages,
            host_pages,
        })
    }

    /// The KV geometry.
    pub fn geometry(&self) -> &KvGeometry {
        &self.geometry
    }

    /// The host arena, to share with the L3 actor (it gets into and puts from the same
    /// pages the kernels copy).
    pub fn host_arena(&self) -> Arc<HostArena> {
        Arc::clone(&self.host)
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
        let host = Arc::clone(&self.host);
        let _borrowed = host.write(&dst)?;
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
        let host = Arc::clone(&self.host);
        let _borrowed = host.read(&src)?;
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

    /// The bytes of one page of one plane of one layer of the device arena.
    pub fn device_item(
        &mut self,
        page: PageId,
        layer: u32,
        plane: u32,
    ) -> Result<&mut [u8], DeviceError> {
        self.check_item(Tier::Device, page, layer, plane)?;
        Ok(self.inner.pin_mut().device_item(page, layer, plane))
    }

    /// The bytes of one page of one plane of one layer on `tier`. A host item holds a
    /// write borrow of its page until it is dropped.
    pub fn item_mut(
        &mut self,
        tier: Tier,
        page: PageId,
        layer: u32,
        plane: u32,
    ) -> Result<ItemMut<'_>, DeviceError> {
        if tier == Tier::Device {
            return Ok(ItemMut::Device(self.device_item(page, layer, plane)?));
        }
        self.check_item(tier, page, layer, plane)?;
        let item = self.geometry.item_bytes() as usize;
        let at = (layer * self.geometry.planes + plane) as usize * item;
        Ok(ItemMut::Host {
            page: self.host.write(&[page])?,
            at: at..at + item,
        })
    }

    fn check_item(
        &self,
        tier: Tier,
        page: PageId,
        layer: u32,
        plane: u32,
    ) -> Result<(), DeviceError> {
        self.check(tier, page)?;
        self.check_layers(&(layer..layer + 1))?;
        if plane >= self.geometry.planes {
            return Err(DeviceError::InvalidGeometry(format!(
                "plane {plane} of {}",
                self.geometry.planes
            )));
        }
        Ok(())
    }
}

/// One item's bytes (see [`KvArenas::item_mut`]).
#[derive(Debug)]
pub enum ItemMut<'a> {
    /// In the device arena.
    Device(&'a mut [u8]),
    /// In the host arena, under a write borrow of its page.
    Host {
        /// The borrowed page.
        page: PagesWrite<'a>,
        /// The item's bytes within the page.
        at: Range<usize>,
    },
}

impl Deref for ItemMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ItemMut::Device(bytes) => bytes,
            ItemMut::Host { page, at } => &page.page(0)[at.clone()],
        }
    }
}

impl DerefMut for ItemMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            ItemMut::Device(bytes) => bytes,
            ItemMut::Host { page, at } => &mut page.page_mut(0)[at.clone()],
        }
    }
}
