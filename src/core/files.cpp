// core/files.cpp
#include "core/files.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/check.hpp"

namespace moex::detail {

std::string read_text_file(const std::string& path) {
  std::FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) fail(ErrorCode::io, "cannot open {}: {}", path, std::strerror(errno));
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, fp)) > 0) s.append(buf, n);
  const bool err = std::ferror(fp);
  std::fclose(fp);
  if (err) fail(ErrorCode::io, "cannot read {}", path);
  return s;
}

}  // namespace moex::detail
