// What the CPU and CUDA kernel caches share on disk: content hashes for cache keys (a kernel's
// source and toolchain) and for the checksums that make a corrupt cache file detectable, and
// files written whole or not at all.
//
// The hash is 128 bits from two independently mixed 64-bit lanes over 8-byte words; fast, not
// cryptographic — a cache entry also records the source it was made from, and is checked against
// it.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

inline uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

inline uint64_t rotl64(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

// 32 hex digits.
inline std::string content_hash(std::string_view data) {
  uint64_t a = 0x243f6a8885a308d3ull ^ data.size(),
           b = 0x13198a2e03707344ull ^ rotl64(data.size(), 32);
  size_t i = 0;
  for (; i + 8 <= data.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, data.data() + i, 8);
    a = rotl64((a ^ w) * 0x9e3779b97f4a7c15ull, 31);
    b = rotl64((b ^ rotl64(w, 29)) * 0xc2b2ae3d27d4eb4full, 27);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, data.data() + i, data.size() - i);
  a = mix64(a ^ tail);
  b = mix64(b ^ rotl64(tail, 17) ^ a);
  a = mix64(a + b);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint64_t p : {a, b})
    for (int shift = 60; shift >= 0; shift -= 4)
      out += digits[(p >> shift) & 0xf];
  return out;
}

// Every cache file ends in "\nKILNSUM <32 hex digits>\n", the content hash of what precedes it.
// (A shared object with bytes after its last section still loads: the loader maps segments.)
std::string checksum_trailer(std::string_view payload);
// The file without its trailer, when the trailer is there and matches.
std::optional<std::string_view> verified_payload(std::string_view file);

std::optional<std::string> read_file(const std::filesystem::path& path);
bool write_file(const std::filesystem::path& path, std::string_view content);
// Written whole under a temporary name in the same folder, then renamed into place: concurrent
// readers see the whole file or none.
bool write_atomically(const std::filesystem::path& path, std::string_view content);
// A name in `dir` no other writer (process or thread) uses at the same time.
std::filesystem::path temporary_path(const std::filesystem::path& dir, const std::string& what);

// The cache folder: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln ("" if none).
std::string default_cache_dir();

}  // namespace kiln
