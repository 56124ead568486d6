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
///
/// A hybrid model's recurrent states live in a second pair of arenas of the same shape
/// ([`Self::with_states`]): a state slot is a page of one token whose items are the
/// state's layers, so the same kernels copy them. Pairs of kind
/// [`TransferKind::Mamba`] go there, pairs of kind [`TransferKind::Kv`] to the KV
/// arenas, within one op.
pub struct KvArenas {
    // Declared before `host`: the C++ arenas point into it and must go first.
    inner: UniquePtr<bridge::KvArenas>,
    host: Arc<HostArena>,
    geometry: KvGeometry,
    device_pages: u32,
    host_pages: u32,
    /// What these arenas hold: KV pages, or state slots.
    kind: TransferKind,
    /// The state arenas of a hybrid model.
    states: Option<Box<KvArenas>>,
}

/// The shape of a hybrid model's recurrent state: `layers` items of `bytes_per_layer`
/// (the conv and SSM states of one Mamba layer, as the engine lays them out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateGeometry {
    /// Mamba layers.
    pub layers: u32,
    /// Bytes of one layer's state (a multiple of 4: kernels copy 4-byte words).
    pub bytes_per_layer: u32,
}

impl StateGeometry {
    /// The KV-shaped geometry the kernels see: one token per page, one plane.
    fn as_pages(&self) -> KvGeometry {
        KvGeometry {
            layers: self.layers,
            planes: 1,
            heads: 1,
            head_dim: self.bytes_per_layer / 4,
            dtype_bytes: 4,
            page_size: 1,
        }
    }

    /// Bytes of one state slot.
    pub fn slot_bytes(&self) -> u64 {
        u64::from(self.layers) * u64::from(self.bytes_per_layer)
    }
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
            kind: TransferKind::Kv,
            states: None,
        })
    }

    /// Adds the state arenas of a hybrid model: `device_slots` and `host_slots` slots
    /// of `geometry`. State pools have no dummy slot: slot `s` is page `s + 1` of the
    /// state arenas, whose page 0 stays reserved like every arena's.
    pub fn with_states(
        mut self,
        geometry: StateGeometry,
        device_slots: u32,
        host_slots: u32,
    ) -> Result<Self, DeviceError> {
        if geometry.bytes_per_layer == 0 || !geometry.bytes_per_layer.is_multiple_of(4) {
            return Err(DeviceError::InvalidGeometry(format!(
                "a layer's state is {} bytes; kernels copy 4-byte words",
                geometry.bytes_per_layer
            )));
        }
        let mut states = KvArenas::new(
            geometry.as_pages(),
            device_slots.saturating_add(1),
            host_slots.saturating_add(1),
            1,
        )?;
        states.kind = TransferKind::Mamba;
        self.states = Some(Box::new(states));
        Ok(self)
    }

    /// Bytes of one state slot (0 without state arenas).
    pub fn state_slot_bytes(&self) -> u64 {
        self.states.as_ref().map_or(0, |s| s.geometry.page_bytes())
    }

    /// The host state arena, to share with the L3 actor, if these arenas have states.
    pub fn host_state_arena(&self) -> Option<Arc<HostArena>> {
        self.states.as_ref().map(|s| s.host_arena())
    }

    /// The bytes of one layer of a state slot on `tier` (a host slot holds a write
    /// borrow until dropped).
    pub fn state_item_mut(
        &mut self,
        tier: Tier,
        slot: u32,
        layer: u32,
    ) -> Result<ItemMut<'_>, DeviceError> {
        let states = self
            .states
            .as_mut()
            .ok_or(DeviceError::WrongKind("Mamba"))?;
        states.item_mut(tier, slot.saturating_add(1), layer, 0)
    }

    /// Copies device state slots to other device state slots (a copy-on-write source
    /// into a request's working slot).
    pub fn copy_device_states(&mut self, pairs: &[TransferPair]) -> Result<(), DeviceError> {
        let (kv, states) = self.by_kind(pairs)?;
        if !kv.is_empty() {
            return Err(DeviceError::WrongKind("KV"));
        }
        let arenas = self
            .states
            .as_mut()
            .ok_or(DeviceError::WrongKind("Mamba"))?;
        arenas.copy_device(&states)
    }

    /// Splits `pairs` by kind: this arena's own, and state pairs for the state arenas
    /// (refused when there are none), moved to the state arenas' page numbers (slot
    /// `s` is page `s + 1`).
    fn by_kind(
        &self,
        pairs: &[TransferPair],
    ) -> Result<(Vec<TransferPair>, Vec<TransferPair>), DeviceError> {
        let (mine, states): (Vec<TransferPair>, Vec<TransferPair>) =
            pairs.iter().partition(|p| p.kind == self.kind);
        if !states.is_empty() && self.states.is_none() {
            return Err(DeviceError::WrongKind("Mamba"));
        }
        let states = states
            .into_iter()
            .map(|p| TransferPair {
                kind: p.kind,
                src: p.src.saturating_add(1),
                dst: p.dst.saturating_add(1),
            })
            .collect();
        Ok((mine, states))
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
            if pair.kind != self.kind {
                return Err(DeviceError::WrongKind(match pair.kind {
                    TransferKind::Kv => "KV",
                    TransferKind::Mamba => "Mamba",
                }));
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

    /// Copies device pages to host pages, all layers (`src` = device, `dst` = host),
    /// and device state slots to host state slots. Every page and slot is checked
    /// before anything moves.
    pub fn write_back(&mut self, pairs: &[TransferPair]) -> Result<(), DeviceError> {
        if self.states.is_some() {
            let (mine, states) = self.by_kind(pairs)?;
            let (src, dst) = self.lists(&mine, Tier::Device, Tier::Host)?;
            if let Some(s) = self.states.as_ref() {
                s.lists(&states, Tier::Device, Tier::Host)?;
            }
            self.copy_out(&src, &dst)?;
            return match self.states.as_mut() {
                Some(s) => s.write_back(&states),
                None => Ok(()),
            };
        }
        let (src, dst) = self.lists(pairs, Tier::Device, Tier::Host)?;
        self.copy_out(&src, &dst)
    }

    fn copy_out(&mut self, src: &[PageId], dst: &[PageId]) -> Result<(), DeviceError> {
        let host = Arc::clone(&self.host);
        let _borrowed = host.write(dst)?;
        self.run(Direction::DeviceToHost, src, dst, 0..self.geometry.layers);
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
        if self.states.is_some() {
            let (mine, states) = self.by_kind(pairs)?;
            let (src, dst) = self.lists(&mine, Tier::Host, Tier::Device)?;
            if let Some(s) = self.states.as_ref() {
                s.lists(&states, Tier::Host, Tier::Device)?;
            }
            self.copy_in(&src, &dst, layers)?;
            return match self.states.as_mut() {
                // A state is loaded whole, whatever layers of KV this call covers.
                Some(s) => {
                    let all = 0..s.geometry.layers;
                    s.load_back(&states, all)
                }
                None => Ok(()),
            };
        }
        let (src, dst) = self.lists(pairs, Tier::Host, Tier::Device)?;
        self.copy_in(&src, &dst, layers)
    }

    fn copy_in(
        &mut self,
        src: &[PageId],
        dst: &[PageId],
        layers: Range<u32>,
    ) -> Result<(), DeviceError> {
        let host = Arc::clone(&self.host);
        let _borrowed = host.read(src)?;
        self.run(Direction::HostToDevice, src, dst, layers);
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

    /// The whole device arena at once, for a model runner that touches many items per
    /// row: one call across the kernel library instead of one per item.
    pub fn device_view(&mut self) -> DeviceView<'_> {
        let geometry = self.geometry;
        let pages = self.device_pages;
        DeviceView {
            bytes: self.inner.pin_mut().device_all(),
            geometry,
            pages,
        }
    }

    /// The device arena and, for a hybrid model, the device state arena at once: a state
    /// slot `s` is page `s + 1` of the state view, its layers the items of plane 0.
    pub fn device_views(&mut self) -> (DeviceView<'_>, Option<DeviceView<'_>>) {
        let geometry = self.geometry;
        let pages = self.device_pages;
        let states = self.states.as_mut().map(|s| s.device_view());
        (
            DeviceView {
                bytes: self.inner.pin_mut().device_all(),
                geometry,
                pages,
            },
            states,
        )
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

/// The device arena as one slice (see [`KvArenas::device_view`]): layer-first, a row of
/// `pages` items per (layer, plane).
#[derive(Debug)]
pub struct DeviceView<'a> {
    bytes: &'a mut [u8],
    geometry: KvGeometry,
    pages: u32,
}

impl DeviceView<'_> {
    /// The bytes of one item (one page of one plane of one layer).
    pub fn item(&mut self, page: PageId, layer: u32, plane: u32) -> Result<&mut [u8], DeviceError> {
        let g = &self.geometry;
        if page == 0 || page >= self.pages {
            return Err(DeviceError::PageOutOfRange {
                tier: Tier::Device,
                page,
                pages: self.pages,
            });
        }
        if layer >= g.layers || plane >= g.planes {
            return Err(DeviceError::LayerOutOfRange {
                first: layer,
                end: layer + 1,
                layers: g.layers,
            });
        }
        let item = g.item_bytes() as usize;
        let row = (layer * g.planes + plane) as usize;
        let at = (row * self.pages as usize + page as usize) * item;
        Ok(&mut self.bytes[at..at + item])
    }

    /// One token's slot of `page` (its `index`-th of the page) in every layer and
    /// plane, layer by layer: the bytes a reader of that position sees, with the page
    /// checked once rather than per item.
    pub fn token_slots(
        &self,
        page: PageId,
        index: u32,
    ) -> Result<impl Iterator<Item = &[u8]> + '_, DeviceError> {
        let (at, slot, row) = self.token_slot_at(page, index)?;
        Ok(self.bytes.chunks_exact(row).map(move |r| &r[at..at + slot]))
    }

    /// [`Self::token_slots`] for writing.
    pub fn token_slots_mut(
        &mut self,
        page: PageId,
        index: u32,
    ) -> Result<impl Iterator<Item = &mut [u8]> + '_, DeviceError> {
        let (at, slot, row) = self.token_slot_at(page, index)?;
        Ok(self
            .bytes
            .chunks_exact_mut(row)
            .map(move |r| &mut r[at..at + slot]))
    }

    /// Where a token's slot lies in each (layer, plane) row, the slot's bytes, and a
    /// row's bytes.
    fn token_slot_at(
        &self,
        page: PageId,
        index: u32,
    ) -> Result<(usize, usize, usize), DeviceError> {
        let g = &self.geometry;
        if page == 0 || page >= self.pages || index >= g.page_size {
            return Err(DeviceError::PageOutOfRange {
                tier: Tier::Device,
                page,
                pages: self.pages,
            });
        }
        let item = g.item_bytes() as usize;
        let slot = item / g.page_size as usize;
        let at = page as usize * item + index as usize * slot;
        Ok((at, slot, self.pages as usize * item))
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
