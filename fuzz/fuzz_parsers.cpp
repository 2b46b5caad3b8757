// fuzz/fuzz_parsers.cpp — fuzz target for the checkpoint parsers: the safetensors reader (header,
// offsets, dtypes; then every tensor's bytes are read) and the config.json / generation_config.json
// parsers. The only acceptable outcomes are a parsed result or a moex::Error; anything else (a crash,
// a sanitizer report, another exception type) is a bug.
//
// The first input byte picks the parser: even = safetensors, odd = config (bit 1: generation config).
// Built two ways by fuzz/run_fuzz.sh: with libFuzzer (clang -fsanitize=fuzzer) or, where libFuzzer is
// unavailable, with the small mutation driver below (MOEX_FUZZ_STANDALONE).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "moex/config.hpp"
#include "moex/error.hpp"
#include "moex/safetensors.hpp"

static void run_one(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t sel = data[0];
  ++data;
  --size;
  try {
    if ((sel & 1) == 0) {
      auto f = moex::SafetensorsFile::from_bytes(data, size, "fuzz.safetensors");
      uint64_t sum = 0;
      for (const auto& n : f.names()) {
        auto [p, nb] = f.bytes(n);
        for (size_t i = 0; i < nb; ++i) sum += p[i];
        try {
          moex::TensorView v = f.get(n);
          sum += uint64_t(v.numel());
        } catch (const moex::Error&) {
        }
      }
      (void)f.metadata();
      if (sum == 0xdeadbeefcafef00dull) std::abort();  // keeps the reads
    } else if ((sel & 2) == 0) {
      moex::ModelConfig m = moex::parse_model_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
      for (int64_t l = 0; l < m.text.num_hidden_layers && l < 4096; ++l) {
        (void)m.text.is_moe_layer(l);
        (void)m.text.attention_window(l);
      }
    } else {
      (void)moex::parse_generation_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
    }
  } catch (const moex::Error&) {
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run_one(data, size);
  return 0;
}

#ifdef MOEX_FUZZ_STANDALONE
// A small mutation fuzzer: seeds from files given on the command line, mutated by byte flips,
// insertions, deletions, JSON-token splices, boundary integers in the 8-byte header length, and
// crossover. Usage: moex_fuzz_parsers_standalone SECONDS SEED_FILE...
#include <chrono>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 60.0;
  std::vector<std::string> corpus;
  for (int i = 2; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string name = argv[i];
    const bool json = name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0;
    const bool gen = name.find("generation_config") != std::string::npos;
    corpus.push_back(std::string(1, char(json ? (gen ? 3 : 1) : 0)) + s);
  }
  if (corpus.empty()) corpus.push_back(std::string(1, '\1') + "{\"model_type\":\"qwen3_moe\"}");
  std::mt19937_64 rng(12345);
  static const char* tokens[] = {"{", "}", "[", "]", "\"", ":", ",", "null", "true", "-1", "0", "1e308",
                                 "18446744073709551615", "\"F32\"", "\"data_offsets\"", "\"shape\"", "\"dtype\"",
                                 "\"rope_parameters\"", "\"text_config\"", "\"layer_types\"", "[[[[", "\\u0000"};
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t n = 0;
  for (;; ++n) {
    if ((n & 255) == 0) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (el >= seconds) break;
    }
    std::string s = corpus[rng() % corpus.size()];
    const int muts = 1 + int(rng() % 6);
    for (int m = 0; m < muts && s.size() > 1; ++m) {
      const size_t p = 1 + rng() % (s.size() - 1);
      switch (rng() % 8) {
        case 0: s[p] = char(s[p] ^ (1 << (rng() % 8))); break;
        case 1: s[p] = char(rng()); break;
        case 2: s.erase(p, 1 + rng() % 16); break;
        case 3: s.insert(p, tokens[rng() % (sizeof tokens / sizeof *tokens)]); break;
        case 4: s.resize(p); break;
        case 5: {  // header length field of a safetensors image
          if (s[0] % 2 == 0 && s.size() >= 9) {
            static const uint64_t vals[] = {0, 1, 7, 8, 0x7fffffffffffffffull, 0xffffffffffffffffull, 100u << 20, 1u << 20};
            uint64_t v = (rng() & 1) ? vals[rng() % 8] : rng() % (s.size() + 16);
            for (int b = 0; b < 8; ++b) s[1 + size_t(b)] = char((v >> (8 * b)) & 0xff);
          }
          break;
        }
        case 6: {  // duplicate a chunk
          const size_t len = 1 + rng() % 32;
          s.insert(p, s.substr(p, len));
          break;
        }
        default: {  // crossover
          const std::string& o = corpus[rng() % corpus.size()];
          if (o.size() > 1) {
            const size_t q = 1 + rng() % (o.size() - 1);
            s = s.substr(0, p) + o.substr(q);
          }
        }
      }
    }
    if (s.size() > (1u << 20)) s.resize(1u << 20);
    run_one(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    if ((rng() % 64) == 0 && corpus.size() < 4096) corpus.push_back(s);  // keep some mutants as new seeds
  }
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("moex_fuzz_parsers: %llu inputs in %.0f s, no crash\n", (unsigned long long)n, el);
  return 0;
}
#endif
