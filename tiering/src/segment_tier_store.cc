// The SSD tier's real store: page bytes appended to segment files in demotion order, RocksDB as
// the index only (key -> segment, offset, length, checksum). On-disk layout: docs/FORMAT.md §5.
//
// Writes: one writer at a time (append_mu_) pwrites a page at the end of the current segment,
// then puts its index record (into RocksDB's write-ahead log; synced only with sync_writes).
// The record is written after the bytes, so after a kill -9 every record points at complete
// bytes. Sync() fdatasyncs the segments written since the last one, then the log. After a power
// loss a record may point at bytes that never reached the device: the read's checksum catches
// it (a miss; the record is removed), and recovery drops records that end past a file's end.
//
// Reads: the index lookup hands out a reference to the segment's open file, so a segment that
// is dropped meanwhile stays readable until the read is done. The page is pread straight into
// the caller's buffer in kReadChunkBytes pieces, each hashed while it is still in cache.
//
// Capacity: the bytes of all segment files. Room is made by deleting whole oldest segments --
// the least recently demoted pages. A page promoted and evicted again is re-appended once its
// old copy is in the older half of the tier (KeepsCopy), so pages in use drift to the new end.
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "lru_index.h"
#include "oscarkv/kernels/page_checksum.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/tiering/tier_store.h"

namespace oscarkv::tiering {
namespace {

namespace fs = std::filesystem;

constexpr char kSegmentMagic[8] = {'O', 'K', 'V', 'S', 'E', 'G', '0', '1'};
constexpr uint32_t kSegmentVersion = 1;
constexpr uint64_t kSegmentHeaderBytes = 64;
constexpr uint8_t kRecordVersion = 1;
constexpr size_t kRecordBytes = 32;
constexpr char kFormatKey[] = "oscarkv.tier.format";
constexpr char kFormatValue[] = "segments-1";
constexpr uint64_t kWritebackBytes = 4ull << 20;  // writeback is started every this many bytes
// Pages at least this large are written with O_DIRECT at 4096-aligned offsets (padded to a
// multiple of 4096): the bytes go from the caller's buffer to the device without a copy into
// the page cache. Smaller pages are written through the page cache, packed.
constexpr uint64_t kDirectMinBytes = 256 << 10;
constexpr uint64_t kAlign = 4096;
constexpr size_t kMaxRunPages = 256;  // pages in one pwritev (two iovecs each at most)
uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) & ~(kAlign - 1); }
// Pages are read in pieces of up to this size, each hashed right after its pread while it is
// still in the core's L2 cache. Large reads keep the kernel's readahead window large (measured:
// 128 KiB pieces read a Qwen3-8B page noticeably slower than one pread of the whole page).
constexpr uint64_t kReadChunkBytes = 2ull << 20;

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

absl::Status Errno(std::string_view what, const fs::path& path) {
  const int e = errno;
  const std::string msg =
      absl::StrCat(std::string(what), " ", path.string(), ": ", std::strerror(e));
  return e == ENOSPC ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
}

struct Location {
  uint64_t segment = 0;
  uint64_t offset = 0;
  uint64_t checksum = 0;  // the page's XXH3 (its header's checksum field)
  uint32_t length = 0;
  bool SamePlace(const Location& o) const { return segment == o.segment && offset == o.offset; }
};

// Index record (32 bytes, little-endian): version u8, 3 zero bytes, length u32, segment u64,
// offset u64, checksum u64.
std::string EncodeRecord(const Location& l) {
  std::string r(kRecordBytes, '\0');
  r[0] = static_cast<char>(kRecordVersion);
  std::memcpy(r.data() + 4, &l.length, 4);
  std::memcpy(r.data() + 8, &l.segment, 8);
  std::memcpy(r.data() + 16, &l.offset, 8);
  std::memcpy(r.data() + 24, &l.checksum, 8);
  return r;
}

bool DecodeRecord(const rocksdb::Slice& v, Location* l) {
  if (v.size() != kRecordBytes || static_cast<uint8_t>(v[0]) != kRecordVersion) return false;
  if (v[1] != 0 || v[2] != 0 || v[3] != 0) return false;
  std::memcpy(&l->length, v.data() + 4, 4);
  std::memcpy(&l->segment, v.data() + 8, 8);
  std::memcpy(&l->offset, v.data() + 16, 8);
  std::memcpy(&l->checksum, v.data() + 24, 8);
  return l->length > 0 && l->offset >= kSegmentHeaderBytes;
}

std::string SegmentName(uint64_t id) { return absl::StrFormat("%016x.seg", id); }

bool ParseSegmentName(const std::string& name, uint64_t* id) {
  if (name.size() != 20 || name.substr(16) != ".seg") return false;
  uint64_t v = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = name[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *id = v;
  return v != 0;
}

absl::Status PwriteAll(int fd, const uint8_t* p, size_t n, uint64_t off, const fs::path& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Errno("write", path);
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// An open segment file, closed when its last holder lets go: a dropped segment is unlinked at
// once and stays readable by the reads already under way.
struct SegmentFile {
  int fd = -1;   // buffered: reads, small pages, the header
  int dfd = -1;  // O_DIRECT writes of large pages (the current segment only; -1 if unsupported)
  fs::path path;
  ~SegmentFile() {
    if (fd >= 0) ::close(fd);
    if (dfd >= 0) ::close(dfd);
  }
};

struct FreeDeleter {
  void operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t{kAlign}); }
};

struct Segment {
  std::shared_ptr<SegmentFile> file;
  uint64_t bytes = 0;         // file size: header plus every page appended
  std::vector<TierKey> keys = {};  // in append order; live while the index points here
  bool dirty = false;         // written since the last Sync
  uint64_t live = 0;          // index entries that point here
};

class SegmentTierStore final : public TierStore {
 public:
  static absl::StatusOr<std::unique_ptr<TierStore>> Open(const SegmentTierOptions& o) {
    if (o.path.empty()) return absl::InvalidArgumentError("SSD tier path is empty");
    if (o.capacity_bytes == 0) return absl::InvalidArgumentError("SSD tier capacity is zero");
    const fs::path root(o.path);
    std::error_code ec;
    fs::create_directories(root / "segments", ec);
    if (!ec) fs::create_directories(root / "index", ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create SSD tier directory ", o.path, ": ", ec.message()));
    }
    rocksdb::Options db_opts;
    db_opts.create_if_missing = true;
    db_opts.max_background_jobs = 1;
    db_opts.write_buffer_size = 16ull << 20;  // ~300,000 records
    db_opts.keep_log_file_num = 2;
    db_opts.compression = rocksdb::kNoCompression;
    rocksdb::DB* raw = nullptr;
    absl::Status s = FromRocks(rocksdb::DB::Open(db_opts, (root / "index").string(), &raw),
                               absl::StrCat("open SSD tier index at ", o.path));
    if (!s.ok()) return s;
    uint64_t seg = o.segment_bytes;
    // About 32 segments: few open files however large the tier, and a drop frees ~3% of it.
    if (seg == 0) seg = std::clamp<uint64_t>(o.capacity_bytes / 32, 64 << 10, 4ull << 30);
    auto store = std::unique_ptr<SegmentTierStore>(new SegmentTierStore(o, seg, raw));
    if (absl::Status f = store->CheckFormat(); !f.ok()) return f;
    if (absl::Status r = store->Recover(); !r.ok()) return r;
    return std::unique_ptr<TierStore>(std::move(store));
  }

  ~SegmentTierStore() override {
    (void)Sync();
    // Flush the index's memtable on a clean close, so the next Open replays no log.
    rocksdb::FlushOptions fo;
    fo.wait = true;
    (void)db_->Flush(fo);
    db_->Close();
    delete db_;
  }

  absl::Status Put(const TierKey& key, std::span<const uint8_t> page) override {
    const PutItem item{key, page};
    return PutMany(std::span<const PutItem>(&item, 1))[0];
  }

  // Places every page (space reserved at the end of the current segment, rolling to a new one
  // and dropping old ones as needed), writes each run of pages that are contiguous in one file
  // with one pwritev, then puts all their index records in one RocksDB batch.
  std::vector<absl::Status> PutMany(std::span<const PutItem> items) override {
    std::vector<absl::Status> out(items.size());
    absl::MutexLock a(&append_mu_);
    std::vector<TierKey> dead;  // index records of dropped segments' pages
    std::vector<fs::path> dropped;
    std::vector<Placed> placed;
    for (size_t i = 0; i < items.size(); ++i) {
      const size_t n = items[i].page.size();
      const uint64_t need = n + (n >= kDirectMinBytes ? 2 * kAlign : 0);  // alignment, padding
      if (n < kPageHeaderBytes) {
        out[i] = absl::InvalidArgumentError("not a page");
      } else if (n > UINT32_MAX || need + kSegmentHeaderBytes > opts_.capacity_bytes) {
        out[i] = absl::ResourceExhaustedError("page larger than the SSD tier capacity");
      } else {
        auto p = Place(i, n, need, &dead, &dropped);
        if (p.ok()) {
          placed.push_back(*p);
        } else {
          out[i] = p.status();
        }
      }
    }
    // Runs of pages back to back in one file, written the same way: one pwritev each.
    for (size_t r = 0; r < placed.size();) {
      size_t e = r + 1;
      while (e < placed.size() && e - r < kMaxRunPages && placed[e].file == placed[r].file &&
             placed[e].direct == placed[r].direct && placed[e].offset == placed[e - 1].end) {
        ++e;
      }
      const absl::Status w = WriteRun(items, std::span<const Placed>(&placed[r], e - r));
      for (size_t k = r; k < e; ++k) out[placed[k].item] = w;
      r = e;
    }
    for (const auto& f : retired_) {  // segments no longer appended to
      if (f->dfd >= 0) ::close(f->dfd);
      f->dfd = -1;
    }
    retired_.clear();
    if (opts_.sync_writes) {
      std::shared_ptr<SegmentFile> last;
      for (const Placed& p : placed) {
        if (p.file == last || !out[p.item].ok()) continue;
        last = p.file;
        if (::fdatasync(p.file->fd) != 0) out[p.item] = Errno("sync", p.file->path);
      }
    }
    rocksdb::WriteBatch batch;
    for (const TierKey& k : dead) batch.Delete(k.Bytes());
    {
      absl::MutexLock l(&mu_);
      for (const Placed& p : placed) {
        if (out[p.item].ok() && segments_.contains(p.segment)) {
          batch.Put(items[p.item].key.Bytes(), EncodeRecord(LocationOf(items, p)));
        }
      }
    }
    rocksdb::WriteOptions wo;
    wo.sync = opts_.sync_writes;
    const absl::Status s = batch.Count() == 0
                               ? absl::OkStatus()
                               : FromRocks(db_->Write(wo, &batch), "SSD tier index write");
    {
      absl::MutexLock l(&mu_);
      // Count the new entries first, so that no segment of this batch looks empty (and is
      // deleted) while the older copies its pages replace are let go below.
      std::vector<bool> gone(items.size(), false);
      for (const Placed& p : placed) {
        if (!out[p.item].ok()) continue;
        if (!s.ok()) {
          out[p.item] = s;
          continue;
        }
        auto seg = segments_.find(p.segment);
        if (seg == segments_.end()) {  // dropped by a later page of this batch: evicted at once
          ++stats_.evictions;
          gone[p.item] = true;
          continue;
        }
        seg->second.keys.push_back(items[p.item].key);
        ++seg->second.live;
      }
      for (const Placed& p : placed) {
        if (!out[p.item].ok() || gone[p.item]) continue;
        auto [it, inserted] = index_.try_emplace(items[p.item].key);
        if (!inserted) Unref(it->second.segment, &dropped);  // that copy is dead space now
        it->second = LocationOf(items, p);
        ++stats_.puts;
      }
    }
    Unlink(dropped);
    return out;
  }

  absl::Status Get(const TierKey& key, std::vector<uint8_t>* out) override {
    out->clear();
    absl::Status s;
    for (int attempt = 0; attempt < 2; ++attempt) {  // again if it was replaced meanwhile
      auto size = SizeOf(key);
      if (!size.ok()) {
        absl::MutexLock l(&mu_);
        ++stats_.misses;
        return size.status();
      }
      out->resize(*size);
      s = GetInto(key, *out);
      if (!absl::IsFailedPrecondition(s)) break;
    }
    if (!s.ok()) out->clear();
    return s;
  }

  absl::Status GetInto(const TierKey& key, std::span<uint8_t> out) override {
    Location loc;
    std::shared_ptr<SegmentFile> file;
    {
      absl::MutexLock l(&mu_);
      auto it = index_.find(key);
      if (it == index_.end()) {
        ++stats_.misses;
        return absl::NotFoundError("not in the SSD tier");
      }
      loc = it->second;
      file = segments_.at(loc.segment).file;
    }
    if (out.size() != loc.length) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SSD tier page ", key.block.Hex(), " has ", loc.length, " bytes, not ", out.size()));
    }
    absl::Status s = ReadVerified(*file, loc, key, out);
    if (absl::IsDataLoss(s)) {
      RemoveIfAt(key, loc);  // never served again
    } else if (s.ok()) {
      absl::MutexLock l(&mu_);
      ++stats_.hits;
    }
    return s;
  }

  absl::StatusOr<uint64_t> SizeOf(const TierKey& key) override {
    absl::MutexLock l(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return absl::NotFoundError("not in the SSD tier");
    return it->second.length;
  }

  bool Contains(const TierKey& key) override {
    absl::MutexLock l(&mu_);
    return index_.contains(key);
  }

  bool KeepsCopy(const TierKey& key) override {
    absl::MutexLock l(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    // Bytes still to be appended before this copy's segment is dropped.
    uint64_t headroom = opts_.capacity_bytes - std::min(used_, opts_.capacity_bytes);
    for (const auto& [id, seg] : segments_) {
      if (id > it->second.segment) break;
      headroom += seg.bytes;
    }
    return headroom >= opts_.capacity_bytes / 2;
  }

  absl::Status Delete(const TierKey& key) override {
    absl::MutexLock a(&append_mu_);
    std::vector<fs::path> dropped;
    {
      absl::MutexLock l(&mu_);
      auto it = index_.find(key);
      if (it == index_.end()) return absl::NotFoundError("not in the SSD tier");
      Unref(it->second.segment, &dropped);
      index_.erase(it);
    }
    absl::Status s =
        FromRocks(db_->Delete(rocksdb::WriteOptions(), key.Bytes()), "SSD tier delete");
    Unlink(dropped);
    return s;
  }

  absl::Status Sync() override {
    absl::MutexLock a(&append_mu_);
    std::vector<std::shared_ptr<SegmentFile>> files;
    {
      absl::MutexLock l(&mu_);
      for (auto& [id, seg] : segments_) {
        if (!seg.dirty) continue;
        files.push_back(seg.file);
        seg.dirty = false;
      }
    }
    for (const auto& f : files) {
      if (::fdatasync(f->fd) != 0) return Errno("sync", f->path);
    }
    if (dir_dirty_) {
      const fs::path dir = root_ / "segments";
      const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd < 0 || ::fsync(dfd) != 0) {
        absl::Status e = Errno("sync", dir);
        if (dfd >= 0) ::close(dfd);
        return e;
      }
      ::close(dfd);
      dir_dirty_ = false;
    }
    return FromRocks(db_->FlushWAL(/*sync=*/true), "SSD tier index sync");
  }

  TierStats Stats() override {
    absl::MutexLock l(&mu_);
    TierStats s = stats_;
    s.capacity_bytes = opts_.capacity_bytes;
    s.used_bytes = used_;
    s.pages = index_.size();
    return s;
  }

  void ForEachKey(const std::function<void(const TierKey&, uint64_t)>& fn) override {
    absl::MutexLock l(&mu_);
    for (const auto& [k, loc] : index_) fn(k, loc.length);
  }

 private:
  SegmentTierStore(const SegmentTierOptions& o, uint64_t segment_bytes, rocksdb::DB* db)
      : opts_(o), segment_bytes_(segment_bytes), root_(o.path), db_(db) {}

  absl::Status CheckFormat() {
    std::string v;
    rocksdb::Status g = db_->Get(rocksdb::ReadOptions(), kFormatKey, &v);
    if (g.IsNotFound()) {
      rocksdb::WriteOptions wo;
      wo.sync = true;
      return FromRocks(db_->Put(wo, kFormatKey, kFormatValue), "SSD tier index write");
    }
    if (absl::Status s = FromRocks(g, "SSD tier index read"); !s.ok()) return s;
    if (v != kFormatValue) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SSD tier at ", opts_.path, " has index format '", v, "', this build reads '",
          kFormatValue, "'; move the directory away to start an empty tier"));
    }
    return absl::OkStatus();
  }

  // Where one page of a PutMany goes: its reserved bytes [offset, end) of segment `segment`.
  struct Placed {
    size_t item;
    std::shared_ptr<SegmentFile> file;
    uint64_t segment, offset, end;
    bool direct;  // through file->dfd, padded to kAlign
  };

  static Location LocationOf(std::span<const PutItem> items, const Placed& p) {
    const auto page = items[p.item].page;
    return {p.segment, p.offset, StoredPageChecksum(page), static_cast<uint32_t>(page.size())};
  }

  // Reserves room for a page of n bytes (`need` with alignment) at the end of the current
  // segment: a new segment when it would pass segment_bytes_, oldest segments dropped while the
  // capacity would be passed. append_mu_ held.
  absl::StatusOr<Placed> Place(size_t item, uint64_t n, uint64_t need, std::vector<TierKey>* dead,
                               std::vector<fs::path>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_) {
    bool roll = cur_ == 0;
    if (!roll) {
      absl::MutexLock l(&mu_);
      const uint64_t cur_bytes = segments_.at(cur_).bytes;
      roll = cur_bytes > kSegmentHeaderBytes && cur_bytes + need > segment_bytes_;
    }
    // Two rounds at most: the second starts a new segment, beside which everything older can go.
    for (int round = 0; round < 2; ++round, roll = true) {
      if (roll) {
        if (absl::Status s = NewSegment(dead, dropped); !s.ok()) return s;
      }
      absl::MutexLock l(&mu_);
      DropOldest(need, cur_, dead, dropped);
      if (used_ + need > opts_.capacity_bytes) continue;  // only the current one is left, full
      Segment& seg = segments_.at(cur_);
      Placed p{item, seg.file, cur_, 0, 0, n >= kDirectMinBytes && seg.file->dfd >= 0};
      p.offset = p.direct ? AlignUp(seg.bytes) : seg.bytes;
      p.end = p.direct ? p.offset + AlignUp(n) : p.offset + n;
      used_ += p.end - seg.bytes;
      seg.bytes = p.end;  // the space is taken even if the write fails (dead space then)
      seg.dirty = true;
      return p;
    }
    return absl::InternalError("SSD tier: no room after a new segment");
  }

  // Writes a run of placed pages, back to back in one file, with one pwritev. Direct runs go
  // through file->dfd, each page padded with zeros to a multiple of kAlign: straight from the
  // caller's buffer when it is aligned (only its last partial block is staged), else staged
  // whole. append_mu_ held.
  absl::Status WriteRun(std::span<const PutItem> items, std::span<const Placed> run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_) {
    const SegmentFile& f = *run[0].file;
    const bool direct = run[0].direct;
    std::vector<iovec> iov;
    iov.reserve(2 * run.size());
    uint64_t total = 0;
    if (!direct) {
      for (const Placed& p : run) {
        const auto page = items[p.item].page;
        iov.push_back({const_cast<uint8_t*>(page.data()), page.size()});
        total += page.size();
      }
    } else {
      uint64_t stage = 0;  // staged bytes the run needs
      for (const Placed& p : run) {
        const auto page = items[p.item].page;
        const bool aligned = reinterpret_cast<uintptr_t>(page.data()) % kAlign == 0;
        stage += aligned ? (page.size() % kAlign != 0 ? kAlign : 0) : AlignUp(page.size());
      }
      if (stage_bytes_ < stage) {
        stage_.reset(static_cast<uint8_t*>(::operator new(stage, std::align_val_t{kAlign})));
        stage_bytes_ = stage;
      }
      uint8_t* st = stage_.get();
      for (const Placed& p : run) {
        const auto page = items[p.item].page;
        const bool aligned = reinterpret_cast<uintptr_t>(page.data()) % kAlign == 0;
        const uint64_t body = aligned ? page.size() & ~(kAlign - 1) : 0;
        if (body > 0) iov.push_back({const_cast<uint8_t*>(page.data()), body});
        const uint64_t rest = AlignUp(page.size() - body);
        if (rest > 0) {
          std::memcpy(st, page.data() + body, page.size() - body);
          std::memset(st + (page.size() - body), 0, rest - (page.size() - body));
          iov.push_back({st, rest});
          st += rest;
        }
        total += p.end - p.offset;
      }
    }
    const int fd = direct ? f.dfd : f.fd;
    const ssize_t w = ::pwritev(fd, iov.data(), static_cast<int>(iov.size()),
                                static_cast<off_t>(run[0].offset));
    if (w < 0) return Errno("write", f.path);
    if (static_cast<uint64_t>(w) != total) {
      return absl::ResourceExhaustedError(absl::StrCat("short write to ", f.path.string()));
    }
    const uint64_t end = run.back().end;
    if (!direct && end - writeback_from_ >= kWritebackBytes) {
      // Start writeback now (not waiting for it), so the next Sync finds little left to do.
      (void)::sync_file_range(f.fd, static_cast<off_t>(writeback_from_),
                              static_cast<off_t>(end - writeback_from_), SYNC_FILE_RANGE_WRITE);
      writeback_from_ = end;
    }
    return absl::OkStatus();
  }

  // Starts a new segment file and makes it the current one. append_mu_ held.
  absl::Status NewSegment(std::vector<TierKey>* dead, std::vector<fs::path>* dropped) {
    auto f = std::make_shared<SegmentFile>();
    f->path = root_ / "segments" / SegmentName(next_id_);
    f->fd = ::open(f->path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (f->fd < 0) return Errno("create", f->path);
    uint8_t header[kSegmentHeaderBytes] = {};
    std::memcpy(header, kSegmentMagic, 8);
    std::memcpy(header + 8, &kSegmentVersion, 4);
    const uint32_t header_bytes = kSegmentHeaderBytes;
    std::memcpy(header + 12, &header_bytes, 4);
    std::memcpy(header + 16, &next_id_, 8);
    if (absl::Status s = PwriteAll(f->fd, header, sizeof(header), 0, f->path); !s.ok()) {
      ::unlink(f->path.c_str());
      return s;
    }
    f->dfd = ::open(f->path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);  // -1: none (tmpfs)
    absl::MutexLock l(&mu_);
    // No longer appended to once the pages placed in it are written: its O_DIRECT descriptor is
    // closed at the end of this PutMany (only the writer uses dfd, under append_mu_).
    if (cur_ != 0) retired_.push_back(segments_.at(cur_).file);
    DropOldest(kSegmentHeaderBytes, 0, dead, dropped);
    segments_[next_id_] =
        Segment{.file = std::move(f), .bytes = kSegmentHeaderBytes, .dirty = true};
    used_ += kSegmentHeaderBytes;
    cur_ = next_id_++;
    writeback_from_ = 0;
    dir_dirty_ = true;
    return absl::OkStatus();
  }

  // One index entry less points into segment `id`: a segment left without any (every page in
  // it deleted or replaced), other than the one appended to, is deleted at once.
  void Unref(uint64_t id, std::vector<fs::path>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, append_mu_) {
    auto it = segments_.find(id);
    if (it == segments_.end() || --it->second.live > 0 || id == cur_) return;
    used_ -= it->second.bytes;
    dropped->push_back(it->second.file->path);
    segments_.erase(it);
  }

  void Unlink(const std::vector<fs::path>& dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_) {
    for (const fs::path& p : dropped) ::unlink(p.c_str());  // readers keep their open files
    if (!dropped.empty()) dir_dirty_ = true;
  }

  // Drops whole oldest segments (never `keep`) until `need` more bytes fit in the capacity.
  void DropOldest(uint64_t need, uint64_t keep, std::vector<TierKey>* dead,
                  std::vector<fs::path>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (used_ + need > opts_.capacity_bytes && !segments_.empty() &&
           segments_.begin()->first != keep) {
      auto it = segments_.begin();
      for (const TierKey& k : it->second.keys) {
        auto f = index_.find(k);
        if (f == index_.end() || f->second.segment != it->first) continue;
        index_.erase(f);
        dead->push_back(k);
        ++stats_.evictions;
      }
      used_ -= it->second.bytes;
      dropped->push_back(it->second.file->path);
      segments_.erase(it);
    }
  }

  static absl::Status ReadVerified(const SegmentFile& f, const Location& loc, const TierKey& key,
                                   std::span<uint8_t> out) {
    PageChecksummer sum;
    for (uint64_t done = 0; done < loc.length;) {
      const size_t n = std::min<uint64_t>(kReadChunkBytes, loc.length - done);
      const ssize_t r = ::pread(f.fd, out.data() + done, n, static_cast<off_t>(loc.offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        return absl::DataLossError(absl::StrCat("SSD tier page ", key.block.Hex(), ": read ",
                                                f.path.string(), ": ", std::strerror(errno)));
      }
      if (r == 0) {
        return absl::DataLossError(absl::StrCat("SSD tier page ", key.block.Hex(),
                                                " is truncated in ", f.path.string()));
      }
      sum.Update(out.subspan(done, static_cast<size_t>(r)));  // still in cache
      done += static_cast<uint64_t>(r);
    }
    const uint64_t checksum = sum.Digest();
    if (checksum != loc.checksum) {
      return absl::DataLossError(absl::StrCat("SSD tier page ", key.block.Hex(),
                                              " is corrupt: checksum differs from its index"));
    }
    return VerifyTierPageHeader(key, out, checksum);
  }

  // Removes the key's entry if it still points where a failed read found it.
  void RemoveIfAt(const TierKey& key, const Location& loc) {
    absl::MutexLock a(&append_mu_);
    std::vector<fs::path> dropped;
    {
      absl::MutexLock l(&mu_);
      ++stats_.corruptions;
      auto it = index_.find(key);
      if (it == index_.end() || !it->second.SamePlace(loc)) return;
      Unref(loc.segment, &dropped);
      index_.erase(it);
    }
    (void)db_->Delete(rocksdb::WriteOptions(), key.Bytes());
    Unlink(dropped);
  }

  // Rebuilds the index from RocksDB's records and the segment files' sizes (no page bytes
  // read), removes records that point past a file's end or into a missing file, deletes segment
  // files that hold no page, then drops oldest segments if the capacity was lowered.
  absl::Status Recover() {
    const fs::path seg_dir = root_ / "segments";
    std::map<uint64_t, uint64_t> sizes;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(seg_dir, ec)) {
      uint64_t id;
      if (!ParseSegmentName(e.path().filename().string(), &id)) continue;
      std::error_code sec;
      const uint64_t size = e.file_size(sec);
      if (!sec) sizes[id] = size;
    }
    if (ec) return absl::InternalError(absl::StrCat("list ", seg_dir.string(), ": ", ec.message()));
    std::map<uint64_t, std::vector<std::pair<uint64_t, TierKey>>> pages;  // by segment
    std::vector<std::string> stale;
    std::vector<std::pair<TierKey, Location>> found;
    {
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
      for (it->SeekToFirst(); it->Valid(); it->Next()) {
        // Index keys are 32 bytes, or 40 with a namespace tag; the format record is neither.
        if (it->key().size() != 32 && it->key().size() != 40) continue;
        auto key = TierKey::FromBytes(std::string_view(it->key().data(), it->key().size()));
        Location loc;
        auto sz = sizes.end();
        if (DecodeRecord(it->value(), &loc)) sz = sizes.find(loc.segment);
        if (!key.ok() || sz == sizes.end() || loc.offset + loc.length > sz->second) {
          stale.push_back(it->key().ToString());  // torn tail, missing segment, bad record
          continue;
        }
        found.emplace_back(*key, loc);
      }
      if (absl::Status s = FromRocks(it->status(), "SSD tier index scan"); !s.ok()) return s;
    }
    for (const auto& [key, loc] : found) pages[loc.segment].emplace_back(loc.offset, key);
    std::vector<TierKey> dead;
    std::vector<fs::path> dropped;
    absl::MutexLock a(&append_mu_);
    {
      absl::MutexLock l(&mu_);
      for (const auto& [key, loc] : found) index_[key] = loc;
      for (const auto& [id, size] : sizes) {
        next_id_ = std::max(next_id_, id + 1);
        auto f = std::make_shared<SegmentFile>();
        f->path = seg_dir / SegmentName(id);
        auto p = pages.find(id);
        if (p != pages.end()) f->fd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC);
        if (f->fd < 0) {  // holds no page (or cannot be opened): its records go
          if (p != pages.end()) {
            for (const auto& [off, key] : p->second) {
              index_.erase(key);
              dead.push_back(key);
            }
          }
          dropped.push_back(f->path);
          continue;
        }
        std::sort(p->second.begin(), p->second.end(),
                  [](const auto& x, const auto& y) { return x.first < y.first; });
        Segment seg{.file = std::move(f), .bytes = size, .live = p->second.size()};
        for (const auto& [off, key] : p->second) seg.keys.push_back(key);
        used_ += size;
        segments_.emplace(id, std::move(seg));
      }
      DropOldest(0, 0, &dead, &dropped);  // the capacity may have been lowered
    }
    rocksdb::WriteBatch b;
    for (const std::string& k : stale) b.Delete(k);
    for (const TierKey& k : dead) b.Delete(k.Bytes());
    if (b.Count() > 0) {
      if (absl::Status s = FromRocks(db_->Write(rocksdb::WriteOptions(), &b), "SSD tier trim");
          !s.ok()) {
        return s;
      }
    }
    for (const fs::path& p : dropped) ::unlink(p.c_str());
    dir_dirty_ = !dropped.empty();
    return absl::OkStatus();
  }

  const SegmentTierOptions opts_;
  const uint64_t segment_bytes_;
  const fs::path root_;
  rocksdb::DB* const db_;

  absl::Mutex append_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one writer: the current segment's tail
  uint64_t cur_ ABSL_GUARDED_BY(append_mu_) = 0;      // segment appended to; 0 = none yet
  uint64_t next_id_ ABSL_GUARDED_BY(append_mu_) = 1;
  bool dir_dirty_ ABSL_GUARDED_BY(append_mu_) = false;  // files created/removed since Sync
  uint64_t writeback_from_ ABSL_GUARDED_BY(append_mu_) = 0;  // current segment, not yet started
  std::unique_ptr<uint8_t, FreeDeleter> stage_ ABSL_GUARDED_BY(append_mu_);  // aligned
  std::vector<std::shared_ptr<SegmentFile>> retired_ ABSL_GUARDED_BY(append_mu_);
  uint64_t stage_bytes_ ABSL_GUARDED_BY(append_mu_) = 0;

  absl::Mutex mu_;
  absl::flat_hash_map<TierKey, Location> index_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Segment> segments_ ABSL_GUARDED_BY(mu_);  // oldest first
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;                      // bytes of all segment files
  TierStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<TierStore>> OpenSegmentTierStore(const SegmentTierOptions& o) {
  return SegmentTierStore::Open(o);
}

}  // namespace oscarkv::tiering
