#include "format/hash.hpp"

#include "core/error.hpp"

#include <openssl/evp.h>
#include <xxhash.h>

namespace ep::format {

struct Sha256Hasher::Impl {
  EVP_MD_CTX *ctx = nullptr;
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

Sha256Hasher::Sha256Hasher() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (!impl_->ctx || EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1)
    fail(Status::internal, "SHA-256: EVP_DigestInit_ex failed");
}

Sha256Hasher::~Sha256Hasher() = default;

void Sha256Hasher::update(const void *data, size_t n) {
  if (n && EVP_DigestUpdate(impl_->ctx, data, n) != 1) fail(Status::internal, "SHA-256: EVP_DigestUpdate failed");
}

Sha256 Sha256Hasher::finish() {
  Sha256 out{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, out.data(), &len) != 1 || len != out.size())
    fail(Status::internal, "SHA-256: EVP_DigestFinal_ex failed");
  return out;
}

Sha256 sha256(const void *data, size_t n) {
  Sha256Hasher h;
  h.update(data, n);
  return h.finish();
}

Xxh3Hasher::Xxh3Hasher() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t *>(state_));
}

Xxh3Hasher::~Xxh3Hasher() { XXH3_freeState(static_cast<XXH3_state_t *>(state_)); }

void Xxh3Hasher::update(const void *data, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t *>(state_), data, n);
}

uint64_t Xxh3Hasher::finish() const { return XXH3_64bits_digest(static_cast<XXH3_state_t *>(state_)); }

uint64_t xxh3_64(const void *data, size_t n) { return XXH3_64bits(data, n); }

std::string hex(const Sha256 &digest) {
  static const char *digits = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint8_t b : digest) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

}  // namespace ep::format
