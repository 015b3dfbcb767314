// The measured phases of `oscarkv bench service` (service_bench_internal.h).
#include "service_bench_internal.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::bench::service_bench {

using client::Client;

double CpuSeconds(pid_t pid) {
  std::ifstream f(pid ? absl::StrCat("/proc/", pid, "/stat") : std::string("/proc/self/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
  // After "pid (comm) ": field 3 is state, so utime (14) and stime (15) are indexes 11, 12.
  double ut = 0, st = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &ut) || !absl::SimpleAtod(fields[12], &st)) {
    return 0;
  }
  return (ut + st) / double(::sysconf(_SC_CLK_TCK));
}

LatencyStats Summarize(std::vector<double>& lat_s, double seconds) {
  LatencyStats s;
  s.count = lat_s.size();
  s.seconds = seconds;
  s.per_s = seconds > 0 ? double(s.count) / seconds : 0;
  if (lat_s.empty()) return s;
  std::sort(lat_s.begin(), lat_s.end());
  auto q = [&](double p) {
    return 1e3 * lat_s[std::min(lat_s.size() - 1, static_cast<size_t>(p * double(lat_s.size())))];
  };
  s.p50_ms = q(0.50);
  s.p99_ms = q(0.99);
  s.p999_ms = q(0.999);
  s.max_ms = 1e3 * lat_s.back();
  return s;
}

absl::StatusOr<std::vector<std::unique_ptr<Client>>> ConnectMany(
    const Env& env, int n, client::DataPath path, bool verify, bool dedicated,
    client::LookupPath lookup_path) {
  std::vector<std::unique_ptr<Client>> out;
  for (int i = 0; i < n; ++i) {
    client::ConnectOptions o;
    o.address = env.addr;
    o.client_name = absl::StrCat("bench-", i);
    o.data_path = path;
    o.verify_checksums = verify;
    o.async_threads = 1;
    o.dedicated_connection = dedicated;
    o.lookup_path = lookup_path;
    o.tls_ca_file = env.tls_ca;
    o.tls_cert_file = env.tls_cert;
    o.tls_key_file = env.tls_key;
    OSCARKV_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
    OSCARKV_RETURN_IF_ERROR(c->RegisterCodec(env.codec.profile).status());
    out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<LatencyStats> ClosedLoop(const Env& env, std::vector<std::unique_ptr<Client>>& cs,
                                        int n, double duration_s) {
  std::vector<std::vector<double>> lat(n);
  std::atomic<bool> failed{false};
  std::atomic<int> ready{0};
  absl::Status first_error;
  std::atomic<bool> go{false};
  const auto warm = std::chrono::duration<double>(0.2);
  Clock::time_point start, end;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready++;
      while (!go.load()) std::this_thread::yield();
      lat[i].reserve(1 << 16);
      for (;;) {
        const auto t0 = Clock::now();
        if (t0 >= end) break;
        auto r = cs[i]->Lookup(env.codec, env.lookup_keys);
        const auto t1 = Clock::now();
        if (!r.ok() || r->matched != env.lookup_keys.size()) {
          failed = true;
          break;
        }
        if (t0 >= start) lat[i].push_back(Seconds(t1 - t0));
      }
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  start = Clock::now() + std::chrono::duration_cast<Clock::duration>(warm);
  end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration_s));
  go = true;
  for (auto& t : threads) t.join();
  if (failed) return absl::InternalError("a lookup failed or missed during the closed-loop run");
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  // Requests that started in the window; the last ones may finish just after `end`.
  return Summarize(all, duration_s);
}

absl::StatusOr<LatencyStats> OpenLoop(const Env& env, std::vector<std::unique_ptr<Client>>& cs,
                                      int n, double rate, double duration_s, bool async_senders,
                                      double* achieved) {
  const uint64_t total = static_cast<uint64_t>(rate * duration_s);
  const double interval = 1.0 / rate;
  std::vector<double> lat(total, -1), late(total, 0);
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> completed{0};
  std::atomic<int64_t> last_done_ns{0};
  ::prctl(PR_SET_TIMERSLACK, 1000UL);  // wake within ~1 us of each due time, not 50 us
  const Clock::time_point t0 = Clock::now() + std::chrono::milliseconds(50);
  if (!async_senders) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        ::prctl(PR_SET_TIMERSLACK, 1000UL);
        for (uint64_t k = static_cast<uint64_t>(i); k < total && !failed; k += n) {
          const auto due = t0 + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(double(k) * interval));
          if (Clock::now() < due) std::this_thread::sleep_until(due);
          late[k] = Seconds(Clock::now() - due);
          auto r = cs[i]->Lookup(env.codec, env.lookup_keys);
          const auto done = Clock::now();
          if (!r.ok() || r->matched != env.lookup_keys.size()) failed = true;
          lat[k] = Seconds(done - due);
          const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(done - t0).count();
          int64_t prev = last_done_ns.load();
          while (ns > prev && !last_done_ns.compare_exchange_weak(prev, ns)) {
          }
          completed.fetch_add(1);
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (uint64_t k = 0; async_senders && k < total && !failed.load(std::memory_order_relaxed); ++k) {
    const auto due = t0 + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(double(k) * interval));
    if (Clock::now() < due) std::this_thread::sleep_until(due);
    late[k] = Seconds(Clock::now() - due);
    cs[k % n]->LookupAsync(
        env.codec, env.lookup_keys, {},
        [&, k, due](absl::StatusOr<client::LookupResult> r) {
          const auto done = Clock::now();
          if (!r.ok() || r->matched != env.lookup_keys.size()) failed = true;
          lat[k] = Seconds(done - due);
          const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(done - t0).count();
          int64_t prev = last_done_ns.load();
          while (ns > prev && !last_done_ns.compare_exchange_weak(prev, ns)) {
          }
          completed.fetch_add(1);
        });
  }
  // Every sent request completes (or fails) within the RPC deadline; wait for all of them.
  const uint64_t sent = failed ? 0 : total;
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (completed.load() < sent && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (failed) return absl::InternalError("a lookup failed or missed during the open-loop run");
  if (completed.load() < total) return absl::InternalError("open-loop lookups never completed");
  std::vector<double> all(lat.begin(), lat.end());
  const double span = double(last_done_ns.load()) / 1e9;
  *achieved = span > 0 ? double(all.size()) / span : 0;
  LatencyStats st = Summarize(all, duration_s);
  const LatencyStats lateness = Summarize(late, duration_s);
  st.send_late_p99_ms = lateness.p99_ms;
  st.send_late_max_ms = lateness.max_ms;
  return st;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

absl::StatusOr<LoadStats> LoadVsMemcpy(const Env& env, Client& c, const uint8_t* pool,
                                       const std::vector<client::PageRef>& refs,
                                       std::vector<std::span<uint8_t>>& dst, double duration_s) {
  const std::span<const BlockKey> keys(env.keys.data(), refs.size());
  uint64_t batch_bytes = 0;
  for (const auto& r : refs) batch_bytes += r.bytes;
  auto load = [&]() -> absl::Status {
    auto n = c.LoadInto(env.codec, keys, dst);
    if (!n.ok()) return n.status();
    if (*n != keys.size()) return absl::InternalError("batch load missed pages");
    return absl::OkStatus();
  };
  auto copy = [&] {
    for (size_t i = 0; i < refs.size(); ++i) std::memcpy(dst[i].data(), pool + refs[i].offset, refs[i].bytes);
  };
  for (int w = 0; w < 2; ++w) {  // warm: fault in both mappings and the buffers
    OSCARKV_RETURN_IF_ERROR(load());
    copy();
  }
  Clock::duration t_load{}, t_copy{};
  std::vector<double> load_ms, copy_ms, rtt_ms;
  LoadStats s;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(duration_s));
  while (Clock::now() < end || s.iterations < 4) {
    // Alternate which goes first, so neither side always runs right after the other.
    Clock::duration dl{}, dc{};
    for (int side = 0; side < 2; ++side) {
      const bool do_load = (side == 0) == (s.iterations % 2 == 0);
      const auto a = Clock::now();
      if (do_load) {
        OSCARKV_RETURN_IF_ERROR(load());
        dl = Clock::now() - a;
      } else {
        copy();
        dc = Clock::now() - a;
      }
    }
    t_load += dl;
    t_copy += dc;
    load_ms.push_back(1e3 * Seconds(dl));
    copy_ms.push_back(1e3 * Seconds(dc));
    ++s.iterations;
  }
  // The control-plane share of a load: pin the batch and release it, no copy.
  for (int i = 0; i < 20; ++i) {
    auto a = Clock::now();
    auto pin = c.Lookup(env.codec, keys, {.pin = true});
    if (!pin.ok()) return pin.status();
    OSCARKV_RETURN_IF_ERROR(c.Release(*pin));
    rtt_ms.push_back(1e3 * Seconds(Clock::now() - a));
  }
  s.load_ms_p50 = Median(load_ms);
  s.copy_ms_p50 = Median(copy_ms);
  s.lease_rtt_ms_p50 = Median(rtt_ms);
  s.path_gbps = double(batch_bytes) * s.iterations / Seconds(t_load) / 1e9;
  s.memcpy_gbps = double(batch_bytes) * s.iterations / Seconds(t_copy) / 1e9;
  return s;
}

void PickMedianRound(PathRun& run) {
  if (run.rounds.empty()) return;
  std::vector<size_t> order(run.rounds.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return run.rounds[x].first.p99_ms < run.rounds[y].first.p99_ms;
  });
  const auto& [stats, achieved] = run.rounds[order[order.size() / 2]];
  run.open = stats;
  run.achieved = achieved;
}

int TcpConnectionsTo(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (address.rfind("127.0.0.1:", 0) != 0 || colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return -1;
  }
  // Lines: "sl local_address rem_address st ...", addresses in hex (IPv4 little-endian) :port;
  // a dual-stack socket lists 127.0.0.1 in tcp6 as the IPv4-mapped ::ffff:127.0.0.1.
  int n = 0;
  for (const auto& [file, remote] :
       {std::pair<const char*, std::string>{"/proc/net/tcp", absl::StrFormat("0100007F:%04X", port)},
        {"/proc/net/tcp6", absl::StrFormat("0000000000000000FFFF00000100007F:%04X", port)}}) {
    std::ifstream f(file);
    std::string line;
    while (std::getline(f, line)) {
      std::vector<std::string> col = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (col.size() > 3 && col[2] == remote && col[3] == "01") ++n;  // 01 = ESTABLISHED
    }
  }
  return n;
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

}  // namespace oscarkv::bench::service_bench
