// CPU backend of the page-copy kernels: memcpy per item, split over threads when a batch
// is large enough to pay for them.
#include "kvtier-device/cpp/kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kvtier-device/src/ffi.rs.h"

namespace kvtier {
namespace {

constexpr size_t kAlign = 4096;
// Below this many bytes a batch runs on the calling thread: spawning costs more.
constexpr uint64_t kParallelBytes = 8ull << 20;

uint8_t* alloc_zeroed(uint64_t bytes) {
  if (bytes == 0) bytes = kAlign;
  const uint64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p != nullptr) std::memset(p, 0, rounded);
  return static_cast<uint8_t*>(p);
}

// Runs body(begin, end) over [0, n), on up to `threads` threads.
template <typename F>
void split(size_t n, uint32_t threads, bool parallel, F body) {
  const size_t workers = parallel ? std::min<size_t>(threads, n) : 1;
  if (workers <= 1) {
    body(size_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  const size_t chunk = (n + workers - 1) / workers;
  for (size_t w = 1; w < workers; ++w) {
    const size_t begin = std::min(n, w * chunk), end = std::min(n, begin + chunk);
    pool.emplace_back([=] { body(begin, end); });
  }
  body(0, std::min(n, chunk));
  for (auto& t : pool) t.join();
}

}  // namespace

KvArenas::KvArenas(const ArenaSpec& spec)
    : layers_(spec.layers),
      planes_(spec.planes),
      item_bytes_(spec.item_bytes),
      device_pages_(spec.device_pages),
      host_pages_(spec.host_pages),
      threads_(std::max<uint32_t>(spec.threads, 1)) {
  const uint64_t items = uint64_t{layers_} * planes_;
  device_ = alloc_zeroed(items * device_pages_ * item_bytes_);
  host_ = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(spec.host_base));
}

KvArenas::~KvArenas() { std::free(device_); }

uint8_t* KvArenas::device_at(uint32_t page, uint32_t layer, uint32_t plane) const {
  const uint64_t row = uint64_t{layer} * planes_ + plane;
  return device_ + (row * device_pages_ + page) * item_bytes_;
}

uint8_t* KvArenas::host_at(uint32_t page, uint32_t layer, uint32_t plane) const {
  const uint64_t page_stride = uint64_t{layers_} * planes_ * item_bytes_;
  return host_ + page * page_stride + (uint64_t{layer} * planes_ + plane) * item_bytes_;
}

rust::Slice<uint8_t> KvArenas::device_item(uint32_t page, uint32_t layer, uint32_t plane) {
  return {device_at(page, layer, plane), static_cast<size_t>(item_bytes_)};
}

rust::Slice<uint8_t> KvArenas::device_all() {
  const uint64_t items = uint64_t{layers_} * planes_;
  return {device_, static_cast<size_t>(items * device_pages_ * item_bytes_)};
}

rust::Str KvArenas::backend_name() const { return "cpu"; }

void KvArenas::copy(Direction dir, rust::Slice<const uint32_t> src,
                    rust::Slice<const uint32_t> dst, uint32_t first_layer,
                    uint32_t layer_count) {
  const size_t pairs = std::min(src.size(), dst.size());
  const uint64_t bytes = uint64_t{pairs} * layer_count * planes_ * item_bytes_;
  // Pair-major: each worker fills whole host pages, which are contiguous.
  split(pairs, threads_, bytes >= kParallelBytes, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      for (uint32_t l = first_layer; l < first_layer + layer_count; ++l) {
        for (uint32_t p = 0; p < planes_; ++p) {
          uint8_t* from = nullptr;
          uint8_t* to = nullptr;
          switch (dir) {
            case Direction::DeviceToHost:
              from = device_at(src[i], l, p);
              to = host_at(dst[i], l, p);
              break;
            case Direction::HostToDevice:
              from = host_at(src[i], l, p);
              to = device_at(dst[i], l, p);
              break;
            case Direction::DeviceToDevice:
              from = device_at(src[i], l, p);
              to = device_at(dst[i], l, p);
              break;
          }
          std::memcpy(to, from, item_bytes_);
        }
      }
    }
  });
}

void KvArenas::zero_device(rust::Slice<const uint32_t> pages) {
  for (uint32_t page : pages) {
    for (uint32_t l = 0; l < layers_; ++l) {
      for (uint32_t p = 0; p < planes_; ++p) std::memset(device_at(page, l, p), 0, item_bytes_);
    }
  }
}

std::unique_ptr<KvArenas> new_arenas(const ArenaSpec& spec) {
  auto arenas = std::make_unique<KvArenas>(spec);
  if (!arenas->ok()) return nullptr;
  return arenas;
}

void copy_pages(KvArenas& arenas, Direction dir, rust::Slice<const uint32_t> src,
                rust::Slice<const uint32_t> dst, uint32_t first_layer, uint32_t layer_count) {
  arenas.copy(dir, src, dst, first_layer, layer_count);
}

void zero_device_pages(KvArenas& arenas, rust::Slice<const uint32_t> pages) {
  arenas.zero_device(pages);
}

}  // namespace kvtier
