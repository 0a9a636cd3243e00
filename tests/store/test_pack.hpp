// The synthetic pack a store test reads: created once in the test's working directory, with the
// XXH3 of each object remembered (regenerating an object to hash it costs as much as writing it).
#pragma once

#include "testkit/store_pack.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace ep::test {

class TestPack {
 public:
  TestPack(const std::string &file, const testkit::SyntheticPackSpec &spec)
      : spec_(spec), path_((std::filesystem::current_path() / file).string()) {
    testkit::create_synthetic_pack(path_, spec_, 2);
  }
  const testkit::SyntheticPackSpec &spec() const { return spec_; }
  const std::string &path() const { return path_; }
  /// XXH3-64 of object (layer, expert)'s payload.
  uint64_t hash(uint32_t layer, uint32_t expert) const {
    std::lock_guard lock(mutex_);
    auto [it, fresh] = hashes_.try_emplace({layer, expert}, 0);
    if (fresh) it->second = testkit::synthetic_object_hash(spec_, layer, expert);
    return it->second;
  }

 private:
  testkit::SyntheticPackSpec spec_;
  std::string path_;
  mutable std::mutex mutex_;
  mutable std::map<std::pair<uint32_t, uint32_t>, uint64_t> hashes_;
};

}  // namespace ep::test
