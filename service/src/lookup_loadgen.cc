// service_loadgen: a quick open-loop Lookup load against a running oscarkvd, for tuning the
// daemon (the user-facing benchmark is `oscarkv bench service`). Stores --pages pages of a tiny
// codec, then --clients threads (one channel each) issue Lookups of --keys keys at a combined
// --rate per second for --seconds; latency is measured from each call's scheduled start, so a
// stalled server cannot hide its queueing delay.
//   service_loadgen --target 127.0.0.1:50051 --clients 64 --rate 10000 --seconds 5
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "oscarkv/util/args.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_pages.h"

using namespace oscarkv;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  Args args("service_loadgen", "Open-loop Lookup load against a running oscarkvd.");
  args.Option("target", "127.0.0.1:50051", "daemon address")
      .Option("clients", "64", "concurrent clients, one channel each")
      .Option("rate", "10000", "total lookups per second")
      .Option("seconds", "5", "duration")
      .Option("keys", "8", "keys per lookup (a stored prefix)")
      .Option("pages", "256", "pages to store first")
      .Option("channels", "0", "gRPC channels shared round-robin by the clients (0 = one each)")
      .Flag("pin", "pin and then release (two RPCs per lookup; latency is the Lookup's)");
  if (auto s = args.Parse(argc, argv); !s.ok() || args.help_requested()) {
    std::fprintf(stderr, "%s\n", args.Help().c_str());
    return s.ok() ? 0 : 2;
  }
  const std::string target = args.str("target");
  const int clients = static_cast<int>(*args.integer("clients"));
  const double rate = *args.real("rate");
  const double seconds = *args.real("seconds");
  const int keys = static_cast<int>(*args.integer("keys"));
  const int pages = static_cast<int>(*args.integer("pages"));
  const bool pin = args.flag("pin");
  const int nchannels = static_cast<int>(*args.integer("channels"));
  std::vector<std::shared_ptr<v1::KvCache::Stub>> shared;
  for (int c = 0; c < nchannels; ++c) {
    grpc::ChannelArguments ca;
    ca.SetInt("oscarkv.channel", c);
    shared.push_back(v1::KvCache::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), ca)));
  }

  auto stub = v1::KvCache::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  std::string codec;
  {
    grpc::ClientContext ctx;
    v1::RegisterCodecRequest req;
    *req.mutable_profile() = service::testing::TinyProfile("loadgen");
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
      it->set_key(service::testing::Key(i, 77));
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
      c.set_key(service::testing::Key(i, 77));
      c.set_data(service::testing::MakePage(service::testing::TinyProfile("loadgen"),
                                            PageKind::kInt2, i));
      w->Write(c);
    }
    w->WritesDone();
    (void)w->Finish();
    grpc::ClientContext cctx;
    v1::CommitRequest creq;
    creq.set_reservation_id(resp.reservation_id());
    v1::CommitResponse cresp;
    (void)stub->Commit(&cctx, creq, &cresp);
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
            grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), ca));
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
        for (int k = 0; k < keys; ++k) req.add_keys(service::testing::Key(first + k, 77));
        req.set_pin(pin);
        v1::LookupResponse resp;
        grpc::ClientContext ctx;
        const grpc::Status st = s->Lookup(&ctx, req, &resp);
        lat[t].push_back(std::chrono::duration<double>(Clock::now() - due).count());
        if (!st.ok()) ++errors;
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
