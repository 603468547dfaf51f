// Content hashes for the kernel caches: cache keys (a kernel's source and toolchain) and the
// checksums that make a corrupt cache file detectable. 128 bits from two independently seeded
// 64-bit FNV-1a passes, each finished with a strong mixer; not cryptographic — a cache entry also
// records what it was made from and is checked against it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::cpu {

inline uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

inline uint64_t fnv1a64(std::string_view data, uint64_t basis) {
  uint64_t h = basis;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return mix64(h ^ data.size());
}

// 32 hex digits.
inline std::string content_hash(std::string_view data) {
  static const char* digits = "0123456789abcdef";
  uint64_t parts[2] = {fnv1a64(data, 0xcbf29ce484222325ull), fnv1a64(data, 0x84222325cbf29ce4ull)};
  std::string out;
  for (uint64_t p : parts)
    for (int shift = 60; shift >= 0; shift -= 4)
      out += digits[(p >> shift) & 0xf];
  return out;
}

}  // namespace kiln::cpu
