// The cxx glue of the CUDA backend (see cuda_bridge.h).
#include "kvtier-device/cpp/cuda_bridge.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kvtier-device/src/cuda_ffi.rs.h"

namespace kvtier {
namespace cuda_ffi {
namespace {

CudaStatus to_ffi(const cuda::Status& status) {
  CudaStatus out;
  out.code = status.code;
  out.no_device = status.no_device;
  out.call = rust::String(status.call);
  out.name = rust::String(status.name);
  out.message = rust::String(status.message);
  return out;
}

// A request the Rust side should never make (it checks sizes first).
CudaStatus invalid(const char* call, const std::string& message) {
  cuda::Status status;
  status.code = 1;  // cudaErrorInvalidValue
  status.call = call;
  status.name = "cudaErrorInvalidValue";
  status.message = message;
  return to_ffi(status);
}

void fill(const cuda::DeviceInfo& from, CudaDeviceInfo& to) {
  to.ordinal = from.ordinal;
  to.device_count = from.device_count;
  to.driver_version = from.driver_version;
  to.runtime_version = from.runtime_version;
  to.name = rust::String(from.name);
  to.major = from.major;
  to.minor = from.minor;
  to.total_memory = from.total_memory;
  to.multiprocessors = from.multiprocessors;
}

}  // namespace

CudaStatus cuda_probe(CudaDeviceInfo& info) {
  cuda::DeviceInfo found;
  const cuda::Status status = cuda::probe(found);
  fill(found, info);
  return to_ffi(status);
}

std::unique_ptr<CudaArenas> cuda_new_arenas(const CudaArenaSpec& spec, CudaStatus& status) {
  cuda::Shape shape;
  shape.layers = spec.layers;
  shape.planes = spec.planes;
  shape.item_bytes = spec.item_bytes;
  shape.device_pages = spec.device_pages;
  shape.host_pages = spec.host_pages;
  const cuda::HostPath path = spec.copy_engine ? cuda::HostPath::CopyEngine : cuda::HostPath::Kernel;
  cuda::Status result;
  auto arenas = cuda::Arenas::create(shape, path, result);
  status = to_ffi(result);
  if (arenas == nullptr) return nullptr;
  return std::make_unique<CudaArenas>(std::move(arenas));
}

CudaStatus cuda_copy_pages(CudaArenas& arenas, CudaCopy dir, rust::Slice<const uint32_t> src,
                           rust::Slice<const uint32_t> dst, uint32_t first_layer,
                           uint32_t layer_count) {
  cuda::Copy copy = cuda::Copy::DeviceToDevice;
  switch (dir) {
    case CudaCopy::DeviceToHost:
      copy = cuda::Copy::DeviceToHost;
      break;
    case CudaCopy::HostToDevice:
      copy = cuda::Copy::HostToDevice;
      break;
    case CudaCopy::DeviceToDevice:
      copy = cuda::Copy::DeviceToDevice;
      break;
  }
  const size_t pairs = std::min(src.size(), dst.size());
  return to_ffi(arenas.inner->copy(copy, src.data(), dst.data(), pairs, first_layer, layer_count));
}

CudaStatus cuda_zero_device_pages(CudaArenas& arenas, rust::Slice<const uint32_t> pages) {
  return to_ffi(arenas.inner->zero_device(pages.data(), pages.size()));
}

CudaStatus cuda_read_item(CudaArenas& arenas, bool device, uint32_t page, uint32_t layer,
                          uint32_t plane, rust::Slice<uint8_t> out) {
  if (out.size() != arenas.inner->item_bytes()) {
    return invalid("cuda_read_item", "the buffer is not one item long");
  }
  return to_ffi(arenas.inner->read_item(device, page, layer, plane, out.data()));
}

CudaStatus cuda_write_item(CudaArenas& arenas, bool device, uint32_t page, uint32_t layer,
                           uint32_t plane, rust::Slice<const uint8_t> bytes) {
  if (bytes.size() != arenas.inner->item_bytes()) {
    return invalid("cuda_write_item", "the bytes are not one item long");
  }
  return to_ffi(arenas.inner->write_item(device, page, layer, plane, bytes.data()));
}

}  // namespace cuda_ffi
}  // namespace kvtier
