// tileattn — the C++ API: the same flat Params structs as the C ABI (tileattn.h), with errors as
// exceptions.  Every entry point validates its arguments first, whatever the backend.
#pragma once

#include <stdexcept>
#include <string>

#include "tileattn/tileattn.h"

namespace tileattn {

using ForwardParams = tileattn_fwd_params;
using BackwardParams = tileattn_bwd_params;
using KvCacheParams = tileattn_kvcache_params;

enum class ErrorCode {
  kInvalidArgument = TILEATTN_ERROR_INVALID_ARGUMENT,
  kDtype = TILEATTN_ERROR_DTYPE,
  kUnsupported = TILEATTN_ERROR_UNSUPPORTED,
  kNotBuilt = TILEATTN_ERROR_NOT_BUILT,
  kInternal = TILEATTN_ERROR_INTERNAL,
};

// Thrown for every failure.  argument() names the offending argument ("k", "cu_seqlens_q",
// "window_left"), or is empty for failures that belong to no argument.
class TILEATTN_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string argument, const std::string& message)
      : std::runtime_error(message), code_(code), argument_(std::move(argument)) {}
  ErrorCode code() const noexcept { return code_; }
  const std::string& argument() const noexcept { return argument_; }

 private:
  ErrorCode code_;
  std::string argument_;
};

// Params with the library's defaults (see tileattn_fwd_params_init).
TILEATTN_API ForwardParams default_forward_params();
TILEATTN_API BackwardParams default_backward_params();
TILEATTN_API KvCacheParams default_kvcache_params();

// Validate, then run on params.device.  Throw tileattn::Error on any failure.
TILEATTN_API void forward(const ForwardParams& params);
TILEATTN_API void backward(const BackwardParams& params);
// Appends k_new/v_new to the cache (in place), then attends over it.
TILEATTN_API void forward_kvcache(const KvCacheParams& params);
// Bytes of workspace forward_kvcache may use with these params (tileattn_kvcache_workspace_size).
TILEATTN_API int64_t kvcache_workspace_size(const KvCacheParams& params);
// Bytes of workspace backward may use with these params (tileattn_backward_workspace_size).
TILEATTN_API int64_t backward_workspace_size(const BackwardParams& params);

}  // namespace tileattn
