// core/files.hpp — small file helpers with one-line errors.
#pragma once
#include <string>

namespace moex::detail {

// The whole file as bytes; Error(io) naming the file when it cannot be opened or read.
std::string read_text_file(const std::string& path);

}  // namespace moex::detail
