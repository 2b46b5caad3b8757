// model/safetensors.cpp — memory-mapped safetensors reader, writer and sharded checkpoints.
//
// File layout: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
// then the data region; offsets are relative to its start.
#include "moex/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.hpp"
#include "core/files.hpp"

namespace moex {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit
constexpr int kMaxJsonDepth = 64;

struct DTypeEntry {
  const char* name;
  int bits;
  std::optional<DType> dtype;
};

const DTypeEntry kDTypes[] = {
    {"BOOL", 8, DType::u8},       {"U8", 8, DType::u8},       {"I8", 8, DType::i8},
    {"F8_E4M3", 8, DType::fp8_e4m3}, {"F8_E8M0", 8, DType::ue8m0}, {"F8_E5M2", 8, std::nullopt},
    {"I16", 16, std::nullopt},    {"U16", 16, std::nullopt},  {"F16", 16, DType::f16},
    {"BF16", 16, DType::bf16},    {"I32", 32, DType::i32},    {"U32", 32, std::nullopt},
    {"F32", 32, DType::f32},      {"F64", 64, DType::f64},    {"I64", 64, DType::i64},
    {"U64", 64, std::nullopt},    {"C64", 64, std::nullopt},  {"F4", 4, std::nullopt},
    {"F6_E2M3", 6, std::nullopt}, {"F6_E3M2", 6, std::nullopt},
};

const DTypeEntry* find_dtype(std::string_view s) {
  for (const auto& e : kDTypes)
    if (s == e.name) return &e;
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& e : kDTypes) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

// Rejects JSON nested deeper than kMaxJsonDepth before the recursive parser sees it.
bool json_depth_ok(const char* p, size_t n) {
  int depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string shape_to_string(const TensorView& v) {
  return shape_to_string(std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.rank));
}

std::string_view safetensors_dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::i8: return "I8";
    case DType::fp8_e4m3: return "F8_E4M3";
    case DType::ue8m0: return "F8_E8M0";
    case DType::fp4_e2m1x2: break;
  }
  detail::fail(ErrorCode::unsupported, "safetensors has no dtype for {} (store packed fp4 as u8)", dtype_name(dt));
}

// ---- SafetensorsFile ------------------------------------------------------------------------

struct SafetensorsFile::Impl {
  std::string path;
  // Either a read-only mapping or an owned buffer (from_bytes).
  void* map = nullptr;
  size_t map_size = 0;
  std::vector<uint64_t> owned;  // 8-byte aligned storage
  std::vector<uint64_t> relocated;  // the tensors, re-laid out aligned (files with misaligned data only)
  const uint8_t* base = nullptr;
  size_t size = 0;
  const uint8_t* data = nullptr;  // start of the data region
  uint64_t data_size = 0;
  std::vector<SafetensorsTensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, size_t, std::less<>> index;
  std::map<std::string, std::string> metadata;

  ~Impl() {
    if (map) ::munmap(map, map_size);
  }
  void parse();
};

void SafetensorsFile::Impl::parse() {
  const std::string& f = path;
  if (size < 8)
    detail::fail(ErrorCode::parse, "{}: not a safetensors file: {} bytes, shorter than the 8-byte header length", f, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  if (n > size - 8)
    detail::fail(ErrorCode::parse, "{}: corrupt safetensors file: header length {} is past the end of the file ({} bytes)",
                 f, n, size);
  if (n > kMaxHeaderBytes)
    detail::fail(ErrorCode::parse, "{}: corrupt safetensors file: header length {} exceeds the {}-byte limit", f, n,
                 kMaxHeaderBytes);
  const char* h = reinterpret_cast<const char*>(base + 8);
  data = base + 8 + n;
  data_size = size - 8 - n;
  if (n == 0 || h[0] != '{')
    detail::fail(ErrorCode::parse, "{}: corrupt safetensors file: the header is not a JSON object", f);
  if (!json_depth_ok(h, n))
    detail::fail(ErrorCode::parse, "{}: corrupt safetensors file: header JSON nested deeper than {}", f, kMaxJsonDepth);
  json j;
  try {
    j = json::parse(h, h + n);
  } catch (const json::exception& e) {
    detail::fail(ErrorCode::parse, "{}: corrupt safetensors file: malformed JSON header: {}", f, e.what());
  }
  if (!j.is_object()) detail::fail(ErrorCode::parse, "{}: corrupt safetensors file: the header is not a JSON object", f);

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_object())
        for (auto m = v.begin(); m != v.end(); ++m)
          if (m.value().is_string()) metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    auto bad = [&](const std::string& what) {
      detail::fail(ErrorCode::parse, "{}: corrupt safetensors header: tensor '{}': {}", f, name, what);
    };
    if (!v.is_object()) bad("entry is not an object");
    SafetensorsTensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) bad("missing or non-string \"dtype\"");
    t.st_dtype = dt->get<std::string>();
    const DTypeEntry* de = find_dtype(t.st_dtype);
    if (!de) bad("unknown dtype '" + t.st_dtype + "' (known: " + known_dtypes() + ")");
    t.dtype = de->dtype;
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) bad("missing or non-array \"shape\"");
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned())
        bad("shape " + sh->dump() + " has a dimension that is not a non-negative integer");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t(1) << 62) || __builtin_mul_overflow(numel, dim, &numel) || numel > (uint64_t(1) << 62))
        bad("shape " + sh->dump() + " is too large");
      t.shape.push_back(int64_t(dim));
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      bad("\"data_offsets\" is not a pair of non-negative integers");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.begin > t.end)
      bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] have begin > end");
    if (t.end > data_size)
      bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
          "] are outside the data region (" + std::to_string(data_size) + " bytes)");
    uint64_t bits = 0;
    if (__builtin_mul_overflow(numel, uint64_t(de->bits), &bits)) bad("shape is too large");
    if (bits % 8 != 0)
      bad("shape " + shape_to_string(t.shape) + " of " + t.st_dtype + " is not a whole number of bytes");
    if (bits / 8 != t.nbytes())
      bad("byte size " + std::to_string(t.nbytes()) + " of data_offsets does not match shape " +
          shape_to_string(t.shape) + " x " + t.st_dtype + " = " + std::to_string(bits / 8) + " bytes");
    tensors.push_back(std::move(t));
  }
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < tensors.size(); ++i) {
    const auto& a = tensors[i - 1];
    const auto& b = tensors[i];
    if (b.begin < a.end)
      detail::fail(ErrorCode::parse, "{}: corrupt safetensors header: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", f,
                   a.name, a.begin, a.end, b.name, b.begin, b.end);
  }
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].name, i);

  // Views must be aligned to their element size. Files written by the reference pad the header to a
  // multiple of 8 bytes so this always holds; for other files (unpadded header, odd offsets) the
  // tensors are copied once into an aligned buffer.
  auto align_of = [](const SafetensorsTensorInfo& t) -> uintptr_t {
    const DTypeEntry* de = find_dtype(t.st_dtype);
    return uintptr_t(std::clamp(de->bits / 8, 1, 8));
  };
  bool misaligned = false;
  for (const auto& t : tensors) misaligned = misaligned || (reinterpret_cast<uintptr_t>(data + t.begin) % align_of(t)) != 0;
  if (misaligned) {
    uint64_t total = 0;
    std::vector<uint64_t> nb(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      nb[i] = total;
      total += (tensors[i].nbytes() + 7) / 8 * 8;
    }
    relocated.assign(total / 8 + 1, 0);
    uint8_t* dst = reinterpret_cast<uint8_t*>(relocated.data());
    for (size_t i = 0; i < tensors.size(); ++i) {
      auto& t = tensors[i];
      const uint64_t n = t.nbytes();
      if (n) std::memcpy(dst + nb[i], data + t.begin, n);
      t.begin = nb[i];
      t.end = nb[i] + n;
    }
    data = dst;
    data_size = total;
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) detail::fail(ErrorCode::io, "cannot open safetensors file {}: {}", path, errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    detail::fail(ErrorCode::io, "cannot stat {}: {}", path, e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    detail::fail(ErrorCode::io, "{} is not a regular file", path);
  }
  impl->size = size_t(st.st_size);
  if (impl->size > 0) {
    void* m = ::mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const std::string e = errno_text();
      ::close(fd);
      detail::fail(ErrorCode::io, "cannot memory-map {}: {}", path, e);
    }
    impl->map = m;
    impl->map_size = impl->size;
    impl->base = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  impl->parse();
  SafetensorsFile s;
  s.impl_ = std::move(impl);
  return s;
}

SafetensorsFile SafetensorsFile::from_bytes(const void* data, size_t size, const std::string& label) {
  auto impl = std::make_shared<Impl>();
  impl->path = label;
  impl->owned.resize((size + 7) / 8 + 1);
  if (size) std::memcpy(impl->owned.data(), data, size);
  impl->base = reinterpret_cast<const uint8_t*>(impl->owned.data());
  impl->size = size;
  impl->parse();
  SafetensorsFile s;
  s.impl_ = std::move(impl);
  return s;
}

static const std::string kEmpty;

const std::string& SafetensorsFile::path() const { return impl_ ? impl_->path : kEmpty; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  if (!impl_) return out;
  for (const auto& t : impl_->tensors) out.push_back(t.name);
  return out;
}

size_t SafetensorsFile::size() const { return impl_ ? impl_->tensors.size() : 0; }

bool SafetensorsFile::has(std::string_view name) const { return impl_ && impl_->index.count(name) != 0; }

const SafetensorsTensorInfo& SafetensorsFile::info(std::string_view name) const {
  if (!impl_) detail::fail(ErrorCode::invalid_argument, "SafetensorsFile used before open()");
  auto it = impl_->index.find(name);
  if (it == impl_->index.end()) detail::fail(ErrorCode::not_found, "tensor '{}' not found in {}", name, impl_->path);
  return impl_->tensors[it->second];
}

std::pair<const uint8_t*, size_t> SafetensorsFile::bytes(std::string_view name) const {
  const auto& t = info(name);
  return {impl_->data + t.begin, size_t(t.nbytes())};
}

TensorView SafetensorsFile::get(std::string_view name) const {
  const auto& t = info(name);
  if (!t.dtype)
    detail::fail(ErrorCode::unsupported, "tensor '{}' in {} has dtype {}, which moex has no type for", name, impl_->path,
                 t.st_dtype);
  if (t.shape.size() > size_t(kMaxRank))
    detail::fail(ErrorCode::unsupported, "tensor '{}' in {} has rank {} (shape {}); moex tensors have rank <= {}", name,
                 impl_->path, t.shape.size(), shape_to_string(t.shape), kMaxRank);
  const int64_t scalar[1] = {1};
  const bool is_scalar = t.shape.empty();
  return TensorView::contiguous(impl_->data + t.begin, *t.dtype, is_scalar ? scalar : t.shape.data(),
                                is_scalar ? 1 : int(t.shape.size()));
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  static const std::map<std::string, std::string> empty;
  return impl_ ? impl_->metadata : empty;
}

// ---- writer -----------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsRawTensor> raw;
  raw.reserve(tensors.size());
  for (const auto& [name, v] : tensors) {
    MOEX_CHECK(v.defined(), "write_safetensors {}: tensor '{}' is undefined", path, name);
    MOEX_CHECK(v.device.is_cpu(), "write_safetensors {}: tensor '{}' is on {}; copy it to the CPU first", path, name,
               to_string(v.device));
    MOEX_CHECK(v.is_contiguous(), "write_safetensors {}: tensor '{}' ({}) is not contiguous", path, name, v.describe());
    MOEX_CHECK(v.data != nullptr || v.numel() == 0, "write_safetensors {}: tensor '{}' has no data", path, name);
    raw.push_back({name, std::string(safetensors_dtype_name(v.dtype)), std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.rank),
                   v.data, v.nbytes()});
  }
  write_safetensors_raw(path, raw, metadata);
}

void write_safetensors_raw(const std::string& path, const std::vector<SafetensorsRawTensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    MOEX_CHECK(!t.name.empty() && t.name != "__metadata__", "write_safetensors {}: invalid tensor name '{}'", path, t.name);
    MOEX_CHECK(seen.insert(t.name).second, "write_safetensors {}: tensor '{}' given twice", path, t.name);
    MOEX_CHECK(t.data != nullptr || t.nbytes == 0, "write_safetensors {}: tensor '{}' has no data", path, t.name);
    header[t.name] = {{"dtype", t.st_dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* fp = std::fopen(tmp.c_str(), "wb");
  if (!fp) detail::fail(ErrorCode::io, "cannot write {}: {}", path, errno_text());
  bool ok = true;
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
  ok = ok && std::fwrite(len, 1, 8, fp) == 8;
  ok = ok && std::fwrite(h.data(), 1, h.size(), fp) == h.size();
  for (const auto& t : tensors)
    if (t.nbytes) ok = ok && std::fwrite(t.data, 1, t.nbytes, fp) == t.nbytes;
  const std::string werr = ok ? "" : errno_text();
  if (std::fclose(fp) != 0 && ok) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    detail::fail(ErrorCode::io, "cannot write {}: {}", path, werr.empty() ? errno_text() : werr);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = errno_text();
    std::remove(tmp.c_str());
    detail::fail(ErrorCode::io, "cannot write {}: {}", path, e);
  }
}

void write_safetensors_map(const std::string& path, const std::map<std::string, TensorView>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  write_safetensors(path, std::vector<std::pair<std::string, TensorView>>(tensors.begin(), tensors.end()), metadata);
}

// ---- conversion -------------------------------------------------------------------------------

namespace {

bool is_float(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16 || dt == DType::f64; }

// out[i] = f(in[i]) for n elements, in parallel for large tensors (checkpoint loading, the model's
// activations: a 256 × 1024 prompt's rows are 2^18 elements, whose serial conversion took ~0.3 ms
// twice per layer on the AMX host).
template <class Out, class In, class F>
void convert_loop(Out* out, const In* in, int64_t n, F f) {
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = f(in[i]);
}

// dst[i] = store(source element i as f32) for the source dtype s (f32, f16, bf16, f64), the dtype
// dispatched once rather than per element.
template <class Out, class Store>
void convert_from(Out* dst, const void* src, DType s, int64_t n, Store store) {
  switch (s) {
    case DType::f32: convert_loop(dst, static_cast<const float*>(src), n, [&](float v) { return store(v); }); break;
    case DType::f16: convert_loop(dst, static_cast<const uint16_t*>(src), n, [&](uint16_t v) { return store(f16_to_float(v)); }); break;
    case DType::bf16: convert_loop(dst, static_cast<const uint16_t*>(src), n, [&](uint16_t v) { return store(bf16_to_float(v)); }); break;
    case DType::f64: convert_loop(dst, static_cast<const double*>(src), n, [&](double v) { return store(float(v)); }); break;
    default: MOEX_ASSERT(false);
  }
}

// Converts n elements from src (dtype s) into dst (dtype d).
void convert_into(void* dst, DType d, const void* src, DType s, int64_t n) {
  if (n <= 0) return;
  if (d == s) {
    std::memcpy(dst, src, size_t(n) * dtype_size(d));
    return;
  }
  if (d == DType::f32) {
    convert_from(static_cast<float*>(dst), src, s, n, [](float v) { return v; });
  } else if (d == DType::bf16) {
    // (f64 goes through f32 first: a double rounding, irrelevant for checkpoint weights)
    convert_from(static_cast<uint16_t*>(dst), src, s, n, [](float v) { return float_to_bf16(v); });
  } else if (d == DType::f16) {
    convert_from(static_cast<uint16_t*>(dst), src, s, n, [](float v) { return float_to_f16(v); });
  } else {
    MOEX_ASSERT(false);
  }
}

void check_convertible(DType s, DType d, std::string_view what) {
  if (s == d) return;
  if (is_float(s) && (d == DType::f32 || d == DType::f16 || d == DType::bf16)) return;
  detail::fail(ErrorCode::unsupported, "{}: cannot convert {} to {} (float tensors convert to f32, f16 or bf16)", what,
               dtype_name(s), dtype_name(d));
}

}  // namespace

void convert_elements(void* dst, DType d, const void* src, DType s, int64_t n) {
  check_convertible(s, d, "convert_elements");
  convert_into(dst, d, src, s, n);
}

Tensor convert_tensor(const TensorView& src, DType dt) {
  MOEX_CHECK(src.defined(), "convert_tensor: undefined tensor");
  MOEX_CHECK(src.device.is_cpu(), "convert_tensor: tensor {} is not on the CPU", src.describe());
  MOEX_CHECK(src.is_contiguous(), "convert_tensor: tensor {} is not contiguous", src.describe());
  check_convertible(src.dtype, dt, "convert_tensor");
  Tensor t = Tensor::empty(dt, src.shape.data(), src.rank);
  convert_into(t.data(), dt, src.data, src.dtype, src.numel());
  return t;
}

// ---- Checkpoint -------------------------------------------------------------------------------

namespace {

// A shard name from an index must stay inside the checkpoint directory.
bool safe_relative_name(const std::string& s) {
  if (s.empty() || s.front() == '/' || s.find('\0') != std::string::npos) return false;
  for (const auto& part : fs::path(s))
    if (part == "..") return false;
  return true;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir_or_file) {
  std::error_code ec;
  const fs::path p(dir_or_file);
  fs::path index_path, single_path;
  Checkpoint c;
  if (fs::is_directory(p, ec)) {
    c.dir_ = p.string();
    if (fs::exists(p / "model.safetensors.index.json", ec)) index_path = p / "model.safetensors.index.json";
    else if (fs::exists(p / "model.safetensors", ec)) single_path = p / "model.safetensors";
    else
      detail::fail(ErrorCode::io, "no model.safetensors or model.safetensors.index.json in checkpoint directory {}",
                   dir_or_file);
  } else if (fs::exists(p, ec)) {
    c.dir_ = p.has_parent_path() ? p.parent_path().string() : ".";
    const std::string fn = p.filename().string();
    if (fn.size() >= 5 && fn.compare(fn.size() - 5, 5, ".json") == 0) index_path = p;
    else single_path = p;
  } else {
    detail::fail(ErrorCode::io, "checkpoint {} does not exist", dir_or_file);
  }

  if (!single_path.empty()) {
    c.files_.push_back(SafetensorsFile::open(single_path.string()));
    for (const auto& n : c.files_[0].names()) c.where_.emplace(n, 0);
    return c;
  }

  const std::string ip = index_path.string();
  json j;
  {
    const std::string text = detail::read_text_file(ip);
    if (!json_depth_ok(text.data(), text.size()))
      detail::fail(ErrorCode::parse, "{}: malformed index: JSON nested deeper than {}", ip, kMaxJsonDepth);
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      detail::fail(ErrorCode::parse, "{}: malformed JSON: {}", ip, e.what());
    }
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    detail::fail(ErrorCode::parse, "{}: malformed index: no \"weight_map\" object", ip);
  std::map<std::string, size_t> shard_ids;
  const fs::path base = index_path.parent_path();
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      detail::fail(ErrorCode::parse, "{}: malformed index: weight_map entry for tensor '{}' is not a file name", ip, it.key());
    const std::string shard = it.value().get<std::string>();
    if (!safe_relative_name(shard))
      detail::fail(ErrorCode::parse, "{}: malformed index: tensor '{}' maps to '{}', which is not a file inside {}", ip,
                   it.key(), shard, base.string());
    auto [sit, inserted] = shard_ids.emplace(shard, c.files_.size());
    if (inserted) c.files_.push_back(SafetensorsFile::open((base / shard).string()));
    const SafetensorsFile& f = c.files_[sit->second];
    if (!f.has(it.key()))
      detail::fail(ErrorCode::parse, "{}: index maps tensor '{}' to {}, which does not contain it", ip, it.key(), f.path());
    c.where_.emplace(it.key(), sit->second);
  }
  return c;
}

bool Checkpoint::has(std::string_view name) const { return where_.find(name) != where_.end(); }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

const SafetensorsFile& Checkpoint::file_of(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) detail::fail(ErrorCode::not_found, "tensor '{}' not found in checkpoint {}", name, dir_);
  return files_[it->second];
}

const SafetensorsTensorInfo& Checkpoint::info(std::string_view name) const { return file_of(name).info(name); }

TensorView Checkpoint::get(std::string_view name) const { return file_of(name).get(name); }

void Checkpoint::check_shape(std::string_view name, const std::vector<int64_t>& expected) const {
  const auto& t = info(name);
  if (t.shape != expected)
    detail::fail(ErrorCode::invalid_argument, "tensor '{}' in checkpoint {} has shape {} but the config implies {}", name,
                 dir_, shape_to_string(t.shape), shape_to_string(expected));
}

Tensor Checkpoint::load(std::string_view name, DType dt, const std::optional<std::vector<int64_t>>& expected) const {
  if (expected) check_shape(name, *expected);
  const TensorView v = get(name);
  check_convertible(v.dtype, dt, fmt::format("tensor '{}' in checkpoint {}", name, dir_));
  return convert_tensor(v, dt);
}

Tensor Checkpoint::load_stacked(const std::vector<std::string>& names, DType dt,
                                const std::vector<int64_t>& per_expert) const {
  MOEX_CHECK(!names.empty(), "load_stacked: no tensors given (checkpoint {})", dir_);
  MOEX_CHECK(per_expert.size() + 1 <= size_t(kMaxRank), "load_stacked: per-expert shape {} has too many dimensions",
             shape_to_string(per_expert));
  std::vector<int64_t> shape{int64_t(names.size())};
  shape.insert(shape.end(), per_expert.begin(), per_expert.end());
  Tensor t = Tensor::empty(dt, shape.data(), int(shape.size()));
  int64_t per = 1;
  for (int64_t d : per_expert) per *= d;
  uint8_t* out = static_cast<uint8_t*>(t.data());
  for (size_t e = 0; e < names.size(); ++e) {
    check_shape(names[e], per_expert);
    const TensorView v = get(names[e]);
    check_convertible(v.dtype, dt, fmt::format("tensor '{}' in checkpoint {}", names[e], dir_));
    convert_into(out + size_t(e) * size_t(per) * dtype_size(dt), dt, v.data, v.dtype, per);
  }
  return t;
}

TensorView Checkpoint::get(std::string_view name, const std::vector<int64_t>& expected) const {
  check_shape(name, expected);
  return get(name);
}

}  // namespace moex
