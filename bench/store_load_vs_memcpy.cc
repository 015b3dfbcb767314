#include "store_load_vs_memcpy.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

absl::StatusOr<StoreLoadVsMemcpy> MeasureStoreLoadVsMemcpy(
    client::Client& c, const client::Codec& codec, std::span<const BlockKey> keys,
    std::span<const std::vector<uint8_t>> pages, double duration_s) {
  if (keys.size() != pages.size() || keys.empty()) {
    return absl::InvalidArgumentError("one key per page, at least one page");
  }
  StoreLoadVsMemcpy r;
  std::vector<client::PageWrite> writes;
  for (size_t i = 0; i < pages.size(); ++i) {
    writes.push_back({keys[i], PageKind::kInt2, pages[i]});
    r.batch_bytes += pages[i].size();
  }
  // The memcpy's two buffers, and the load's destination buffers.
  std::unique_ptr<uint8_t[]> copy_src(new uint8_t[r.batch_bytes]);
  std::unique_ptr<uint8_t[]> copy_dst(new uint8_t[r.batch_bytes]);
  for (size_t i = 0, off = 0; i < pages.size(); off += pages[i].size(), ++i) {
    std::memcpy(copy_src.get() + off, pages[i].data(), pages[i].size());
  }
  std::vector<std::vector<uint8_t>> load_bufs;
  std::vector<std::span<uint8_t>> dst;
  for (const auto& p : pages) load_bufs.emplace_back(p.size());
  for (auto& b : load_bufs) dst.emplace_back(b);

  auto store = [&]() -> absl::Status {
    OSCARKV_ASSIGN_OR_RETURN(client::StoreResult s, c.Store(codec, writes));
    OSCARKV_RETURN_IF_ERROR(s.ToStatus());
    if (s.stored != writes.size()) {
      return absl::InternalError(absl::StrCat("store wrote ", s.stored, " of ", writes.size(),
                                              " pages (", s.deduplicated, " deduplicated)"));
    }
    return absl::OkStatus();
  };
  auto load = [&]() -> absl::Status {
    OSCARKV_ASSIGN_OR_RETURN(uint32_t n, c.LoadInto(codec, keys, dst));
    if (n != keys.size()) return absl::InternalError("verified load missed pages");
    return absl::OkStatus();
  };
  auto forget = [&]() -> absl::Status {  // untimed: the next store writes every page again
    OSCARKV_ASSIGN_OR_RETURN(auto st, c.Delete(codec, keys));
    for (const absl::Status& s : st) {
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("deleting the batch: ", s.message()));
    }
    return absl::OkStatus();
  };
  auto copy = [&] { std::memcpy(copy_dst.get(), copy_src.get(), r.batch_bytes); };
  // Times `path` and a memcpy, in the order the iteration says.
  auto side_by_side = [&](auto&& path, bool path_first, Clock::duration* dp,
                          Clock::duration* dc) -> absl::Status {
    for (int k = 0; k < 2; ++k) {
      const auto a = Clock::now();
      if ((k == 0) == path_first) {
        OSCARKV_RETURN_IF_ERROR(path());
        *dp = Clock::now() - a;
      } else {
        copy();
        *dc = Clock::now() - a;
      }
    }
    return absl::OkStatus();
  };

  // Warm-up: every buffer each side writes is touched once -- the load buffers, the memcpy's
  // destination, and every pool slot a timed store may be given: the allocator need not hand
  // the same slots back after a delete, so the stores run until they have covered the whole
  // pool segment once.
  const uint64_t pool_bytes = std::max<uint64_t>(c.server().shm_bytes, r.batch_bytes);
  for (uint64_t covered = 0; covered < pool_bytes + r.batch_bytes; covered += r.batch_bytes) {
    OSCARKV_RETURN_IF_ERROR(store());
    OSCARKV_RETURN_IF_ERROR(forget());
  }
  OSCARKV_RETURN_IF_ERROR(store());
  OSCARKV_RETURN_IF_ERROR(load());
  copy();

  Clock::duration t_store{}, t_load{}, t_copy_s{}, t_copy_l{};
  std::vector<double> store_ms, load_ms, copy_ms;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(duration_s));
  for (; Clock::now() < end || r.iterations < 5; ++r.iterations) {
    const bool path_first = r.iterations % 2 == 0;
    Clock::duration ds{}, dl{}, dcs{}, dcl{};
    OSCARKV_RETURN_IF_ERROR(forget());
    OSCARKV_RETURN_IF_ERROR(side_by_side(store, path_first, &ds, &dcs));
    OSCARKV_RETURN_IF_ERROR(side_by_side(load, path_first, &dl, &dcl));
    t_store += ds;
    t_load += dl;
    t_copy_s += dcs;
    t_copy_l += dcl;
    store_ms.push_back(1e3 * Seconds(ds));
    load_ms.push_back(1e3 * Seconds(dl));
    copy_ms.push_back(1e3 * Seconds(dcs));
    copy_ms.push_back(1e3 * Seconds(dcl));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (!std::equal(pages[i].begin(), pages[i].end(), load_bufs[i].begin())) {
      return absl::InternalError(absl::StrCat("verified load: page ", i, " differs"));
    }
  }
  OSCARKV_RETURN_IF_ERROR(forget());
  const double bytes = double(r.batch_bytes) * r.iterations;
  r.store_gbps = bytes / Seconds(t_store) / 1e9;
  r.load_gbps = bytes / Seconds(t_load) / 1e9;
  r.store_memcpy_gbps = bytes / Seconds(t_copy_s) / 1e9;
  r.load_memcpy_gbps = bytes / Seconds(t_copy_l) / 1e9;
  r.store_ms_p50 = Median(store_ms);
  r.load_ms_p50 = Median(load_ms);
  r.memcpy_ms_p50 = Median(copy_ms);
  return r;
}

absl::StatusOr<StoreLoadVsMemcpy> MeasureStoreLoadOnOwnDaemon(
    testing::LocalDaemonOptions daemon, const std::string& shm_mode, const CodecProfile& profile,
    std::span<const BlockKey> keys, std::span<const std::vector<uint8_t>> pages,
    double duration_s, client::ConnectOptions connect) {
  const bool tenant = !connect.tls_cert_file.empty();
  daemon.flags.insert(daemon.flags.end(), {"--shm-mode", shm_mode});
  for (size_t i = 0; i + 1 < daemon.flags.size(); ++i) {
    if (daemon.flags[i] == "--shm-name") daemon.flags[i + 1] += "-" + shm_mode + (tenant ? "-tenant" : "");
  }
  OSCARKV_ASSIGN_OR_RETURN(std::unique_ptr<testing::LocalDaemon> d,
                           testing::LocalDaemon::Start(daemon));
  absl::StatusOr<StoreLoadVsMemcpy> r;
  {
    connect.address = d->address();
    OSCARKV_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(connect));
    if (tenant && c->server().data_path != client::DataPath::kSharedMemory) {
      return absl::FailedPreconditionError(
          "the tenant's client is not on the shared-memory data path");
    }
    OSCARKV_ASSIGN_OR_RETURN(client::Codec codec, c->RegisterCodec(profile));
    r = MeasureStoreLoadVsMemcpy(*c, codec, keys, pages, duration_s);
  }
  auto stopped = d->Stop();
  if (r.ok() && !stopped.ok()) return stopped.status();
  return r;
}

}  // namespace oscarkv::bench
