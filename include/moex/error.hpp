// moex/error.hpp — the one exception type of the library. Every error is one clear line.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

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

// `text` made safe to print as one line: control characters (a newline, an ESC starting a terminal
// sequence, C1 controls) and bytes that are not valid UTF-8 become escapes (\n, \t, \r, \xNN); valid
// UTF-8 is kept. Messages quote names and bytes read from files (a tensor name, a JSON parser's "last
// read"), which a corrupt or hostile checkpoint controls.
std::string one_line(std::string_view text);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& msg) : std::runtime_error(one_line(msg)), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace moex
