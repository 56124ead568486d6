#include "kvtier-l3/cpp/mooncake_shim.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier-l3/src/mooncake/ffi.rs.h"

namespace kvtier {

// The store_c.h signatures this shim calls.
struct MooncakeClient::Api {
  void* (*create)();
  void (*destroy)(void*);
  int (*setup)(void*, const char*, const char*, uint64_t, uint64_t, const char*, const char*,
               const char*);
  int (*register_buffer)(void*, void*, size_t);
  int (*unregister_buffer)(void*, void*);
  int (*batch_is_exist)(void*, const char**, size_t, int*);
  int (*batch_put_from)(void*, const char**, void**, const size_t*, size_t, const void*, int*);
  int (*batch_get_into)(void*, const char**, void**, const size_t*, size_t, int64_t*);
  int (*remove)(void*, const char*, int);
};

namespace {

template <typename F>
void bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) throw std::runtime_error(std::string("Mooncake library lacks ") + name);
}

std::string str(rust::Str s) { return std::string(s.data(), s.size()); }

// NUL-terminated copies of the keys, and pointers to them.
struct Keys {
  std::vector<std::string> owned;
  std::vector<const char*> ptrs;
  explicit Keys(rust::Slice<const rust::String> keys) {
    owned.reserve(keys.size());
    for (const auto& k : keys) owned.emplace_back(k.data(), k.size());
    for (const auto& k : owned) ptrs.push_back(k.c_str());
  }
};

// Buffer addresses and lengths in the C ABI's types.
struct Buffers {
  std::vector<void*> ptrs;
  std::vector<size_t> lens;
  Buffers(rust::Slice<const uint64_t> addrs, rust::Slice<const uint64_t> sizes) {
    for (size_t i = 0; i < addrs.size() && i < sizes.size(); ++i) {
      ptrs.push_back(reinterpret_cast<void*>(addrs[i]));
      lens.push_back(sizes[i]);
    }
  }
};

}  // namespace

MooncakeClient::MooncakeClient(rust::Str library, rust::Str cuda_stub) : api_(new Api()) {
  // The library needs libcuda.so.1. Use the real driver when there is one; otherwise,
  // and only when one is named, a stand-in that reports "no device".
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) == nullptr && cuda_stub.size() > 0) {
    if (dlopen(str(cuda_stub).c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      throw std::runtime_error(std::string("cannot load the CUDA stand-in: ") + dlerror());
    }
  }
  lib_ = dlopen(str(library).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) throw std::runtime_error(std::string("cannot load Mooncake: ") + dlerror());
  bind(lib_, "mooncake_store_create", api_->create);
  bind(lib_, "mooncake_store_destroy", api_->destroy);
  bind(lib_, "mooncake_store_setup", api_->setup);
  bind(lib_, "mooncake_store_register_buffer", api_->register_buffer);
  bind(lib_, "mooncake_store_unregister_buffer", api_->unregister_buffer);
  bind(lib_, "mooncake_store_batch_is_exist", api_->batch_is_exist);
  bind(lib_, "mooncake_store_batch_put_from", api_->batch_put_from);
  bind(lib_, "mooncake_store_batch_get_into", api_->batch_get_into);
  bind(lib_, "mooncake_store_remove", api_->remove);
  store_ = api_->create();
  if (store_ == nullptr) throw std::runtime_error("mooncake_store_create failed");
}

MooncakeClient::~MooncakeClient() {
  if (store_ != nullptr) api_->destroy(store_);
  // The library stays loaded: its static state may outlive the store.
}

int32_t MooncakeClient::setup(rust::Str local_hostname, rust::Str metadata_server,
                              uint64_t global_segment, uint64_t local_buffer, rust::Str protocol,
                              rust::Str master) const {
  return api_->setup(store_, str(local_hostname).c_str(), str(metadata_server).c_str(),
                     global_segment, local_buffer, str(protocol).c_str(), "",
                     str(master).c_str());
}

int32_t MooncakeClient::register_buffer(uint64_t addr, uint64_t len) const {
  return api_->register_buffer(store_, reinterpret_cast<void*>(addr), len);
}

int32_t MooncakeClient::unregister_buffer(uint64_t addr) const {
  return api_->unregister_buffer(store_, reinterpret_cast<void*>(addr));
}

int32_t MooncakeClient::batch_is_exist(rust::Slice<const rust::String> keys,
                                       rust::Slice<int32_t> out) const {
  Keys k(keys);
  return api_->batch_is_exist(store_, k.ptrs.data(), k.ptrs.size(), out.data());
}

int32_t MooncakeClient::batch_put_from(rust::Slice<const rust::String> keys,
                                       rust::Slice<const uint64_t> addrs,
                                       rust::Slice<const uint64_t> sizes,
                                       rust::Slice<int32_t> out) const {
  Keys k(keys);
  Buffers b(addrs, sizes);
  return api_->batch_put_from(store_, k.ptrs.data(), b.ptrs.data(), b.lens.data(), keys.size(),
                              nullptr, out.data());
}

int32_t MooncakeClient::batch_get_into(rust::Slice<const rust::String> keys,
                                       rust::Slice<const uint64_t> addrs,
                                       rust::Slice<const uint64_t> sizes,
                                       rust::Slice<int64_t> out) const {
  Keys k(keys);
  Buffers b(addrs, sizes);
  return api_->batch_get_into(store_, k.ptrs.data(), b.ptrs.data(), b.lens.data(), keys.size(),
                              out.data());
}

int32_t MooncakeClient::remove(rust::Str key, bool force) const {
  return api_->remove(store_, str(key).c_str(), force ? 1 : 0);
}

std::unique_ptr<MooncakeClient> mooncake_open(rust::Str library, rust::Str cuda_stub) {
  return std::make_unique<MooncakeClient>(library, cuda_stub);
}

}  // namespace kvtier
