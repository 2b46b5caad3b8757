// core/error.cpp
#include "moex/error.hpp"

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

}  // namespace moex
