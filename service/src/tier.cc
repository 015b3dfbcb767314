#include "oscarkv/service/tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace oscarkv::service {
namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One writer batch: at most this many pages or (about) bytes.
constexpr size_t kMaxBatchPages = 64;
constexpr uint64_t kMaxBatchBytes = 16ull << 20;

// Version 1: records of (u32 length, profile). Version 2: records of (u32 length, namespace
// label, u32 length, profile).
constexpr char kCodecsMagic1[8] = {'O', 'K', 'V', 'C', 'O', 'D', 'E', '1'};
constexpr char kCodecsMagic[8] = {'O', 'K', 'V', 'C', 'O', 'D', 'E', '2'};
constexpr size_t kMaxCodecRecord = 1 << 16;

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PageTier>> PageTier::Open(const TierOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("tier.path is empty");
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(options.path) / "pages", ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tier.path ", options.path, " holds a tier of an older format (pages/: RocksDB blob "
        "files) that this oscarkvd cannot read; remove ", options.path, "/pages to start the "
        "tier empty"));
  }
  tiering::SegmentTierOptions so;
  so.path = options.path;
  so.capacity_bytes = options.capacity_bytes;
  so.sync_writes = options.sync_writes;
  auto store = tiering::OpenSegmentTierStore(so);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("SSD tier at ", options.path, ": ", store.status().message(),
                                     " (another oscarkvd using the same tier.path holds its "
                                     "lock)"));
  }
  return OpenWith(options, *std::move(store));
}

absl::StatusOr<std::unique_ptr<PageTier>> PageTier::OpenWith(
    const TierOptions& options, std::unique_ptr<tiering::TierStore> store) {
  if (options.capacity_bytes == 0) return absl::InvalidArgumentError("tier capacity is zero");
  if (options.queue_bytes == 0) return absl::InvalidArgumentError("tier queue size is zero");
  return std::unique_ptr<PageTier>(new PageTier(options, std::move(store)));
}

PageTier::PageTier(TierOptions options, std::unique_ptr<tiering::TierStore> store)
    : options_(std::move(options)), store_(std::move(store)) {
  writer_ = std::thread([this] { WriterLoop(); });
}

PageTier::~PageTier() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    work_.SignalAll();
  }
  writer_.join();
}

bool PageTier::Demote(const tiering::TierKey& key, std::span<const uint8_t> page) {
  if (page.size() > options_.queue_bytes) {
    counters_.demote_drops.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Copy before taking the lock: the caller's slot is freed right after this returns.
  std::shared_ptr<const PageBytes> bytes = CopyToBuffer(page);
  absl::MutexLock l(&mu_);
  if (queued_bytes_ + page.size() > options_.queue_bytes) {
    counters_.demote_waits.fetch_add(1, std::memory_order_relaxed);
    const absl::Time deadline = absl::Now() + options_.max_wait;
    while (queued_bytes_ + page.size() > options_.queue_bytes && !stop_) {
      if (room_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (queued_bytes_ + page.size() > options_.queue_bytes || stop_) {
      counters_.demote_drops.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  }
  const uint64_t seq = ++next_seq_;
  Pending& p = pending_[key];
  if (p.bytes != nullptr) queued_bytes_ -= p.bytes->size();  // replaced before it was written
  p = {seq, std::move(bytes)};
  queued_bytes_ += page.size();
  queue_.emplace_back(key, seq);
  work_.Signal();
  return true;
}

std::shared_ptr<const PageBytes> PageTier::CopyToBuffer(std::span<const uint8_t> page) {
  std::unique_ptr<PageBytes> b;
  {
    absl::MutexLock l(&free_mu_);
    if (!free_.empty()) {
      b = std::move(free_.back());
      free_.pop_back();
      free_bytes_ -= b->capacity();
    }
  }
  if (b == nullptr) b = std::make_unique<PageBytes>();
  b->assign(page.begin(), page.end());  // into memory used before: no page faults
  return std::shared_ptr<const PageBytes>(b.release(), [this](const PageBytes* v) {
    std::unique_ptr<PageBytes> owned(const_cast<PageBytes*>(v));
    absl::MutexLock l(&free_mu_);
    if (free_bytes_ + owned->capacity() > options_.queue_bytes / 4) return;  // freed
    free_bytes_ += owned->capacity();
    free_.push_back(std::move(owned));
  });
}

void PageTier::WriterLoop() {
  struct Job {
    tiering::TierKey key;
    uint64_t seq;
    std::shared_ptr<const PageBytes> bytes;
  };
  for (;;) {
    std::vector<Job> jobs;
    {
      absl::MutexLock l(&mu_);
      while (!stop_ && queue_.empty()) {
        if (unsynced_ == 0) {
          work_.Wait(&mu_);
          continue;
        }
        // Idle with puts not yet on disk: make them durable after a quiet spell (a burst of
        // demotions is synced once, not page by page).
        const bool quiet = work_.WaitWithTimeout(&mu_, options_.sync_interval);
        if (stop_ || !queue_.empty() || !quiet || unsynced_ == 0) continue;
        unsynced_ = 0;
        writing_ = true;
        mu_.Unlock();
        absl::Status s;
        {
          absl::MutexLock io(&io_mu_);
          s = store_->Sync();
        }
        mu_.Lock();
        writing_ = false;
        last_sync_ = absl::Now();
        if (!s.ok()) ++sync_errors_;
        drained_.SignalAll();
      }
      if (stop_) return;
      // Take what is queued, up to a batch: the store writes pages that land back to back with
      // one write and their index records in one batch.
      uint64_t batch_bytes = 0;
      while (!queue_.empty() && jobs.size() < kMaxBatchPages && batch_bytes < kMaxBatchBytes) {
        const auto [key, seq] = queue_.front();
        queue_.pop_front();
        auto it = pending_.find(key);
        if (it == pending_.end() || it->second.seq != seq) continue;  // deleted or replaced
        jobs.push_back({key, seq, it->second.bytes});
        batch_bytes += it->second.bytes->size();
      }
      if (jobs.empty()) {
        if (queue_.empty()) drained_.SignalAll();
        continue;
      }
      writing_ = true;
    }
    std::vector<absl::Status> results(jobs.size(), absl::AbortedError("deleted meanwhile"));
    {
      absl::MutexLock io(&io_mu_);
      std::vector<tiering::TierStore::PutItem> items;
      std::vector<size_t> index;
      {
        absl::MutexLock l(&mu_);  // a Delete/Clear may have come before io_mu_ was taken
        for (size_t k = 0; k < jobs.size(); ++k) {
          auto it = pending_.find(jobs[k].key);
          if (it == pending_.end() || it->second.seq != jobs[k].seq) continue;
          items.push_back({jobs[k].key, std::span<const uint8_t>(jobs[k].bytes->data(),
                                                                 jobs[k].bytes->size())});
          index.push_back(k);
        }
      }
      if (!items.empty()) {
        const int64_t t0 = NowNanos();
        std::vector<absl::Status> rs = store_->PutMany(items);
        const int64_t per_page = (NowNanos() - t0) / static_cast<int64_t>(items.size());
        for (size_t k = 0; k < items.size(); ++k) {
          results[index[k]] = rs[k];
          counters_.demote_latency.Observe(per_page);
        }
      }
    }
    uint64_t put_bytes = 0;
    for (size_t k = 0; k < jobs.size(); ++k) {
      if (results[k].ok()) {
        counters_.demotions.fetch_add(1, std::memory_order_relaxed);
        counters_.demoted_bytes.fetch_add(jobs[k].bytes->size(), std::memory_order_relaxed);
        put_bytes += jobs[k].bytes->size();
      } else if (!absl::IsAborted(results[k])) {
        counters_.demote_drops.fetch_add(1, std::memory_order_relaxed);
      }
    }
    bool sync_now = false;
    {
      absl::MutexLock l(&mu_);
      unsynced_ += put_bytes;
      // In a long burst, sync every burst_sync_interval or sync_bytes anyway: that bounds what
      // a power loss loses.
      sync_now = unsynced_ >= options_.sync_bytes ||
                 (unsynced_ > 0 && absl::Now() - last_sync_ >= options_.burst_sync_interval);
      if (sync_now) unsynced_ = 0;
    }
    if (sync_now) {
      absl::MutexLock io(&io_mu_);
      if (!store_->Sync().ok()) {
        absl::MutexLock l(&mu_);
        ++sync_errors_;
      }
    }
    absl::MutexLock l(&mu_);
    if (sync_now) last_sync_ = absl::Now();
    for (const Job& job : jobs) {
      auto it = pending_.find(job.key);
      if (it != pending_.end() && it->second.seq == job.seq) {
        queued_bytes_ -= it->second.bytes->size();
        pending_.erase(it);
      }
    }
    writing_ = false;
    room_.SignalAll();
    if (queue_.empty()) drained_.SignalAll();
  }
}

bool PageTier::Contains(const tiering::TierKey& key) {
  {
    absl::MutexLock l(&mu_);
    if (pending_.contains(key)) return true;
  }
  return store_->Contains(key);
}

absl::Status PageTier::Read(const tiering::TierKey& key, std::vector<uint8_t>* out) {
  for (int attempt = 0; attempt < 2; ++attempt) {  // again if it was replaced meanwhile
    auto size = SizeOf(key);
    if (!size.ok()) {
      counters_.misses.fetch_add(1, std::memory_order_relaxed);
      return size.status();
    }
    out->resize(*size);
    absl::Status s = ReadInto(key, *out);
    if (absl::IsFailedPrecondition(s)) continue;
    if (!s.ok()) out->clear();
    return s;
  }
  out->clear();
  return absl::AbortedError("SSD tier page replaced while it was read");
}

absl::StatusOr<uint64_t> PageTier::SizeOf(const tiering::TierKey& key) {
  {
    absl::MutexLock l(&mu_);
    auto it = pending_.find(key);
    if (it != pending_.end()) return it->second.bytes->size();
  }
  return store_->SizeOf(key);
}

absl::Status PageTier::ReadInto(const tiering::TierKey& key, std::span<uint8_t> out) {
  const int64_t t0 = NowNanos();
  {
    absl::MutexLock l(&mu_);
    auto it = pending_.find(key);
    if (it != pending_.end()) {
      const PageBytes& bytes = *it->second.bytes;
      if (bytes.size() != out.size()) {
        return absl::FailedPreconditionError("SSD tier page changed size while it was read");
      }
      std::memcpy(out.data(), bytes.data(), bytes.size());  // verified at Commit
      counters_.hits.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    }
  }
  absl::Status s = store_->GetInto(key, out);  // one pread into `out`, checksum fused
  counters_.promote_latency.Observe(NowNanos() - t0);
  if (s.ok()) {
    counters_.hits.fetch_add(1, std::memory_order_relaxed);
  } else if (absl::IsDataLoss(s)) {
    counters_.corruptions.fetch_add(1, std::memory_order_relaxed);  // the store removed it
  } else if (!absl::IsFailedPrecondition(s)) {
    counters_.misses.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

bool PageTier::KeepsCopy(const tiering::TierKey& key) {
  {
    absl::MutexLock l(&mu_);
    if (pending_.contains(key)) return true;
  }
  return store_->KeepsCopy(key);
}

absl::Status PageTier::Delete(const tiering::TierKey& key) {
  bool was_pending = false;
  {
    absl::MutexLock l(&mu_);
    auto it = pending_.find(key);
    if (it != pending_.end()) {
      queued_bytes_ -= it->second.bytes->size();
      pending_.erase(it);
      was_pending = true;
      room_.SignalAll();
    }
  }
  absl::MutexLock io(&io_mu_);
  absl::Status s = store_->Delete(key);
  if (absl::IsNotFound(s) && was_pending) return absl::OkStatus();
  return s;
}

uint64_t PageTier::Clear(const CodecId* codec, uint64_t ns) {
  auto matches = [&](const tiering::TierKey& k) {
    return codec == nullptr || (k.codec == *codec && k.ns == ns);
  };
  uint64_t removed = 0;
  {
    absl::MutexLock l(&mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto cur = it++;
      if (!matches(cur->first)) continue;
      queued_bytes_ -= cur->second.bytes->size();
      pending_.erase(cur);
      ++removed;
    }
    room_.SignalAll();
  }
  std::vector<tiering::TierKey> keys;
  store_->ForEachKey([&](const tiering::TierKey& k, uint64_t) {
    if (matches(k)) keys.push_back(k);
  });
  absl::MutexLock io(&io_mu_);
  for (const auto& k : keys) removed += store_->Delete(k).ok();
  return removed;
}

uint64_t PageTier::Count(const CodecId& codec, uint64_t ns) {
  auto matches = [&](const tiering::TierKey& k) { return k.codec == codec && k.ns == ns; };
  uint64_t n = 0;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [k, p] : pending_) n += matches(k);
  }
  // A queued page may already be in the store too: counted twice at worst, never missed.
  store_->ForEachKey([&](const tiering::TierKey& k, uint64_t) { n += matches(k); });
  return n;
}

bool PageTier::Flush(absl::Time deadline) {
  {
    absl::MutexLock l(&mu_);
    while (!queue_.empty() || writing_) {
      if (drained_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (!queue_.empty() || writing_) return false;
    unsynced_ = 0;
  }
  absl::MutexLock io(&io_mu_);
  return store_->Sync().ok();
}

uint64_t PageTier::queued_bytes() const {
  absl::MutexLock l(&mu_);
  return queued_bytes_;
}

uint64_t PageTier::NamespaceTag(std::string_view label) {
  if (label.empty()) return 0;
  uint64_t h = 14695981039346656037ull;
  for (char c : label) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

absl::Status PageTier::SaveCodecs(const std::vector<SavedCodec>& codecs) {
  absl::MutexLock l(&codecs_mu_);
  std::string data(kCodecsMagic, sizeof(kCodecsMagic));
  for (const SavedCodec& c : codecs) {
    for (const std::string* p : {&c.ns, &c.profile}) {
      const uint32_t n = static_cast<uint32_t>(p->size());
      data.append(reinterpret_cast<const char*>(&n), 4);
      data.append(*p);
    }
  }
  const std::string path = (std::filesystem::path(options_.path) / "codecs").string();
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("open ", tmp, ": ", std::strerror(errno)));
  }
  absl::Status s = WriteAll(fd, data, tmp);
  if (s.ok() && ::fsync(fd) != 0) {
    s = absl::InternalError(absl::StrCat("fsync ", tmp, ": ", std::strerror(errno)));
  }
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat("rename ", tmp, ": ", std::strerror(errno)));
  }
  if (s.ok()) {
    const int dfd = ::open(options_.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return s;
}

absl::StatusOr<std::vector<PageTier::SavedCodec>> PageTier::LoadCodecs() const {
  absl::MutexLock l(&codecs_mu_);
  const std::string path = (std::filesystem::path(options_.path) / "codecs").string();
  std::ifstream in(path, std::ios::binary);
  std::vector<SavedCodec> out;
  if (!in) return out;  // a new tier
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  auto bad = [&](const char* why) {
    return absl::DataLossError(absl::StrCat(path, " is not a codecs file of this version (", why,
                                            "); move it away to start the tier without its "
                                            "codecs"));
  };
  if (data.size() < sizeof(kCodecsMagic)) return bad("bad magic");
  const bool v1 = std::memcmp(data.data(), kCodecsMagic1, sizeof(kCodecsMagic1)) == 0;
  if (!v1 && std::memcmp(data.data(), kCodecsMagic, sizeof(kCodecsMagic)) != 0) {
    return bad("bad magic");
  }
  size_t pos = sizeof(kCodecsMagic);
  auto field = [&](std::string* f) {
    uint32_t n = 0;
    if (data.size() - pos < 4) return false;
    std::memcpy(&n, data.data() + pos, 4);
    pos += 4;
    if (n > kMaxCodecRecord || data.size() - pos < n) return false;
    *f = data.substr(pos, n);
    pos += n;
    return true;
  };
  while (pos < data.size()) {
    SavedCodec c;  // a version-1 record has no namespace: "" (a daemon without tenants)
    if ((!v1 && !field(&c.ns)) || !field(&c.profile)) return bad("truncated record");
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace oscarkv::service
