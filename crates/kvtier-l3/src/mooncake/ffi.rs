//! The cxx bridge to the Mooncake shim (`cpp/mooncake_shim.*`).

#[allow(
    unsafe_code,
    reason = "the cxx bridge expands to FFI glue; no unsafe code of ours"
)]
#[cxx::bridge(namespace = "kvtier")]
pub(crate) mod bridge {
    unsafe extern "C++" {
        include!("kvtier-l3/cpp/mooncake_shim.h");

        type MooncakeClient;

        /// Loads the library (and, without a real driver, the named CUDA stand-in).
        fn mooncake_open(library: &str, cuda_stub: &str) -> Result<UniquePtr<MooncakeClient>>;
        fn setup(
            self: &MooncakeClient,
            local_hostname: &str,
            metadata_server: &str,
            global_segment: u64,
            local_buffer: u64,
            protocol: &str,
            master: &str,
        ) -> i32;
        fn register_buffer(self: &MooncakeClient, addr: u64, len: u64) -> i32;
        fn unregister_buffer(self: &MooncakeClient, addr: u64) -> i32;
        fn batch_is_exist(self: &MooncakeClient, keys: &[String], out: &mut [i32]) -> i32;
        fn batch_put_from(
            self: &MooncakeClient,
            keys: &[String],
            addrs: &[u64],
            sizes: &[u64],
            out: &mut [i32],
        ) -> i32;
        fn batch_get_into(
            self: &MooncakeClient,
            keys: &[String],
            addrs: &[u64],
            sizes: &[u64],
            out: &mut [i64],
        ) -> i32;
        fn remove(self: &MooncakeClient, key: &str, force: bool) -> i32;
    }
}

// One client owned by one thread at a time: Mooncake's thread safety for a shared handle
// is untested, so the type is Send (movable to the L3 actor's thread) but not Sync.
#[allow(
    unsafe_code,
    reason = "opaque C++ client moved between threads, never shared"
)]
unsafe impl Send for bridge::MooncakeClient {}
