// core/check.hpp — argument checks that throw moex::Error with one clear line.
#pragma once
#include "moex/error.hpp"

#ifndef __CUDACC__
#include <fmt/format.h>

namespace moex::detail {

template <class... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(code, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace moex::detail
#else
// nvcc cannot compile fmt's headers in C++20 mode: .cu files get a small run-time formatter that
// replaces each "{...}" with the next argument (format specs are ignored).
#include <sstream>
#include <string_view>

namespace moex::detail {

inline void format_into(std::ostringstream& os, std::string_view f) { os << f; }
template <class T, class... Rest>
void format_into(std::ostringstream& os, std::string_view f, const T& v, const Rest&... rest) {
  const size_t open = f.find('{');
  const size_t close = open == std::string_view::npos ? open : f.find('}', open);
  if (close == std::string_view::npos) {
    os << f;
    return;
  }
  os << f.substr(0, open) << v;
  format_into(os, f.substr(close + 1), rest...);
}

template <class... Args>
[[noreturn]] void fail(ErrorCode code, std::string_view f, const Args&... args) {
  std::ostringstream os;
  format_into(os, f, args...);
  throw Error(code, os.str());
}

}  // namespace moex::detail
#endif

// MOEX_CHECK(cond, "what is wrong: {}", value) → Error(invalid_argument)
#define MOEX_CHECK(cond, ...) \
  do {                        \
    if (!(cond)) ::moex::detail::fail(::moex::ErrorCode::invalid_argument, __VA_ARGS__); \
  } while (0)
// An invariant of moex itself.
#define MOEX_ASSERT(cond)                                                                        \
  do {                                                                                            \
    if (!(cond)) ::moex::detail::fail(::moex::ErrorCode::internal, "internal error: {} ({}:{})", #cond, __FILE__, __LINE__); \
  } while (0)
