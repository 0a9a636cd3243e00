// Digests used by the formats: SHA-256 (OpenSSL EVP) and XXH3-64 (xxHash), incremental.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ep::format {

using Sha256 = std::array<uint8_t, 32>;

/// Incremental SHA-256.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher &) = delete;
  Sha256Hasher &operator=(const Sha256Hasher &) = delete;
  void update(const void *data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Sha256 finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

Sha256 sha256(const void *data, size_t n);

/// Incremental XXH3-64 (seed 0).
class Xxh3Hasher {
 public:
  Xxh3Hasher();
  ~Xxh3Hasher();
  Xxh3Hasher(const Xxh3Hasher &) = delete;
  Xxh3Hasher &operator=(const Xxh3Hasher &) = delete;
  void update(const void *data, size_t n);
  uint64_t finish() const;

 private:
  void *state_;
};

uint64_t xxh3_64(const void *data, size_t n);

std::string hex(const Sha256 &digest);

}  // namespace ep::format
