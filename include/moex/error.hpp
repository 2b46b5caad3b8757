// moex/error.hpp — the one exception type of the library. Every error is one clear line.
#pragma once
#include <stdexcept>
#include <string>

namespace moex {

enum class ErrorCode {
  invalid_argument,  // shapes, dtypes, ranks, values a caller passed
  unsupported,       // a backend cannot run this problem on this device (message says why and what instead)
  not_found,         // unknown backend / sub-config / tensor name
  out_of_memory,     // host or device allocation failed
  io,                // files
  parse,             // malformed safetensors / JSON / config
  internal,          // a bug: an invariant of moex itself failed
};

const char* error_code_name(ErrorCode c);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace moex
