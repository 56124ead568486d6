// The cxx glue of the CUDA backend: adapts kernels_cuda.h to the bridge in
// src/cuda_ffi.rs. Compiled by the host C++ compiler; only kernels_cuda.cu sees CUDA.
#pragma once

#include <cstdint>
#include <memory>

#include "kvtier-device/cpp/kernels_cuda.h"
#include "rust/cxx.h"

namespace kvtier {
namespace cuda_ffi {

struct CudaStatus;
struct CudaDeviceInfo;
struct CudaArenaSpec;
enum class CudaCopy : uint8_t;

// The backend's arenas, as the bridge's opaque type.
class CudaArenas {
 public:
  explicit CudaArenas(std::unique_ptr<cuda::Arenas> arenas) : inner(std::move(arenas)) {}
  std::unique_ptr<cuda::Arenas> inner;
};

CudaStatus cuda_probe(CudaDeviceInfo& info);
std::unique_ptr<CudaArenas> cuda_new_arenas(const CudaArenaSpec& spec, CudaStatus& status);
CudaStatus cuda_copy_pages(CudaArenas& arenas, CudaCopy dir, rust::Slice<const uint32_t> src,
                           rust::Slice<const uint32_t> dst, uint32_t first_layer,
                           uint32_t layer_count);
CudaStatus cuda_zero_device_pages(CudaArenas& arenas, rust::Slice<const uint32_t> pages);
CudaStatus cuda_read_item(CudaArenas& arenas, bool device, uint32_t page, uint32_t layer,
                          uint32_t plane, rust::Slice<uint8_t> out);
CudaStatus cuda_write_item(CudaArenas& arenas, bool device, uint32_t page, uint32_t layer,
                           uint32_t plane, rust::Slice<const uint8_t> bytes);

}  // namespace cuda_ffi
}  // namespace kvtier
