// service_loadgen: a quick open-loop Lookup load against a running oscarkvd, for tuning the
// daemon (the user-facing benchmark is `oscarkv bench service`). Stores --pages pages of a tiny
// codec, then --clients threads (one channel each) issue Lookups of --keys keys at a combined
// --rate per second for --seconds; latency is measured from each call's scheduled start, so a
// stalled server cannot hide its queueing delay. `errors` counts failed lookups and lookups that
// did not match every stored key.
// --tls-ca (with --tls-cert/--tls-key for mutual TLS) talks to a daemon with --tls-cert.
//   service_loadgen --target 127.0.0.1:50051 --clients 64 --rate 10000 --seconds 5
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_pages.h"
#include "grpcpp/grpcpp.h"
#include "oscarkv/proto/codec_convert.h"
#include "oscarkv/util/args.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"

using namespace oscarkv;
using Clock = std::chrono::steady_clock;

namespace {

// Distinct 16-byte block keys: key i of a run tagged `salt`.
std::string Key(uint32_t i, uint32_t salt) {
  std::string k(16, '\0');
  const uint64_t a = (uint64_t{salt} << 32 | i) * 0x9E3779B97F4A7C15ull;
  const uint64_t b = a ^ 0xD1B54A32D192ED03ull * (i + 1);
  std::memcpy(k.data(), &a, 8);
  std::memcpy(k.data() + 8, &b, 8);
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  Args args("service_loadgen", "Open-loop Lookup load against a running oscarkvd.");
  args.Option("target", "127.0.0.1:50051", "daemon address")
      .Option("clients", "64", "concurrent clients, one channel each")
      .Option("rate", "10000", "total lookups per second")
      .Option("seconds", "5", "duration")
      .Option("keys", "8", "keys per lookup (a stored prefix)")
      .Option("pages", "256", "pages to store first")
      .Option("channels", "0", "gRPC channels shared round-robin by the clients (0 = one each)")
      .Option("tls-ca", "", "gRPC over TLS: CA bundle (PEM) of the daemon's certificate")
      .Option("tls-cert", "", "client certificate (PEM), with --tls-key, for --tls-client-ca")
      .Option("tls-key", "", "private key (PEM) of --tls-cert")
      .Flag("pin", "pin and then release (two RPCs per lookup; latency is the Lookup's)");
  if (auto s = args.Parse(argc, argv); !s.ok() || args.help_requested()) {
    std::fprintf(stderr, "%s\n", args.Help().c_str());
    return s.ok() ? 0 : 2;
  }
  auto clients_v = args.integer("clients"), keys_v = args.integer("keys");
  auto pages_v = args.integer("pages"), channels_v = args.integer("channels");
  auto rate_v = args.real("rate"), seconds_v = args.real("seconds");
  for (const absl::Status& s : {clients_v.status(), keys_v.status(), pages_v.status(),
                                channels_v.status(), rate_v.status(), seconds_v.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "service_loadgen: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  const std::string target = args.str("target");
  const int clients = static_cast<int>(std::clamp<int64_t>(*clients_v, -1, 1 << 20));
  const double rate = *rate_v;
  const double seconds = *seconds_v;
  const int keys = static_cast<int>(std::clamp<int64_t>(*keys_v, -1, 1 << 20));
  const int pages = static_cast<int>(std::clamp<int64_t>(*pages_v, -1, 1 << 21));
  const bool pin = args.flag("pin");
  const int nchannels = static_cast<int>(std::clamp<int64_t>(*channels_v, -1, 1 << 20));
  if (clients < 1 || clients > 4096 || !(rate > 0) || !(seconds > 0) || keys < 1 ||
      pages < keys || pages > 1 << 20 || nchannels < 0 || nchannels > 4096) {
    std::fprintf(stderr, "service_loadgen: bad option value (see --help)\n");
    return 2;
  }
  // One credentials object for every channel; each channel still gets a connection of its own
  // (its distinct oscarkv.* argument), plaintext and TLS alike, so the two compare as equals.
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!args.str("tls-ca").empty()) {
    auto read = [](const std::string& path, std::string* out) {
      std::ifstream f(path, std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      *out = ss.str();
      return f.good() || f.eof();
    };
    grpc::SslCredentialsOptions o;
    if (!read(args.str("tls-ca"), &o.pem_root_certs) ||
        (!args.str("tls-cert").empty() && (!read(args.str("tls-cert"), &o.pem_cert_chain) ||
                                           !read(args.str("tls-key"), &o.pem_private_key)))) {
      std::fprintf(stderr, "service_loadgen: cannot read the --tls-* files\n");
      return 2;
    }
    creds = grpc::SslCredentials(o);
  } else if (!args.str("tls-cert").empty() || !args.str("tls-key").empty()) {
    std::fprintf(stderr, "service_loadgen: --tls-cert/--tls-key need --tls-ca\n");
    return 2;
  }
  std::vector<std::shared_ptr<v1::KvCache::Stub>> shared;
  for (int c = 0; c < nchannels; ++c) {
    grpc::ChannelArguments ca;
    ca.SetInt("oscarkv.channel", c);
    shared.push_back(v1::KvCache::NewStub(
        grpc::CreateCustomChannel(target, creds, ca)));
  }

  auto stub = v1::KvCache::NewStub(grpc::CreateChannel(target, creds));
  const CodecProfile profile = bench::TinyBenchProfile("loadgen");
  const size_t page_bytes = GeometryFor(profile, PageKind::kInt2).page_bytes();
  std::vector<uint8_t> page_data(page_bytes * size_t(pages));
  if (absl::Status s = bench::FillWithPages(profile, PageKind::kInt2, page_data, pages,
                                            pages, 77);
      !s.ok()) {
    std::fprintf(stderr, "encoding pages: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::string codec;
  {
    grpc::ClientContext ctx;
    v1::RegisterCodecRequest req;
    proto::ToProto(profile, req.mutable_profile());
    v1::RegisterCodecResponse resp;
    if (auto s = stub->RegisterCodec(&ctx, req, &resp); !s.ok()) {
      std::fprintf(stderr, "RegisterCodec: %s\n", s.error_message().c_str());
      return 1;
    }
    codec = resp.codec_id();
  }
  {
    grpc::ClientContext ctx;
    v1::ReserveRequest req;
    req.set_codec_id(codec);
    for (int i = 0; i < pages; ++i) {
      auto* it = req.add_items();
      it->set_key(Key(i, 77));
      it->set_kind(v1::PAGE_KIND_INT2);
    }
    v1::ReserveResponse resp;
    if (!stub->Reserve(&ctx, req, &resp).ok()) return 1;
    grpc::ClientContext wctx;
    v1::WriteResponse wr;
    auto w = stub->WritePages(&wctx, &wr);
    for (int i = 0; i < pages; ++i) {
      if (resp.results(i).status().code() != 0) continue;
      v1::WriteChunk c;
      c.set_reservation_id(resp.reservation_id());
      c.set_key(Key(i, 77));
      c.set_data(page_data.data() + size_t(i) * page_bytes, page_bytes);
      w->Write(c);
    }
    w->WritesDone();
    (void)w->Finish();
    grpc::ClientContext cctx;
    v1::CommitRequest creq;
    creq.set_reservation_id(resp.reservation_id());
    v1::CommitResponse cresp;
    if (auto s = stub->Commit(&cctx, creq, &cresp); !s.ok()) {
      std::fprintf(stderr, "Commit: %s\n", s.error_message().c_str());
      return 1;
    }
  }

  std::vector<std::vector<double>> lat(clients);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  const auto start = Clock::now() + std::chrono::milliseconds(500);
  const double per_client_interval = clients / rate;  // seconds
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      std::shared_ptr<v1::KvCache::Stub> s;
      if (nchannels > 0) {
        s = shared[t % nchannels];
      } else {
        grpc::ChannelArguments ca;
        ca.SetInt("oscarkv.client", t);  // distinct channels, not one shared subchannel
        s = v1::KvCache::NewStub(
            grpc::CreateCustomChannel(target, creds, ca));
      }
      const long n = static_cast<long>(seconds / per_client_interval);
      lat[t].reserve(n);
      for (long i = 0; i < n; ++i) {
        const auto due = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                     (i + t / double(clients)) * per_client_interval));
        std::this_thread::sleep_until(due);
        v1::LookupRequest req;
        req.set_codec_id(codec);
        const int first = static_cast<int>((i * 7 + t) % std::max(1, pages - keys));
        for (int k = 0; k < keys; ++k) req.add_keys(Key(first + k, 77));
        req.set_pin(pin);
        v1::LookupResponse resp;
        grpc::ClientContext ctx;
        const grpc::Status st = s->Lookup(&ctx, req, &resp);
        lat[t].push_back(std::chrono::duration<double>(Clock::now() - due).count());
        if (!st.ok() || resp.matched() != static_cast<uint32_t>(keys)) ++errors;
        if (pin && resp.lease_id() != 0) {
          grpc::ClientContext rctx;
          v1::ReleaseRequest rel;
          rel.set_lease_id(resp.lease_id());
          v1::ReleaseResponse rr;
          (void)s->Release(&rctx, rel, &rr);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all.empty() ? 0 : all[std::min(all.size() - 1, size_t(p * all.size()))]; };
  std::printf("lookups=%zu errors=%d clients=%d rate=%.0f/s keys=%d pin=%d\n", all.size(),
              errors.load(), clients, rate, keys, pin);
  std::printf("latency_ms p50=%.3f p90=%.3f p99=%.3f p999=%.3f max=%.3f\n", pct(0.5) * 1e3,
              pct(0.9) * 1e3, pct(0.99) * 1e3, pct(0.999) * 1e3, all.empty() ? 0 : all.back() * 1e3);
  return errors.load() == 0 ? 0 : 1;
}
