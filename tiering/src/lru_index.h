// Internal: the in-memory recency index shared by the tier stores. Not thread-safe; callers
// hold their own mutex.
#pragma once

#include <cstdint>
#include <list>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "oscarkv/tiering/tier_store.h"

namespace oscarkv::tiering {

class LruIndex {
 public:
  bool Contains(const TierKey& k) const { return map_.contains(k); }
  // Marks k most recently used; false if absent.
  bool Touch(const TierKey& k) {
    auto it = map_.find(k);
    if (it == map_.end()) return false;
    order_.splice(order_.end(), order_, it->second.pos);
    return true;
  }
  // Inserts or replaces k as most recently used.
  void Insert(const TierKey& k, uint64_t bytes) {
    Remove(k);
    order_.push_back(k);
    map_[k] = Entry{bytes, std::prev(order_.end())};
    used_ += bytes;
  }
  // Returns the removed entry's size, if it was present.
  std::optional<uint64_t> Remove(const TierKey& k) {
    auto it = map_.find(k);
    if (it == map_.end()) return std::nullopt;
    const uint64_t b = it->second.bytes;
    order_.erase(it->second.pos);
    map_.erase(it);
    used_ -= b;
    return b;
  }
  std::optional<TierKey> LeastRecent() const {
    if (order_.empty()) return std::nullopt;
    return order_.front();
  }
  uint64_t used() const { return used_; }
  uint64_t size() const { return map_.size(); }
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [k, e] : map_) f(k, e.bytes);
  }

 private:
  struct Entry {
    uint64_t bytes;
    std::list<TierKey>::iterator pos;
  };
  absl::flat_hash_map<TierKey, Entry> map_;
  std::list<TierKey> order_;
  uint64_t used_ = 0;
};

// Verifies a page read back from a tier: complete, intact, and of the key's codec.
absl::Status VerifyTierPage(const TierKey& key, std::span<const uint8_t> page);
// The same with the page checksum already computed (e.g. while the page was read).
absl::Status VerifyTierPageHeader(const TierKey& key, std::span<const uint8_t> page,
                                  uint64_t checksum);

}  // namespace oscarkv::tiering
