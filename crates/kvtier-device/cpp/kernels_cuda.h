// kvtier page-copy kernel library, CUDA backend: its own C++ interface.
//
// The same two arenas and operations as the CPU backend (kernels.h), with the device arena
// in GPU memory (cudaMalloc) and the host arena in pinned host memory (cudaHostAlloc):
//   device: layer-first  — for each (layer, plane), `device_pages` items of `item_bytes`;
//   host:   page-first   — for each page, its (layer, plane) items back to back.
// A row is one (layer, plane): row = layer * planes + plane.
//
// This header is plain C++17: no CUDA and no cxx types, so that both nvcc (for
// kernels_cuda.cu) and the host compiler (for the cxx glue in cuda_bridge.cc) can read it.
// Every call reports the first CUDA runtime call that failed; none throws. Bounds are
// checked by the Rust caller; this layer only moves bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvtier {
namespace cuda {

// The outcome of a sequence of CUDA runtime calls: `code` 0 is success, otherwise the
// cudaError_t of the first call that failed.
struct Status {
  int code = 0;
  // True when the failure means there is no usable device (no driver, no GPU).
  bool no_device = false;
  std::string call;     // the runtime call that failed, e.g. "cudaGetDeviceCount"
  std::string name;     // cudaGetErrorName, e.g. "cudaErrorInsufficientDriver"
  std::string message;  // cudaGetErrorString
  bool ok() const { return code == 0; }
};

// Device 0, as the runtime sees it.
struct DeviceInfo {
  int ordinal = 0;
  int device_count = 0;
  int driver_version = 0;   // cudaDriverGetVersion: 0 when no driver is loaded
  int runtime_version = 0;  // cudaRuntimeGetVersion: the linked cudart
  std::string name;
  int major = 0;
  int minor = 0;
  uint64_t total_memory = 0;
  int multiprocessors = 0;
};

// Fills `info` (versions always, the rest when a device is there). Never aborts: with no
// driver or no GPU it returns a Status with `no_device` set.
Status probe(DeviceInfo& info);

struct Shape {
  uint32_t layers = 0;
  uint32_t planes = 0;
  uint64_t item_bytes = 0;
  uint32_t device_pages = 0;
  uint32_t host_pages = 0;
};

enum class Copy : uint8_t { DeviceToHost, HostToDevice, DeviceToDevice };

// How host<->device copies run. Device-to-device copies and zeroing always use kernels.
enum class HostPath : uint8_t {
  // A gather/scatter kernel reading or writing the (mapped) pinned host arena.
  Kernel,
  // cudaMemcpy2DAsync per page on the copy engines, leaving the SMs free.
  CopyEngine,
};

class Arenas {
 public:
  // Allocates both arenas on device 0, zeroed. Null with `status` set on failure.
  static std::unique_ptr<Arenas> create(const Shape& shape, HostPath path, Status& status);
  ~Arenas();
  Arenas(const Arenas&) = delete;
  Arenas& operator=(const Arenas&) = delete;

  // Copies layers [first_layer, first_layer + layer_count) of each (src[i], dst[i]) pair,
  // as one batch on the arenas' stream, and waits for it.
  Status copy(Copy dir, const uint32_t* src, const uint32_t* dst, size_t pairs,
              uint32_t first_layer, uint32_t layer_count);
  // Zeroes every layer of the device pages, as one batch, and waits for it.
  Status zero_device(const uint32_t* pages, size_t count);
  // Copies one item (item_bytes) out of / into an arena.
  Status read_item(bool device, uint32_t page, uint32_t layer, uint32_t plane, uint8_t* out);
  Status write_item(bool device, uint32_t page, uint32_t layer, uint32_t plane,
                    const uint8_t* bytes);

  const DeviceInfo& device() const;
  uint64_t item_bytes() const;

 private:
  struct Impl;
  explicit Arenas(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda
}  // namespace kvtier
