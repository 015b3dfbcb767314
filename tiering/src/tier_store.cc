#include "oscarkv/tiering/tier_store.h"

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lru_index.h"
#include "oscarkv/kernels/page_format.h"

namespace oscarkv::tiering {

std::string TierKey::Bytes() const {
  std::string out(ns == 0 ? 32 : 40, '\0');
  std::memcpy(out.data(), codec.bytes.data(), 16);
  std::memcpy(out.data() + 16, block.bytes.data(), 16);
  for (int i = 0; ns != 0 && i < 8; ++i) out[32 + i] = static_cast<char>((ns >> (8 * i)) & 0xff);
  return out;
}

absl::StatusOr<TierKey> TierKey::FromBytes(std::string_view bytes) {
  if (bytes.size() != 32 && bytes.size() != 40) {
    return absl::InvalidArgumentError(
        absl::StrCat("tier key must be 32 or 40 bytes, got ", bytes.size()));
  }
  TierKey k;
  std::memcpy(k.codec.bytes.data(), bytes.data(), 16);
  std::memcpy(k.block.bytes.data(), bytes.data() + 16, 16);
  for (size_t i = 32; i < bytes.size(); ++i) {
    k.ns |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * (i - 32));
  }
  if (bytes.size() == 40 && k.ns == 0) {
    return absl::InvalidArgumentError("a 40-byte tier key with namespace tag 0");
  }
  return k;
}

absl::Status VerifyTierPage(const TierKey& key, std::span<const uint8_t> page) {
  return VerifyTierPageHeader(key, page, ComputePageChecksum(page));
}

absl::Status VerifyTierPageHeader(const TierKey& key, std::span<const uint8_t> page,
                                  uint64_t checksum) {
  auto h = ParsePageHeaderStandalone(page, /*verify_checksum=*/false);
  if (h.ok() && h->checksum != checksum) {
    return absl::DataLossError(absl::StrCat("SSD tier page ", key.block.Hex(),
                                            " is corrupt: checksum mismatch"));
  }
  if (!h.ok()) {
    return absl::DataLossError(absl::StrCat("SSD tier page ", key.block.Hex(), " is corrupt: ",
                                            std::string(h.status().message())));
  }
  if (std::memcmp(h->codec_id, key.codec.bytes.data(), 16) != 0) {
    return absl::DataLossError(absl::StrCat("SSD tier page ", key.block.Hex(),
                                            " carries another codec id"));
  }
  return absl::OkStatus();
}

std::vector<absl::Status> TierStore::PutMany(std::span<const PutItem> items) {
  std::vector<absl::Status> out;
  out.reserve(items.size());
  for (const PutItem& it : items) out.push_back(Put(it.key, it.page));
  return out;
}

absl::Status TierStore::GetInto(const TierKey& key, std::span<uint8_t> out) {
  std::vector<uint8_t> page;
  if (absl::Status s = Get(key, &page); !s.ok()) return s;
  if (page.size() != out.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SSD tier page ", key.block.Hex(), " has ", page.size(), " bytes, not ", out.size()));
  }
  std::memcpy(out.data(), page.data(), page.size());
  return absl::OkStatus();
}

namespace {

class MemoryTierStore final : public TierStore {
 public:
  explicit MemoryTierStore(uint64_t capacity) { stats_.capacity_bytes = capacity; }

  absl::Status Put(const TierKey& key, std::span<const uint8_t> page) override {
    if (page.size() > stats_.capacity_bytes) {
      return absl::ResourceExhaustedError("page larger than the tier capacity");
    }
    absl::MutexLock l(&mu_);
    if (auto old = index_.Remove(key)) pages_.erase(key);
    while (index_.used() + page.size() > stats_.capacity_bytes) {
      const TierKey victim = *index_.LeastRecent();
      index_.Remove(victim);
      pages_.erase(victim);
      ++stats_.evictions;
    }
    pages_[key].assign(page.begin(), page.end());
    index_.Insert(key, page.size());
    ++stats_.puts;
    return absl::OkStatus();
  }

  absl::Status Get(const TierKey& key, std::vector<uint8_t>* out) override {
    absl::MutexLock l(&mu_);
    auto it = pages_.find(key);
    if (it == pages_.end()) {
      ++stats_.misses;
      return absl::NotFoundError("not in the SSD tier");
    }
    if (absl::Status s = VerifyTierPage(key, it->second); !s.ok()) {
      index_.Remove(key);
      pages_.erase(it);
      ++stats_.corruptions;
      return s;
    }
    index_.Touch(key);
    *out = it->second;
    ++stats_.hits;
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> SizeOf(const TierKey& key) override {
    absl::MutexLock l(&mu_);
    auto it = pages_.find(key);
    if (it == pages_.end()) return absl::NotFoundError("not in the SSD tier");
    return it->second.size();
  }

  bool Contains(const TierKey& key) override {
    absl::MutexLock l(&mu_);
    return index_.Contains(key);
  }

  absl::Status Delete(const TierKey& key) override {
    absl::MutexLock l(&mu_);
    if (!index_.Remove(key)) return absl::NotFoundError("not in the SSD tier");
    pages_.erase(key);
    return absl::OkStatus();
  }

  TierStats Stats() override {
    absl::MutexLock l(&mu_);
    TierStats s = stats_;
    s.used_bytes = index_.used();
    s.pages = index_.size();
    return s;
  }

  void ForEachKey(const std::function<void(const TierKey&, uint64_t)>& fn) override {
    absl::MutexLock l(&mu_);
    index_.ForEach(fn);
  }

 private:
  absl::Mutex mu_;
  LruIndex index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TierKey, std::vector<uint8_t>> pages_ ABSL_GUARDED_BY(mu_);
  TierStats stats_ ABSL_GUARDED_BY(mu_);
};

class FaultInjectingTierStore final : public TierStore {
 public:
  FaultInjectingTierStore(std::unique_ptr<TierStore> base, FaultPlan plan)
      : base_(std::move(base)), plan_(plan), rng_(plan.seed) {}

  absl::Status Sync() override { return base_->Sync(); }
  absl::Status Put(const TierKey& key, std::span<const uint8_t> page) override {
    if (Roll(plan_.put_error_rate)) return absl::UnavailableError("injected SSD write error");
    return base_->Put(key, page);
  }
  absl::Status Get(const TierKey& key, std::vector<uint8_t>* out) override {
    if (Roll(plan_.get_error_rate)) return absl::UnavailableError("injected SSD read error");
    absl::Status s = base_->Get(key, out);
    if (!s.ok() || !Roll(plan_.get_corrupt_rate) || out->empty()) return s;
    // Corrupt what came back, then hold it to the same verification a real read gets.
    size_t pos;
    {
      absl::MutexLock l(&mu_);
      pos = rng_() % out->size();
    }
    (*out)[pos] ^= 0x5a;
    if (absl::Status v = VerifyTierPage(key, *out); !v.ok()) {
      out->clear();
      return v;
    }
    return s;
  }
  absl::StatusOr<uint64_t> SizeOf(const TierKey& key) override { return base_->SizeOf(key); }
  bool Contains(const TierKey& key) override { return base_->Contains(key); }
  bool KeepsCopy(const TierKey& key) override { return base_->KeepsCopy(key); }
  absl::Status Delete(const TierKey& key) override { return base_->Delete(key); }
  TierStats Stats() override { return base_->Stats(); }
  void ForEachKey(const std::function<void(const TierKey&, uint64_t)>& fn) override {
    base_->ForEachKey(fn);
  }

 private:
  bool Roll(double p) {
    if (p <= 0) return false;
    absl::MutexLock l(&mu_);
    return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }
  std::unique_ptr<TierStore> base_;
  FaultPlan plan_;
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<TierStore> NewMemoryTierStore(uint64_t capacity_bytes) {
  return std::make_unique<MemoryTierStore>(capacity_bytes);
}

std::unique_ptr<TierStore> NewFaultInjectingTierStore(std::unique_ptr<TierStore> base,
                                                      FaultPlan plan) {
  return std::make_unique<FaultInjectingTierStore>(std::move(base), plan);
}

}  // namespace oscarkv::tiering
