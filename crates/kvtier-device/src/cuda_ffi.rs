//! The cxx bridge to the CUDA backend (`cpp/kernels_cuda.cu`, through `cpp/cuda_bridge.h`).

#[allow(
    unsafe_code,
    reason = "the cxx bridge expands to FFI glue; no unsafe code of ours"
)]
#[cxx::bridge(namespace = "kvtier::cuda_ffi")]
pub(crate) mod bridge {
    /// Outcome of a backend call: `code` 0 is success, else the failing call's cudaError_t.
    #[derive(Debug)]
    struct CudaStatus {
        code: i32,
        /// The failure means there is no usable device (no driver, no GPU).
        no_device: bool,
        call: String,
        name: String,
        message: String,
    }

    /// Device 0 as the runtime sees it; versions are filled in even without a device.
    #[derive(Debug)]
    struct CudaDeviceInfo {
        ordinal: i32,
        device_count: i32,
        driver_version: i32,
        runtime_version: i32,
        name: String,
        major: i32,
        minor: i32,
        total_memory: u64,
        multiprocessors: i32,
    }

    /// Shape of the two arenas, and how host copies run.
    struct CudaArenaSpec {
        layers: u32,
        planes: u32,
        item_bytes: u64,
        device_pages: u32,
        host_pages: u32,
        copy_engine: bool,
    }

    /// Which way a copy goes.
    #[repr(u8)]
    enum CudaCopy {
        DeviceToHost,
        HostToDevice,
        DeviceToDevice,
    }

    unsafe extern "C++" {
        include!("kvtier-device/cpp/cuda_bridge.h");

        type CudaArenas;

        fn cuda_probe(info: &mut CudaDeviceInfo) -> CudaStatus;
        /// Allocates both arenas on device 0, zeroed; null with `status` set on failure.
        fn cuda_new_arenas(spec: &CudaArenaSpec, status: &mut CudaStatus) -> UniquePtr<CudaArenas>;
        fn cuda_copy_pages(
            arenas: Pin<&mut CudaArenas>,
            dir: CudaCopy,
            src: &[u32],
            dst: &[u32],
            first_layer: u32,
            layer_count: u32,
        ) -> CudaStatus;
        fn cuda_zero_device_pages(arenas: Pin<&mut CudaArenas>, pages: &[u32]) -> CudaStatus;
        fn cuda_read_item(
            arenas: Pin<&mut CudaArenas>,
            device: bool,
            page: u32,
            layer: u32,
            plane: u32,
            out: &mut [u8],
        ) -> CudaStatus;
        fn cuda_write_item(
            arenas: Pin<&mut CudaArenas>,
            device: bool,
            page: u32,
            layer: u32,
            plane: u32,
            bytes: &[u8],
        ) -> CudaStatus;
    }
}

// The arenas are process-wide CUDA allocations and a stream, none bound to the thread that
// made them (every call selects the device on the calling thread first); the Rust wrapper
// only hands out access through `&mut self`, so moving them to another thread is sound.
#[allow(unsafe_code, reason = "opaque C++ type without thread affinity")]
unsafe impl Send for bridge::CudaArenas {}
