// core/error.cpp
#include "moex/error.hpp"

#include <algorithm>

namespace moex {

const char* error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::invalid_argument: return "invalid argument";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::not_found: return "not found";
    case ErrorCode::out_of_memory: return "out of memory";
    case ErrorCode::io: return "I/O error";
    case ErrorCode::parse: return "parse error";
    case ErrorCode::internal: return "internal error";
  }
  return "error";
}

namespace {

// Length of the valid UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, ≤ U+10FFFF) that
// starts at s[i], or 0 where none does.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned c = byte(i);
  const auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) { return byte(k) >= lo && byte(k) <= hi; };
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c == 0xE0) return cont(i + 1, 0xA0) && cont(i + 2) ? 3 : 0;
  if (c == 0xED) return cont(i + 1, 0x80, 0x9F) && cont(i + 2) ? 3 : 0;
  if (c >= 0xE1 && c <= 0xEF) return cont(i + 1) && cont(i + 2) ? 3 : 0;
  if (c == 0xF0) return cont(i + 1, 0x90) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c == 0xF4) return cont(i + 1, 0x80, 0x8F) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  return 0;
}

void append_hex_escape(std::string& out, unsigned char b) {
  static const char* digits = "0123456789abcdef";
  out += "\\x";
  out += digits[b >> 4];
  out += digits[b & 15];
}

}  // namespace

std::string one_line(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {  // printable ASCII: the common case
      out += char(c);
      ++i;
    } else if (c == '\n' || c == '\t' || c == '\r') {
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
      ++i;
    } else if (const size_t n = c >= 0x80 ? utf8_sequence_length(text, i) : 0;
               n > 0 && !(c == 0xC2 && static_cast<unsigned char>(text[i + 1]) <= 0x9F)) {  // not a C1 control
      out.append(text.substr(i, n));
      i += n;
    } else {  // other controls, C1 controls (both bytes), bytes that are not UTF-8
      const size_t len = std::max<size_t>(n, 1);
      for (size_t k = 0; k < len; ++k) append_hex_escape(out, static_cast<unsigned char>(text[i + k]));
      i += len;
    }
  }
  return out;
}

}  // namespace moex
