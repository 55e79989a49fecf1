// The C ABI: the C++ entry points behind functions that never let an exception cross, reporting
// failures as a status code plus a thread-local message.
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "tileattn/tileattn.hpp"

namespace {

thread_local std::string last_error;
thread_local std::string last_error_argument;

template <typename Call>
int guarded(Call call) {
  last_error.clear();
  last_error_argument.clear();
  try {
    call();
    return TILEATTN_OK;
  } catch (const tileattn::Error& e) {
    last_error = e.what();
    last_error_argument = e.argument();
    return static_cast<int>(e.code());
  } catch (const std::bad_alloc&) {
    last_error = "out of host memory";
    return TILEATTN_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    last_error = e.what();
    return TILEATTN_ERROR_INTERNAL;
  } catch (...) {
    last_error = "unknown error";
    return TILEATTN_ERROR_INTERNAL;
  }
}

template <typename Params>
const Params& non_null(const Params* params) {
  if (params == nullptr) {
    throw tileattn::Error(tileattn::ErrorCode::kInvalidArgument, "params", "params is a null pointer");
  }
  return *params;
}

}  // namespace

extern "C" {

void tileattn_fwd_params_init(tileattn_fwd_params* params) {
  std::memset(params, 0, sizeof(*params));
  params->window_left = -1;
  params->window_right = -1;
}

void tileattn_bwd_params_init(tileattn_bwd_params* params) {
  std::memset(params, 0, sizeof(*params));
  tileattn_fwd_params_init(&params->fwd);
}

int tileattn_forward(const tileattn_fwd_params* params) {
  return guarded([&] { tileattn::forward(non_null(params)); });
}

void tileattn_kvcache_params_init(tileattn_kvcache_params* params) {
  std::memset(params, 0, sizeof(*params));
  tileattn_fwd_params_init(&params->fwd);
  params->rotary_interleaved = 1;
}

int tileattn_forward_kvcache(const tileattn_kvcache_params* params) {
  return guarded([&] { tileattn::forward_kvcache(non_null(params)); });
}

int tileattn_kvcache_workspace_size(const tileattn_kvcache_params* params, int64_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr) {
      throw tileattn::Error(tileattn::ErrorCode::kInvalidArgument, "bytes", "bytes is a null pointer");
    }
    *bytes = tileattn::kvcache_workspace_size(non_null(params));
  });
}

int tileattn_backward_workspace_size(const tileattn_bwd_params* params, int64_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr) {
      throw tileattn::Error(tileattn::ErrorCode::kInvalidArgument, "bytes", "bytes is a null pointer");
    }
    *bytes = tileattn::backward_workspace_size(non_null(params));
  });
}

int tileattn_backward(const tileattn_bwd_params* params) {
  return guarded([&] { tileattn::backward(non_null(params)); });
}

const char* tileattn_last_error(void) { return last_error.c_str(); }
const char* tileattn_last_error_argument(void) { return last_error_argument.c_str(); }
int tileattn_abi_version(void) { return TILEATTN_ABI_VERSION; }

int tileattn_has_cuda(void) {
#ifdef TILEATTN_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

int64_t tileattn_fwd_params_size(void) { return sizeof(tileattn_fwd_params); }
int64_t tileattn_bwd_params_size(void) { return sizeof(tileattn_bwd_params); }
int64_t tileattn_kvcache_params_size(void) { return sizeof(tileattn_kvcache_params); }

}  // extern "C"
