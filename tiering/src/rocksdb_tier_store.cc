// RocksDB-backed SSD tier. Pages go to the default column family with blob files enabled (large
// values are written once to blob files instead of being rewritten by compaction); a "meta"
// column family maps each key to (page bytes, put sequence) so that opening the store rebuilds
// its recency index from small records only.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lru_index.h"
#include "oscarkv/tiering/tier_store.h"

namespace oscarkv::tiering {
namespace {

// The one adapter from rocksdb::Status.
absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(std::string(what), ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

std::string EncodeMeta(uint64_t bytes, uint64_t seq) {
  std::string m(16, '\0');
  std::memcpy(m.data(), &bytes, 8);
  std::memcpy(m.data() + 8, &seq, 8);
  return m;
}

class RocksDbTierStore final : public TierStore {
 public:
  static absl::StatusOr<std::unique_ptr<TierStore>> Open(const RocksDbTierOptions& o) {
    if (o.path.empty()) return absl::InvalidArgumentError("SSD tier path is empty");
    if (o.capacity_bytes == 0) return absl::InvalidArgumentError("SSD tier capacity is zero");
    std::error_code ec;
    std::filesystem::create_directories(o.path, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create SSD tier directory ", o.path, ": ", ec.message()));
    }
    rocksdb::DBOptions db_opts;
    db_opts.create_if_missing = true;
    db_opts.create_missing_column_families = true;
    db_opts.max_background_jobs = 2;
    // Pages and their metadata records are flushed together: after a crash a page is either
    // indexed and readable, or gone.
    db_opts.atomic_flush = true;
    // Page reads are whole blobs, often in demotion order: keep the kernel's readahead.
    db_opts.advise_random_on_open = false;
    rocksdb::ColumnFamilyOptions pages_opts;
    pages_opts.enable_blob_files = true;
    pages_opts.min_blob_size = 4096;
    pages_opts.blob_file_size = 256ull << 20;
    pages_opts.enable_blob_garbage_collection = true;
    pages_opts.compression = rocksdb::kNoCompression;  // pages are already dense
    pages_opts.blob_compression_type = rocksdb::kNoCompression;
    // Bounds the write-ahead log replayed after a crash (kill -9) to about this many bytes.
    pages_opts.write_buffer_size = 32ull << 20;
    pages_opts.max_write_buffer_number = 4;  // puts go on while a full memtable is flushed
    rocksdb::ColumnFamilyOptions meta_opts;
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
        {rocksdb::kDefaultColumnFamilyName, pages_opts}, {"meta", meta_opts}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    absl::Status s = FromRocks(rocksdb::DB::Open(db_opts, o.path, cfs, &handles, &raw),
                               absl::StrCat("open SSD tier at ", o.path));
    if (!s.ok()) return s;
    auto store = std::unique_ptr<RocksDbTierStore>(new RocksDbTierStore(o, raw, handles));
    if (absl::Status r = store->Recover(); !r.ok()) return r;
    return std::unique_ptr<TierStore>(std::move(store));
  }

  ~RocksDbTierStore() override {
    // Flush the memtables on a clean close, so the next Open replays no write-ahead log (which
    // would read page bytes): recovery then reads only the metadata column family.
    rocksdb::FlushOptions fo;
    fo.wait = true;
    (void)db_->Flush(fo, handles_);
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    db_->Close();
    delete db_;
  }

  absl::Status Put(const TierKey& key, std::span<const uint8_t> page) override {
    if (page.size() > opts_.capacity_bytes) {
      return absl::ResourceExhaustedError("page larger than the SSD tier capacity");
    }
    const std::string k = key.Bytes();
    rocksdb::WriteBatch batch;
    std::vector<std::pair<TierKey, uint64_t>> evicted;
    uint64_t seq;
    {
      // Decide evictions and publish the key under the lock; the I/O happens after it.
      absl::MutexLock l(&mu_);
      index_.Remove(key);
      while (index_.used() + page.size() > opts_.capacity_bytes) {
        const TierKey victim = *index_.LeastRecent();
        evicted.emplace_back(victim, *index_.Remove(victim));
      }
      seq = ++next_seq_;
      index_.Insert(key, page.size());
      stats_.evictions += evicted.size();
      ++stats_.puts;
    }
    for (const auto& [victim, bytes] : evicted) {
      const std::string vk = victim.Bytes();
      batch.Delete(pages_cf(), vk);
      batch.Delete(meta_cf(), vk);
    }
    batch.Put(pages_cf(), k,
              rocksdb::Slice(reinterpret_cast<const char*>(page.data()), page.size()));
    batch.Put(meta_cf(), k, EncodeMeta(page.size(), seq));
    rocksdb::WriteOptions wo;
    wo.sync = opts_.sync_writes;
    wo.disableWAL = !opts_.sync_writes;  // see RocksDbTierOptions::sync_writes
    absl::Status s = FromRocks(db_->Write(wo, &batch), "SSD tier write");
    if (!s.ok()) {
      absl::MutexLock l(&mu_);
      index_.Remove(key);  // the evicted pages may or may not be gone; they are unindexed
      --stats_.puts;
    }
    return s;
  }

  absl::Status Get(const TierKey& key, std::vector<uint8_t>* out) override {
    {
      absl::MutexLock l(&mu_);
      if (!index_.Touch(key)) {
        ++stats_.misses;
        return absl::NotFoundError("not in the SSD tier");
      }
    }
    rocksdb::PinnableSlice value;
    absl::Status s =
        FromRocks(db_->Get(rocksdb::ReadOptions(), pages_cf(), key.Bytes(), &value), "SSD tier read");
    if (s.ok()) {
      out->assign(value.data(), value.data() + value.size());
      if (opts_.verify_on_get) s = VerifyTierPage(key, *out);
    }
    {
      absl::MutexLock l(&mu_);
      if (absl::IsDataLoss(s)) {
        ++stats_.corruptions;
      } else if (absl::IsNotFound(s)) {
        ++stats_.misses;  // deleted or evicted concurrently
      } else if (s.ok()) {
        ++stats_.hits;
      }
    }
    if (absl::IsDataLoss(s)) {
      out->clear();
      (void)Delete(key);  // never serve it again
    }
    return s;
  }

  bool Contains(const TierKey& key) override {
    absl::MutexLock l(&mu_);
    return index_.Contains(key);
  }

  absl::Status Delete(const TierKey& key) override {
    {
      absl::MutexLock l(&mu_);
      if (!index_.Remove(key)) return absl::NotFoundError("not in the SSD tier");
    }
    rocksdb::WriteBatch batch;
    const std::string k = key.Bytes();
    batch.Delete(pages_cf(), k);
    batch.Delete(meta_cf(), k);
    return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "SSD tier delete");
  }

  absl::Status Sync() override {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    fo.allow_write_stall = true;
    return FromRocks(db_->Flush(fo, handles_), "SSD tier flush");
  }

  TierStats Stats() override {
    absl::MutexLock l(&mu_);
    TierStats s = stats_;
    s.capacity_bytes = opts_.capacity_bytes;
    s.used_bytes = index_.used();
    s.pages = index_.size();
    return s;
  }

  void ForEachKey(const std::function<void(const TierKey&, uint64_t)>& fn) override {
    absl::MutexLock l(&mu_);
    index_.ForEach(fn);
  }

 private:
  RocksDbTierStore(const RocksDbTierOptions& o, rocksdb::DB* db,
                   std::vector<rocksdb::ColumnFamilyHandle*> handles)
      : opts_(o), db_(db), handles_(std::move(handles)) {}

  rocksdb::ColumnFamilyHandle* pages_cf() const { return handles_[0]; }
  rocksdb::ColumnFamilyHandle* meta_cf() const { return handles_[1]; }

  // Rebuilds the recency index from the meta column family (put order), then trims to capacity
  // in case the capacity was lowered since the last run.
  absl::Status Recover() {
    struct Rec {
      TierKey key;
      uint64_t bytes, seq;
    };
    std::vector<Rec> recs;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_cf()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto key = TierKey::FromBytes(std::string(it->key().data(), it->key().size()));
      if (!key.ok() || it->value().size() != 16) continue;  // foreign record: ignore
      Rec r{*key, 0, 0};
      std::memcpy(&r.bytes, it->value().data(), 8);
      std::memcpy(&r.seq, it->value().data() + 8, 8);
      recs.push_back(r);
    }
    if (absl::Status s = FromRocks(it->status(), "SSD tier recovery scan"); !s.ok()) return s;
    std::sort(recs.begin(), recs.end(), [](const Rec& a, const Rec& b) { return a.seq < b.seq; });
    std::vector<TierKey> trim;
    {
      absl::MutexLock l(&mu_);
      for (const Rec& r : recs) {
        index_.Insert(r.key, r.bytes);
        next_seq_ = std::max(next_seq_, r.seq);
      }
      while (index_.used() > opts_.capacity_bytes) {
        trim.push_back(*index_.LeastRecent());
        index_.Remove(trim.back());
      }
      stats_.evictions += trim.size();
    }
    rocksdb::WriteBatch b;
    for (const TierKey& k : trim) {
      b.Delete(pages_cf(), k.Bytes());
      b.Delete(meta_cf(), k.Bytes());
    }
    return FromRocks(db_->Write(rocksdb::WriteOptions(), &b), "SSD tier trim");
  }

  const RocksDbTierOptions opts_;
  rocksdb::DB* const db_;
  const std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  absl::Mutex mu_;
  LruIndex index_ ABSL_GUARDED_BY(mu_);
  TierStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TierStore>> OpenRocksDbTierStore(const RocksDbTierOptions& o) {
  return RocksDbTierStore::Open(o);
}

}  // namespace oscarkv::tiering
