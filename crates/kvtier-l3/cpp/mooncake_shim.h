// kvtier's shim over Mooncake's C ABI (store_c.h), loaded at run time with dlopen so
// the workspace builds without Mooncake. Pointers cross from Rust as integers: the Rust
// side only passes addresses of buffers it has borrowed for the duration of the call.
#pragma once

#include <cstdint>
#include <memory>

#include "rust/cxx.h"

namespace kvtier {

class MooncakeClient {
 public:
  MooncakeClient(rust::Str library, rust::Str cuda_stub);
  ~MooncakeClient();
  MooncakeClient(const MooncakeClient&) = delete;
  MooncakeClient& operator=(const MooncakeClient&) = delete;

  int32_t setup(rust::Str local_hostname, rust::Str metadata_server, uint64_t global_segment,
                uint64_t local_buffer, rust::Str protocol, rust::Str master) const;
  int32_t register_buffer(uint64_t addr, uint64_t len) const;
  int32_t unregister_buffer(uint64_t addr) const;
  int32_t batch_is_exist(rust::Slice<const rust::String> keys, rust::Slice<int32_t> out) const;
  int32_t batch_put_from(rust::Slice<const rust::String> keys, rust::Slice<const uint64_t> addrs,
                         rust::Slice<const uint64_t> sizes, rust::Slice<int32_t> out) const;
  int32_t batch_get_into(rust::Slice<const rust::String> keys, rust::Slice<const uint64_t> addrs,
                         rust::Slice<const uint64_t> sizes, rust::Slice<int64_t> out) const;
  int32_t remove(rust::Str key, bool force) const;

 private:
  struct Api;
  void* lib_ = nullptr;
  void* store_ = nullptr;
  std::unique_ptr<Api> api_;
};

std::unique_ptr<MooncakeClient> mooncake_open(rust::Str library, rust::Str cuda_stub);

}  // namespace kvtier
