// kvtier page-copy kernel library, CPU backend.
//
// Two arenas of KV memory:
//   device: layer-first  — for each (layer, plane), `device_pages` items of `item_bytes`;
//   host:   page-first   — for each page, its (layer, plane) items back to back.
// An item is one page of one plane of one layer. Copies move items between pages of the
// two arenas (or within the device arena) over lists of (src page, dst page) pairs.
// Bounds are checked by the Rust caller; this layer only moves bytes. The host arena is
// owned by Rust (kvtier_host::HostArena, shared with the L3 actor); the caller borrows
// every host page a copy touches for the copy's duration.
#pragma once

#include <cstdint>
#include <memory>

#include "rust/cxx.h"

namespace kvtier {

struct ArenaSpec;
enum class Direction : uint8_t;

class KvArenas {
 public:
  explicit KvArenas(const ArenaSpec& spec);
  ~KvArenas();
  KvArenas(const KvArenas&) = delete;
  KvArenas& operator=(const KvArenas&) = delete;

  bool ok() const { return device_ != nullptr && host_ != nullptr; }
  rust::Slice<uint8_t> device_item(uint32_t page, uint32_t layer, uint32_t plane);
  rust::Slice<uint8_t> device_all();
  rust::Str backend_name() const;

  void copy(Direction dir, rust::Slice<const uint32_t> src, rust::Slice<const uint32_t> dst,
            uint32_t first_layer, uint32_t layer_count);
  void zero_device(rust::Slice<const uint32_t> pages);

 private:
  uint8_t* device_at(uint32_t page, uint32_t layer, uint32_t plane) const;
  uint8_t* host_at(uint32_t page, uint32_t layer, uint32_t plane) const;

  uint32_t layers_;
  uint32_t planes_;
  uint64_t item_bytes_;
  uint32_t device_pages_;
  uint32_t host_pages_;
  uint32_t threads_;
  uint8_t* device_ = nullptr;
  uint8_t* host_ = nullptr;  // not owned
};

std::unique_ptr<KvArenas> new_arenas(const ArenaSpec& spec);
void copy_pages(KvArenas& arenas, Direction dir, rust::Slice<const uint32_t> src,
                rust::Slice<const uint32_t> dst, uint32_t first_layer, uint32_t layer_count);
void zero_device_pages(KvArenas& arenas, rust::Slice<const uint32_t> pages);

}  // namespace kvtier
