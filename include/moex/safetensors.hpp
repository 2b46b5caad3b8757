// moex/safetensors.hpp — checkpoints in the reference library's on-disk format: memory-mapped
// `.safetensors` files, sharded checkpoints (`model.safetensors.index.json`) and a writer.
//
// Every malformed input (truncated file, header length past the end, malformed JSON header,
// offsets outside the data region, begin > end, byte size != numel * dtype size, overlapping
// tensors, unknown dtype, ...) is a moex::Error (ErrorCode::io or ErrorCode::parse) whose one-line
// message names the file and, where there is one, the tensor. No input makes the reader read out
// of bounds.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moex/tensor.hpp"

namespace moex {

// One tensor of a safetensors header. Offsets are relative to the start of the data region.
struct SafetensorsTensorInfo {
  std::string name;
  std::string st_dtype;          // the dtype string as stored: "F32", "BF16", "F8_E4M3", ...
  std::optional<DType> dtype;    // the moex dtype, or empty if moex has none (e.g. "U16", "F8_E5M2")
  std::vector<int64_t> shape;    // any rank; [] is a scalar (one element)
  uint64_t begin = 0, end = 0;   // byte offsets into the data region
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// "[2, 3]"
std::string shape_to_string(const std::vector<int64_t>& shape);
std::string shape_to_string(const TensorView& v);

// The safetensors dtype string of a moex dtype ("F32", "BF16", ...); throws for dtypes the format
// cannot store (fp4_e2m1x2: store it as "U8").
std::string_view safetensors_dtype_name(DType dt);

// A memory-mapped `.safetensors` file. Copies share the mapping; views returned by get() stay valid
// while any copy (or any Checkpoint holding it) is alive. The mapping is read-only.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  // Maps and validates the whole header. Throws moex::Error (io: cannot open / read; parse: corrupt).
  static SafetensorsFile open(const std::string& path);
  // Parses a file image held in memory (the bytes are copied). `label` names it in errors. Used by
  // the fuzz target and tests.
  static SafetensorsFile from_bytes(const void* data, size_t size, const std::string& label = "<memory>");

  const std::string& path() const;
  // Tensor names in the order of their data offsets.
  std::vector<std::string> names() const;
  size_t size() const;
  bool has(std::string_view name) const;
  // Throws ErrorCode::not_found naming the tensor and the file.
  const SafetensorsTensorInfo& info(std::string_view name) const;
  // A contiguous CPU view into the mapping. Rank-0 tensors are viewed as [1]. Throws for ranks above
  // kMaxRank and for dtypes moex has no type for (the message names both).
  TensorView get(std::string_view name) const;
  // The raw bytes of a tensor (any dtype, any rank).
  std::pair<const uint8_t*, size_t> bytes(std::string_view name) const;
  // `__metadata__` (string -> string); non-string values are ignored.
  const std::map<std::string, std::string>& metadata() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Writes tensors (CPU, contiguous; dtypes f32, f16, bf16, f64, i32, i64, u8, i8, fp8_e4m3, ue8m0) to
// a `.safetensors` file, data in the order given, header padded to 8 bytes. Writes to a temporary
// file beside `path` and renames it, so a failure never leaves a half-written file under `path`.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// One tensor as raw bytes (any stored dtype string, any rank): for copying tensors moex has no type for.
struct SafetensorsRawTensor {
  std::string name;
  std::string st_dtype;  // "F32", "F8_E4M3", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};
// The same as write_safetensors for raw tensors (the caller vouches that nbytes matches shape and dtype).
void write_safetensors_raw(const std::string& path, const std::vector<SafetensorsRawTensor>& tensors,
                           const std::map<std::string, std::string>& metadata = {});
// The same, tensors in name order.
void write_safetensors_map(const std::string& path, const std::map<std::string, TensorView>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// Converts a contiguous CPU tensor into a new owning CPU tensor of dtype `dt`. Float types (f32, f16,
// bf16, f64 → f32, f16, bf16) are converted with round-to-nearest-even; any dtype copies to itself;
// anything else is an error.
Tensor convert_tensor(const TensorView& src, DType dt);
// The same for `n` contiguous elements into caller memory (dst dtype `d`, src dtype `s`).
void convert_elements(void* dst, DType d, const void* src, DType s, int64_t n);

// The weights of a checkpoint directory: `model.safetensors`, or the shards listed in
// `model.safetensors.index.json` (its `weight_map`: name -> shard file) opened as one lookup.
// `open` also accepts the path of a single `.safetensors` file or of an index file.
class Checkpoint {
 public:
  Checkpoint() = default;
  static Checkpoint open(const std::string& dir_or_file);

  const std::string& dir() const { return dir_; }
  bool has(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return where_.size(); }
  // Throws ErrorCode::not_found: "tensor 'X' not found in checkpoint DIR".
  const SafetensorsTensorInfo& info(std::string_view name) const;
  TensorView get(std::string_view name) const;
  // get() plus a shape check: "tensor 'X' in DIR has shape [..] but the config implies [..]".
  TensorView get(std::string_view name, const std::vector<int64_t>& expected_shape) const;
  void check_shape(std::string_view name, const std::vector<int64_t>& expected_shape) const;
  // Loads a tensor into an owning CPU tensor of dtype `dt` (converted as convert_tensor does), after
  // checking its shape when `expected_shape` is given.
  Tensor load(std::string_view name, DType dt, const std::optional<std::vector<int64_t>>& expected_shape = {}) const;
  // Stacks per-expert tensors (e.g. `...experts.{e}.gate_proj.weight` for e = 0..E-1), each of shape
  // `per_expert_shape`, into one owning [E, per_expert_shape...] tensor of dtype `dt`.
  Tensor load_stacked(const std::vector<std::string>& names, DType dt, const std::vector<int64_t>& per_expert_shape) const;
  // The shard holding a tensor.
  const SafetensorsFile& file_of(std::string_view name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> where_;  // name -> index into files_
};

}  // namespace moex
