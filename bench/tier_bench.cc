#include "tier_bench.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/service/tier.h"
#include "oscarkv/util/args.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A complete INT2 page of `profile` (header, random payload, checksum), distinct per seed.
std::vector<uint8_t> MakePage(const CodecProfile& profile, uint64_t seed) {
  const PageGeometry g = GeometryFor(profile, PageKind::kInt2);
  std::vector<uint8_t> page(g.page_bytes());
  std::mt19937_64 rng(seed);
  for (size_t i = kPageHeaderBytes; i + 8 <= page.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(page.data() + i, &v, 8);
  }
  PageHeader h{};
  h.magic = kPageMagic;
  h.format_version = kPageFormatVersion;
  h.kind = static_cast<uint8_t>(PageKind::kInt2);
  h.scale_dtype = 1;
  const CodecId id = profile.Id();
  std::memcpy(h.codec_id, id.bytes.data(), 16);
  h.num_layers = profile.num_layers;
  h.num_kv_heads = profile.num_kv_heads;
  h.head_dim = profile.head_dim;
  h.group_size = profile.group_size;
  h.page_tokens = profile.page_tokens;
  h.token_count = profile.page_tokens;
  h.payload_bytes = g.payload_bytes();
  std::memcpy(page.data(), &h, sizeof(h));
  h.checksum = ComputePageChecksum(page);
  std::memcpy(page.data(), &h, sizeof(h));
  return page;
}

tiering::TierKey KeyOf(const CodecProfile& profile, uint64_t i) {
  tiering::TierKey k{profile.Id(), {}};
  const uint64_t hi = i * 0x9E3779B97F4A7C15ull + 1;
  std::memcpy(k.block.bytes.data(), &i, 8);
  std::memcpy(k.block.bytes.data() + 8, &hi, 8);
  return k;
}

// Drops the file's pages from the OS page cache (after they are on disk).
void DropFromCache(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
void DropTreeFromCache(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) DropFromCache(e.path());
  }
}

struct Round {
  double demote_gbps = 0, disk_write_gbps = 0, promote_gbps = 0, disk_read_gbps = 0;
};

struct Result {
  // Medians over the rounds; the ratios are the medians of each round's own ratio.
  double demote_gbps = 0, disk_write_gbps = 0, promote_gbps = 0, disk_read_gbps = 0;
  double demote_ratio = 0, promote_ratio = 0;
  int rounds = 0;
  double restart_s = 0;
  uint64_t restart_pages = 0, restart_page_bytes = 0;
  double restart_fill_s = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Plain file: sequential write() of every page, one fsync.
absl::Status PlainWrite(const fs::path& file, const std::vector<std::vector<uint8_t>>& src,
                        double gb, Round* r) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("open ", file.string(), ": ", strerror(errno)));
  }
  const auto t0 = Clock::now();
  for (const auto& p : src) {
    if (::write(fd, p.data(), p.size()) != static_cast<ssize_t>(p.size())) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("write ", file.string(), ": ", strerror(errno)));
    }
  }
  const bool synced = ::fsync(fd) == 0;
  r->disk_write_gbps = gb / Seconds(t0, Clock::now());
  ::close(fd);
  return synced ? absl::OkStatus() : absl::InternalError("fsync of the plain file failed");
}

// The tier: Demote every page, Flush (drained + synced), as the daemon's eviction path does.
absl::Status TierWrite(service::PageTier& tier, const CodecProfile& profile,
                       const std::vector<std::vector<uint8_t>>& src, double gb, Round* r) {
  const auto t0 = Clock::now();
  for (size_t i = 0; i < src.size(); ++i) {
    if (!tier.Demote(KeyOf(profile, i), src[i])) {
      return absl::InternalError("a demotion was dropped (queue full past its wait)");
    }
  }
  if (!tier.Flush(absl::InfiniteFuture())) return absl::InternalError("tier flush failed");
  r->demote_gbps = gb / Seconds(t0, Clock::now());
  if (tier.counters().demotions.load() != src.size()) {
    return absl::InternalError("not every page reached the tier");
  }
  return absl::OkStatus();
}

absl::Status PlainRead(const fs::path& file, size_t pages, std::vector<uint8_t>& dst, double gb,
                       Round* r) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("open ", file.string(), ": ", strerror(errno)));
  }
  const auto t0 = Clock::now();
  for (size_t i = 0; i < pages; ++i) {
    if (::read(fd, dst.data(), dst.size()) != static_cast<ssize_t>(dst.size())) {
      ::close(fd);
      return absl::InternalError("short read of the plain file");
    }
  }
  r->disk_read_gbps = gb / Seconds(t0, Clock::now());
  ::close(fd);
  return absl::OkStatus();
}

absl::Status TierRead(service::PageTier& tier, const CodecProfile& profile,
                      const std::vector<std::vector<uint8_t>>& src, std::vector<uint8_t>& dst,
                      double gb, Round* r) {
  const auto t0 = Clock::now();
  for (size_t i = 0; i < src.size(); ++i) {
    // As the daemon's Promote does: the size from the index, then the page read straight
    // into the slot with its checksum verified on the way.
    auto size = tier.SizeOf(KeyOf(profile, i));
    if (!size.ok()) return size.status();
    if (*size != dst.size()) return absl::DataLossError("a promoted page has another size");
    if (absl::Status s = tier.ReadInto(KeyOf(profile, i), dst); !s.ok()) return s;
  }
  r->promote_gbps = gb / Seconds(t0, Clock::now());
  if (std::memcmp(dst.data(), src.back().data(), dst.size()) != 0) {
    return absl::DataLossError("the last promoted page differs from what was demoted");
  }
  return absl::OkStatus();
}

// One leg: the same bytes written to a new plain file and a new tier, then read back from the
// device (each side's files dropped from the page cache first), `tier_first` or not.
absl::Status RunLeg(const fs::path& dir, const CodecProfile& profile,
                    const std::vector<std::vector<uint8_t>>& src, bool tier_first, Round* r) {
  const uint64_t page_bytes = src[0].size();
  const double gb = static_cast<double>(page_bytes) * src.size() / 1e9;
  const fs::path file = dir / "plain.bin";
  service::TierOptions to;
  to.path = (dir / "tier").string();
  // A production-sized cap (the daemon's segment size follows it: capacity/32).
  to.capacity_bytes = 64ull << 30;
  to.max_wait = absl::InfiniteDuration();  // back-pressure waits count; nothing is dropped
  auto tier = service::PageTier::Open(to);
  if (!tier.ok()) return tier.status();
  absl::Status s;
  for (int side = 0; side < 2 && s.ok(); ++side) {
    s = (side == 0) == tier_first ? TierWrite(**tier, profile, src, gb, r)
                                  : PlainWrite(file, src, gb, r);
  }
  if (s.ok()) {
    DropFromCache(file);
    DropTreeFromCache(to.path);
  }
  std::vector<uint8_t> dst(page_bytes);  // the plain read's buffer, and the pool slot
  for (int side = 0; side < 2 && s.ok(); ++side) {
    s = (side == 0) == tier_first ? TierRead(**tier, profile, src, dst, gb, r)
                                  : PlainRead(file, src.size(), dst, gb, r);
  }
  tier->reset();
  std::error_code ec;
  fs::remove(file, ec);
  fs::remove_all(to.path, ec);
  return s;
}

// One round: two legs in opposite orders (which side goes first matters on a shared disk);
// each side's rate is its bytes over its time in both legs.
absl::Status RunIoRound(const fs::path& dir, const CodecProfile& profile,
                        const std::vector<std::vector<uint8_t>>& src, Round* r) {
  Round a, b;
  if (absl::Status s = RunLeg(dir, profile, src, false, &a); !s.ok()) return s;
  if (absl::Status s = RunLeg(dir, profile, src, true, &b); !s.ok()) return s;
  auto both = [](double x, double y) { return 2 / (1 / x + 1 / y); };  // same bytes each leg
  r->demote_gbps = both(a.demote_gbps, b.demote_gbps);
  r->disk_write_gbps = both(a.disk_write_gbps, b.disk_write_gbps);
  r->promote_gbps = both(a.promote_gbps, b.promote_gbps);
  r->disk_read_gbps = both(a.disk_read_gbps, b.disk_read_gbps);
  return absl::OkStatus();
}

absl::Status RunIo(const fs::path& dir, const CodecProfile& profile, int pages, int rounds,
                   Result* r) {
  // The same bytes for both sides: `pages` distinct pages.
  std::vector<std::vector<uint8_t>> src;
  for (int i = 0; i < pages; ++i) src.push_back(MakePage(profile, 1000 + i));
  std::vector<double> dw, pw, dr, pr, wratio, rratio;
  for (int round = 0; round < rounds; ++round) {
    Round x;
    if (absl::Status s = RunIoRound(dir, profile, src, &x); !s.ok()) return s;
    std::fprintf(stderr,
                 "  round %d: demote %.3f / write %.3f GB/s, promote %.3f / read %.3f GB/s\n",
                 round + 1, x.demote_gbps, x.disk_write_gbps, x.promote_gbps, x.disk_read_gbps);
    dw.push_back(x.demote_gbps);
    pw.push_back(x.disk_write_gbps);
    pr.push_back(x.promote_gbps);
    dr.push_back(x.disk_read_gbps);
    wratio.push_back(x.demote_gbps / x.disk_write_gbps);
    rratio.push_back(x.promote_gbps / x.disk_read_gbps);
  }
  r->rounds = rounds;
  r->demote_gbps = Median(dw);
  r->disk_write_gbps = Median(pw);
  r->promote_gbps = Median(pr);
  r->disk_read_gbps = Median(dr);
  r->demote_ratio = Median(wratio);
  r->promote_ratio = Median(rratio);
  return absl::OkStatus();
}

absl::Status RunRestart(const fs::path& dir, const CodecProfile& profile, uint64_t pages,
                        Result* r) {
  const std::vector<uint8_t> page = MakePage(profile, 7);
  service::TierOptions to;
  to.path = (dir / "restart").string();
  to.capacity_bytes = page.size() * (pages + 16);
  to.queue_bytes = 256ull << 20;
  to.max_wait = absl::InfiniteDuration();
  r->restart_pages = pages;
  r->restart_page_bytes = page.size();
  {
    auto tier = service::PageTier::Open(to);
    if (!tier.ok()) return tier.status();
    // The codecs file a daemon with this one codec writes at registration.
    v1::CodecProfile rec;
    rec.set_model_id(profile.model_id);
    rec.set_model_revision(profile.model_revision);
    rec.set_num_layers(profile.num_layers);
    rec.set_num_kv_heads(profile.num_kv_heads);
    rec.set_head_dim(profile.head_dim);
    rec.set_page_tokens(profile.page_tokens);
    rec.set_group_size(profile.group_size);
    rec.set_scale_dtype(1);
    if (absl::Status s = (*tier)->SaveCodecs({{"", rec.SerializeAsString()}}); !s.ok()) return s;
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < pages; ++i) {
      if (!(*tier)->Demote(KeyOf(profile, i), page)) {
        return absl::InternalError("a demotion was dropped while filling the restart tier");
      }
      if (i % 10000 == 9999) {
        std::fprintf(stderr, "  restart tier: %llu / %llu pages\n",
                     static_cast<unsigned long long>(i + 1), static_cast<unsigned long long>(pages));
      }
    }
    if (!(*tier)->Flush(absl::InfiniteFuture())) return absl::InternalError("tier flush failed");
    r->restart_fill_s = Seconds(t0, Clock::now());
  }  // closed as a SIGTERM'd daemon closes it
  const auto t0 = Clock::now();
  auto tier = service::PageTier::Open(to);
  if (!tier.ok()) return tier.status();
  auto codecs = (*tier)->LoadCodecs();
  if (!codecs.ok()) return codecs.status();
  const bool first = (*tier)->Contains(KeyOf(profile, 0));
  const bool last = (*tier)->Contains(KeyOf(profile, pages - 1));
  r->restart_s = Seconds(t0, Clock::now());
  if (!first || !last || (*tier)->store_stats().pages != pages) {
    return absl::InternalError("the reopened tier does not hold every page");
  }
  return absl::OkStatus();
}

}  // namespace

int TierBenchMain(int argc, char** argv) {
  Args a("bench tier",
         "The SSD tier beside plain file I/O in the same directory, in one run: demotion and "
         "promotion GB/s of Qwen3-8B INT2 pages (1,327,168 B) against an fsync'd sequential "
         "write and a sequential read of the same bytes, and the restart time of a tier "
         "holding N reference-model pages (~74 KB each). Both read sides read from the device: "
         "each first drops its own files from the OS page cache (fdatasync, then "
         "POSIX_FADV_DONTNEED). Each of --rounds rounds writes and reads both sides twice, once "
         "with each side first; the figures are medians over the rounds, each ratio the median "
         "of the rounds' own ratios.");
  a.Flag("json", "print the results as JSON (after the table, on stdout)");
  a.Option("dir", "", "directory to write in (default: a new temp dir, removed afterwards)");
  a.Option("pages", "256", "Qwen3-8B pages for the demote/promote phases (256 = 340 MB)");
  a.Option("restart-pages", "100000", "reference-model pages in the restart tier (0 = skip)");
  a.Option("rounds", "3", "rounds of the write/read phases (1..9)");
  if (auto code = a.ParseOrExitCode(argc, argv)) return *code;
  auto pages = a.integer("pages");
  auto restart_pages = a.integer("restart-pages");
  auto rounds = a.integer("rounds");
  if (!pages.ok() || *pages < 1 || *pages > 100000 || !restart_pages.ok() || *restart_pages < 0 ||
      !rounds.ok() || *rounds < 1 || *rounds > 9) {
    std::fprintf(stderr,
                 "oscarkv bench tier: --pages must be 1..100000, --restart-pages >= 0, "
                 "--rounds 1..9\n");
    return 2;
  }
  fs::path dir;
  bool owned = false;
  if (a.str("dir").empty()) {
    char tmpl[] = "/tmp/oscarkv-bench-tier-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      std::fprintf(stderr, "oscarkv bench tier: cannot create a temp dir\n");
      return 1;
    }
    dir = tmpl;
    owned = true;
  } else {
    dir = fs::path(a.str("dir")) / absl::StrCat("oscarkv-bench-tier-", ::getpid());
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      std::fprintf(stderr, "oscarkv bench tier: %s: %s\n", dir.c_str(), ec.message().c_str());
      return 1;
    }
    owned = true;  // our own subdirectory of --dir
  }
  Result r;
  absl::Status s = RunIo(dir, *BuiltinProfile("qwen3-8b"), static_cast<int>(*pages),
                         static_cast<int>(*rounds), &r);
  if (s.ok() && *restart_pages > 0) {
    s = RunRestart(dir, *BuiltinProfile("refmodel"), static_cast<uint64_t>(*restart_pages), &r);
  }
  if (owned) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "oscarkv bench tier: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf(
      "SSD tier vs plain file I/O in %s (%lld Qwen3-8B INT2 pages of 1,327,168 B; medians of "
      "%d rounds; reads from the device, page cache dropped on both sides)\n",
      a.str("dir").empty() ? "a temp dir" : a.str("dir").c_str(), static_cast<long long>(*pages),
      r.rounds);
  std::printf("  %-26s %8.3f GB/s   plain write+fsync %8.3f GB/s   ratio %.2f\n", "demote",
              r.demote_gbps, r.disk_write_gbps, r.demote_ratio);
  std::printf("  %-26s %8.3f GB/s   plain read        %8.3f GB/s   ratio %.2f\n",
              "promote (verified)", r.promote_gbps, r.disk_read_gbps, r.promote_ratio);
  if (r.restart_pages > 0) {
    std::printf("  %-26s %8.3f s      (%llu pages of %llu B; filling took %.1f s)\n",
                "restart (reopen tier)", r.restart_s,
                static_cast<unsigned long long>(r.restart_pages),
                static_cast<unsigned long long>(r.restart_page_bytes), r.restart_fill_s);
  }
  if (a.flag("json")) {
    nlohmann::json j;
    j["demote_gbps"] = r.demote_gbps;
    j["disk_write_gbps"] = r.disk_write_gbps;
    j["demote_vs_disk_write"] = r.demote_ratio;
    j["promote_gbps"] = r.promote_gbps;
    j["disk_read_gbps"] = r.disk_read_gbps;
    j["promote_vs_disk_read"] = r.promote_ratio;
    j["pages"] = *pages;
    j["rounds"] = r.rounds;
    j["reads_from"] = "device (page cache dropped on both sides)";
    if (r.restart_pages > 0) {
      j["restart_pages"] = r.restart_pages;
      j["restart_page_bytes"] = r.restart_page_bytes;
      j[absl::StrCat("restart_s_", r.restart_pages == 100000 ? std::string("100k")
                                                             : absl::StrCat(r.restart_pages),
                     "_pages")] = r.restart_s;
    }
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace oscarkv::bench
