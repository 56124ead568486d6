// CUDA backend of the page-copy kernels (built only with the cargo feature `cuda`).
//
// Memory: the device arena is one cudaMalloc, the host arena one cudaHostAlloc (pinned,
// mapped into the device's address space), both zeroed at creation. Each Arenas owns a
// non-blocking stream; every batch is enqueued on it and synchronised before returning,
// so a batch that returns OK has landed.
//
// Copies: one gather/scatter kernel moves items, one thread block per item (grid-stride
// over the batch's items, pair-major so consecutive blocks fill a host page's contiguous
// items), with 16-byte vector loads and stores when items are 16-byte multiples (4-byte
// words otherwise). It serves device->device copies, and host<->device copies by reading
// or writing the mapped pinned host arena directly (HostPath::Kernel). HostPath::CopyEngine
// moves host<->device pages with one cudaMemcpy2DAsync per page instead (a page's rows are
// evenly strided on both sides), leaving the SMs to compute. The page lists of a batch go
// to the device with one cudaMemcpyAsync from a pinned staging buffer.
#include "kernels_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace kvtier {
namespace cuda {
namespace {

constexpr unsigned kThreads = 256;
// Loads in flight per thread before its stores: hides the latency of reads over PCIe.
constexpr unsigned kUnroll = 4;
// Blocks per multiprocessor at most; the grid strides over the rest.
constexpr unsigned kBlocksPerSm = 16;
constexpr size_t kMinIndexEntries = 1024;
constexpr uint64_t kMinAlloc = 256;

Status failed(cudaError_t err, const char* call) {
  Status status;
  status.code = static_cast<int>(err);
  status.call = call;
  status.name = cudaGetErrorName(err);
  status.message = cudaGetErrorString(err);
  return status;
}

// Runs `call args`; on failure returns its Status from the enclosing function.
#define KVTIER_CUDA(call, args)                                      \
  do {                                                               \
    const cudaError_t kvtier_err_ = call args;                       \
    if (kvtier_err_ != cudaSuccess) return failed(kvtier_err_, #call); \
  } while (0)

// Where item (page, row) of an arena lives, as the device addresses it:
// base + page * page_stride + row * row_stride.
struct Side {
  uint8_t* base;
  uint64_t page_stride;
  uint64_t row_stride;
};

__device__ __forceinline__ uint8_t* item_at(const Side& side, uint32_t page, uint64_t row) {
  return side.base + page * side.page_stride + row * side.row_stride;
}

// Copies rows [first_row, first_row + rows) of each (src_pages[i], dst_pages[i]) pair.
// Item k of the batch is pair k / rows, row first_row + k % rows; block b copies items
// b, b + gridDim.x, ...; its threads copy the item's words.
template <typename Word>
__global__ void __launch_bounds__(kThreads)
    gather_scatter(Side src, Side dst, const uint32_t* __restrict__ src_pages,
                   const uint32_t* __restrict__ dst_pages, uint64_t items, uint64_t first_row,
                   uint64_t rows, uint64_t words) {
  for (uint64_t k = blockIdx.x; k < items; k += gridDim.x) {
    const uint64_t pair = k / rows;
    const uint64_t row = first_row + k % rows;
    const Word* from = reinterpret_cast<const Word*>(item_at(src, src_pages[pair], row));
    Word* to = reinterpret_cast<Word*>(item_at(dst, dst_pages[pair], row));
    for (uint64_t w0 = threadIdx.x; w0 < words; w0 += uint64_t{kThreads} * kUnroll) {
      Word v[kUnroll];
#pragma unroll
      for (unsigned u = 0; u < kUnroll; ++u) {
        const uint64_t w = w0 + uint64_t{u} * kThreads;
        if (w < words) v[u] = from[w];
      }
#pragma unroll
      for (unsigned u = 0; u < kUnroll; ++u) {
        const uint64_t w = w0 + uint64_t{u} * kThreads;
        if (w < words) to[w] = v[u];
      }
    }
  }
}

// Zeroes rows [0, rows) of each page in `pages`, item k being page k / rows, row k % rows.
template <typename Word>
__global__ void __launch_bounds__(kThreads)
    zero_items(Side dst, const uint32_t* __restrict__ pages, uint64_t items, uint64_t rows,
               uint64_t words) {
  for (uint64_t k = blockIdx.x; k < items; k += gridDim.x) {
    Word* to = reinterpret_cast<Word*>(item_at(dst, pages[k / rows], k % rows));
    for (uint64_t w = threadIdx.x; w < words; w += kThreads) to[w] = Word{};
  }
}

// The widest word that tiles an item. Arena bases are at least 256-byte aligned and every
// item starts at a multiple of item_bytes, so the items are aligned to it too.
enum class Width { k16, k4, k1 };

Width width_of(uint64_t item_bytes) {
  if (item_bytes % 16 == 0) return Width::k16;
  if (item_bytes % 4 == 0) return Width::k4;
  return Width::k1;
}

uint64_t word_bytes(Width width) {
  switch (width) {
    case Width::k16:
      return 16;
    case Width::k4:
      return 4;
    case Width::k1:
      return 1;
  }
  return 1;
}

}  // namespace

Status probe(DeviceInfo& info) {
  info = DeviceInfo{};
  // Both answer without a driver: the runtime's own version, and 0 for the driver.
  cudaRuntimeGetVersion(&info.runtime_version);
  cudaDriverGetVersion(&info.driver_version);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count <= 0) err = cudaErrorNoDevice;
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: nothing else has gone wrong
    Status status = failed(err, "cudaGetDeviceCount");
    status.no_device = true;
    return status;
  }
  info.device_count = count;
  info.ordinal = 0;
  cudaDeviceProp prop;
  err = cudaGetDeviceProperties(&prop, info.ordinal);
  if (err != cudaSuccess) return failed(err, "cudaGetDeviceProperties");
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  info.multiprocessors = prop.multiProcessorCount;
  return {};
}

struct Arenas::Impl {
  Shape shape;
  HostPath path = HostPath::Kernel;
  DeviceInfo device;
  int max_pitch = 0;
  unsigned max_blocks = 1;
  cudaStream_t stream = nullptr;
  uint8_t* device_arena = nullptr;
  uint8_t* host_arena = nullptr;      // the pinned host arena, as the host addresses it
  uint8_t* host_arena_dev = nullptr;  // the same memory, as the device addresses it
  uint32_t* staging = nullptr;        // pinned: a batch's page lists on their way over
  uint32_t* indices = nullptr;        // device: the batch's page lists
  size_t index_capacity = 0;          // entries of `staging` and of `indices`

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  ~Impl() {
    // Teardown cannot report; release what was allocated, in reverse.
    if (device.device_count > 0) cudaSetDevice(device.ordinal);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (indices != nullptr) cudaFree(indices);
    if (staging != nullptr) cudaFreeHost(staging);
    if (host_arena != nullptr) cudaFreeHost(host_arena);
    if (device_arena != nullptr) cudaFree(device_arena);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  uint64_t rows() const { return uint64_t{shape.layers} * shape.planes; }
  uint64_t device_bytes() const { return rows() * shape.device_pages * shape.item_bytes; }
  uint64_t host_bytes() const { return rows() * shape.host_pages * shape.item_bytes; }
  // Distance between consecutive rows of one device page.
  uint64_t device_pitch() const { return uint64_t{shape.device_pages} * shape.item_bytes; }

  Side device_side() const { return {device_arena, shape.item_bytes, device_pitch()}; }
  Side host_side() const { return {host_arena_dev, rows() * shape.item_bytes, shape.item_bytes}; }

  uint8_t* device_at(uint32_t page, uint64_t row) const {
    return device_arena + page * shape.item_bytes + row * device_pitch();
  }
  uint8_t* host_at(uint32_t page, uint64_t row) const {
    return host_arena + page * rows() * shape.item_bytes + row * shape.item_bytes;
  }

  Status allocate() {
    KVTIER_CUDA(cudaSetDevice, (device.ordinal));
    KVTIER_CUDA(cudaDeviceGetAttribute, (&max_pitch, cudaDevAttrMaxPitch, device.ordinal));
    max_blocks = std::max(1u, static_cast<unsigned>(device.multiprocessors) * kBlocksPerSm);
    // Fails here, not at the first batch, when this build has no kernel image for the GPU.
    cudaFuncAttributes attributes;
    KVTIER_CUDA(cudaFuncGetAttributes, (&attributes, gather_scatter<uint4>));
    KVTIER_CUDA(cudaStreamCreateWithFlags, (&stream, cudaStreamNonBlocking));
    const uint64_t device_size = std::max(device_bytes(), kMinAlloc);
    const uint64_t host_size = std::max(host_bytes(), kMinAlloc);
    KVTIER_CUDA(cudaMalloc, (reinterpret_cast<void**>(&device_arena), device_size));
    KVTIER_CUDA(cudaHostAlloc, (reinterpret_cast<void**>(&host_arena), host_size,
                                cudaHostAllocMapped | cudaHostAllocPortable));
    KVTIER_CUDA(cudaHostGetDevicePointer,
                (reinterpret_cast<void**>(&host_arena_dev), host_arena, 0));
    std::memset(host_arena, 0, host_size);
    KVTIER_CUDA(cudaMemsetAsync, (device_arena, 0, device_size, stream));
    KVTIER_CUDA(cudaStreamSynchronize, (stream));
    return reserve(kMinIndexEntries);
  }

  // Room for `entries` page ids in the staging and index buffers. No batch is in flight
  // (each one is synchronised), so the old buffers can go.
  Status reserve(size_t entries) {
    if (entries <= index_capacity) return {};
    const size_t capacity = std::max(entries, 2 * index_capacity);
    if (indices != nullptr) cudaFree(indices);
    if (staging != nullptr) cudaFreeHost(staging);
    indices = nullptr;
    staging = nullptr;
    index_capacity = 0;
    KVTIER_CUDA(cudaHostAlloc,
                (reinterpret_cast<void**>(&staging), capacity * sizeof(uint32_t), 0u));
    KVTIER_CUDA(cudaMalloc, (reinterpret_cast<void**>(&indices), capacity * sizeof(uint32_t)));
    index_capacity = capacity;
    return {};
  }

  // Sends the page lists `a` (and `b`, when given) to `indices` (a first, then b).
  Status upload(const uint32_t* a, const uint32_t* b, size_t count) {
    const size_t entries = b != nullptr ? 2 * count : count;
    Status status = reserve(entries);
    if (!status.ok()) return status;
    std::memcpy(staging, a, count * sizeof(uint32_t));
    if (b != nullptr) std::memcpy(staging + count, b, count * sizeof(uint32_t));
    KVTIER_CUDA(cudaMemcpyAsync, (indices, staging, entries * sizeof(uint32_t),
                                  cudaMemcpyHostToDevice, stream));
    return {};
  }

  unsigned grid(uint64_t items) const {
    return static_cast<unsigned>(std::min<uint64_t>(items, max_blocks));
  }

  // Reports a failed launch, then waits for the batch and reports how it ran.
  Status finish(const char* kernel) {
    const cudaError_t launch = cudaGetLastError();
    if (launch != cudaSuccess) return failed(launch, kernel);
    KVTIER_CUDA(cudaStreamSynchronize, (stream));
    return {};
  }

  Status run_gather_scatter(const Side& src, const Side& dst, size_t pairs, uint64_t first_row,
                            uint64_t rows) {
    const uint64_t items = uint64_t{pairs} * rows;
    const Width width = width_of(shape.item_bytes);
    const uint64_t words = shape.item_bytes / word_bytes(width);
    const uint32_t* src_pages = indices;
    const uint32_t* dst_pages = indices + pairs;
    switch (width) {
      case Width::k16:
        gather_scatter<uint4><<<grid(items), kThreads, 0, stream>>>(
            src, dst, src_pages, dst_pages, items, first_row, rows, words);
        break;
      case Width::k4:
        gather_scatter<uint32_t><<<grid(items), kThreads, 0, stream>>>(
            src, dst, src_pages, dst_pages, items, first_row, rows, words);
        break;
      case Width::k1:
        gather_scatter<uint8_t><<<grid(items), kThreads, 0, stream>>>(
            src, dst, src_pages, dst_pages, items, first_row, rows, words);
        break;
    }
    return finish("gather_scatter<<<>>>");
  }

  // Host<->device on the copy engines: one 2D copy per page. Within a page, rows are
  // item_bytes apart on the host and device_pitch() apart on the device.
  Status run_copy_engine(Copy dir, const uint32_t* src, const uint32_t* dst, size_t pairs,
                         uint64_t first_row, uint64_t rows) {
    const bool to_host = dir == Copy::DeviceToHost;
    const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    const size_t item = static_cast<size_t>(shape.item_bytes);
    const size_t pitch = static_cast<size_t>(device_pitch());
    const bool two_d = max_pitch > 0 && pitch <= static_cast<size_t>(max_pitch);
    for (size_t i = 0; i < pairs; ++i) {
      uint8_t* device_page = device_at(to_host ? src[i] : dst[i], first_row);
      uint8_t* host_page = host_at(to_host ? dst[i] : src[i], first_row);
      if (two_d) {
        if (to_host) {
          KVTIER_CUDA(cudaMemcpy2DAsync,
                      (host_page, item, device_page, pitch, item, rows, kind, stream));
        } else {
          KVTIER_CUDA(cudaMemcpy2DAsync,
                      (device_page, pitch, host_page, item, item, rows, kind, stream));
        }
        continue;
      }
      // Pitch above the device's limit: one copy per row.
      for (uint64_t r = 0; r < rows; ++r) {
        uint8_t* d = device_page + r * pitch;
        uint8_t* h = host_page + r * item;
        if (to_host) {
          KVTIER_CUDA(cudaMemcpyAsync, (h, d, item, kind, stream));
        } else {
          KVTIER_CUDA(cudaMemcpyAsync, (d, h, item, kind, stream));
        }
      }
    }
    KVTIER_CUDA(cudaStreamSynchronize, (stream));
    return {};
  }
};

Arenas::Arenas(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Arenas::~Arenas() = default;

std::unique_ptr<Arenas> Arenas::create(const Shape& shape, HostPath path, Status& status) {
  auto impl = std::make_unique<Impl>();
  impl->shape = shape;
  impl->path = path;
  status = probe(impl->device);
  if (status.ok()) status = impl->allocate();
  // On failure, Impl's destructor releases whatever was allocated.
  if (!status.ok()) return nullptr;
  return std::unique_ptr<Arenas>(new Arenas(std::move(impl)));
}

const DeviceInfo& Arenas::device() const { return impl_->device; }

uint64_t Arenas::item_bytes() const { return impl_->shape.item_bytes; }

Status Arenas::copy(Copy dir, const uint32_t* src, const uint32_t* dst, size_t pairs,
                    uint32_t first_layer, uint32_t layer_count) {
  Impl& m = *impl_;
  if (pairs == 0 || layer_count == 0) return {};
  KVTIER_CUDA(cudaSetDevice, (m.device.ordinal));
  const uint64_t first_row = uint64_t{first_layer} * m.shape.planes;
  const uint64_t rows = uint64_t{layer_count} * m.shape.planes;
  if (dir != Copy::DeviceToDevice && m.path == HostPath::CopyEngine) {
    return m.run_copy_engine(dir, src, dst, pairs, first_row, rows);
  }
  Status status = m.upload(src, dst, pairs);
  if (!status.ok()) return status;
  switch (dir) {
    case Copy::DeviceToHost:
      return m.run_gather_scatter(m.device_side(), m.host_side(), pairs, first_row, rows);
    case Copy::HostToDevice:
      return m.run_gather_scatter(m.host_side(), m.device_side(), pairs, first_row, rows);
    case Copy::DeviceToDevice:
      break;
  }
  return m.run_gather_scatter(m.device_side(), m.device_side(), pairs, first_row, rows);
}

Status Arenas::zero_device(const uint32_t* pages, size_t count) {
  Impl& m = *impl_;
  if (count == 0) return {};
  KVTIER_CUDA(cudaSetDevice, (m.device.ordinal));
  Status status = m.upload(pages, nullptr, count);
  if (!status.ok()) return status;
  const uint64_t rows = m.rows();
  const uint64_t items = uint64_t{count} * rows;
  const Width width = width_of(m.shape.item_bytes);
  const uint64_t words = m.shape.item_bytes / word_bytes(width);
  const Side dst = m.device_side();
  switch (width) {
    case Width::k16:
      zero_items<uint4><<<m.grid(items), kThreads, 0, m.stream>>>(dst, m.indices, items, rows,
                                                                   words);
      break;
    case Width::k4:
      zero_items<uint32_t><<<m.grid(items), kThreads, 0, m.stream>>>(dst, m.indices, items,
                                                                      rows, words);
      break;
    case Width::k1:
      zero_items<uint8_t><<<m.grid(items), kThreads, 0, m.stream>>>(dst, m.indices, items,
                                                                     rows, words);
      break;
  }
  return m.finish("zero_items<<<>>>");
}

Status Arenas::read_item(bool device, uint32_t page, uint32_t layer, uint32_t plane,
                         uint8_t* out) {
  Impl& m = *impl_;
  const uint64_t row = uint64_t{layer} * m.shape.planes + plane;
  const size_t item = static_cast<size_t>(m.shape.item_bytes);
  if (!device) {
    // Every batch has been synchronised: the pinned host arena is quiet.
    std::memcpy(out, m.host_at(page, row), item);
    return {};
  }
  KVTIER_CUDA(cudaSetDevice, (m.device.ordinal));
  KVTIER_CUDA(cudaMemcpyAsync,
              (out, m.device_at(page, row), item, cudaMemcpyDeviceToHost, m.stream));
  KVTIER_CUDA(cudaStreamSynchronize, (m.stream));
  return {};
}

Status Arenas::write_item(bool device, uint32_t page, uint32_t layer, uint32_t plane,
                          const uint8_t* bytes) {
  Impl& m = *impl_;
  const uint64_t row = uint64_t{layer} * m.shape.planes + plane;
  const size_t item = static_cast<size_t>(m.shape.item_bytes);
  if (!device) {
    std::memcpy(m.host_at(page, row), bytes, item);
    return {};
  }
  KVTIER_CUDA(cudaSetDevice, (m.device.ordinal));
  KVTIER_CUDA(cudaMemcpyAsync,
              (m.device_at(page, row), bytes, item, cudaMemcpyHostToDevice, m.stream));
  KVTIER_CUDA(cudaStreamSynchronize, (m.stream));
  return {};
}

}  // namespace cuda
}  // namespace kvtier
