//! The cxx bridge to the C++ kernel library (`cpp/`).

#[allow(
    unsafe_code,
    reason = "the cxx bridge expands to FFI glue; no unsafe code of ours"
)]
#[cxx::bridge(namespace = "kvtier")]
pub(crate) mod bridge {
    /// Shape of the two arenas.
    struct ArenaSpec {
        layers: u32,
        planes: u32,
        item_bytes: u64,
        device_pages: u32,
        host_pages: u32,
        /// Address of the host arena (`kvtier_host::HostArena::region`), which outlives
        /// the C++ arenas.
        host_base: u64,
        threads: u32,
    }

    /// Which way a copy goes.
    #[repr(u8)]
    enum Direction {
        DeviceToHost,
        HostToDevice,
        DeviceToDevice,
    }

    unsafe extern "C++" {
        include!("kvtier-device/cpp/kernels.h");

        type KvArenas;

        /// Allocates both arenas, zeroed; null when memory is short.
        fn new_arenas(spec: &ArenaSpec) -> UniquePtr<KvArenas>;
        fn copy_pages(
            arenas: Pin<&mut KvArenas>,
            dir: Direction,
            src: &[u32],
            dst: &[u32],
            first_layer: u32,
            layer_count: u32,
        );
        fn zero_device_pages(arenas: Pin<&mut KvArenas>, pages: &[u32]);
        fn device_item(self: Pin<&mut KvArenas>, page: u32, layer: u32, plane: u32) -> &mut [u8];
        /// The whole device arena: (layer, plane) rows of `device_pages` items each.
        fn device_all(self: Pin<&mut KvArenas>) -> &mut [u8];
        fn backend_name(self: &KvArenas) -> &str;
    }
}

// The C++ arenas own plain heap memory with no thread affinity; the Rust wrapper only
// hands out access through `&mut self`, so moving them to another thread is sound.
#[allow(unsafe_code, reason = "opaque C++ type without thread affinity")]
unsafe impl Send for bridge::KvArenas {}
