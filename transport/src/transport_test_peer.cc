// transport_test_peer: the far side of transport_peer_test. Registers a pool of real pages,
// sends its worker address and memory blob over the control fd, then serves (progresses its
// worker) until the control channel closes. Command "count-valid" replies with how many pool
// slots hold a page whose checksum verifies.
//
//   transport_test_peer --tls=tcp --shape=refmodel --kind=int2 --pages=64 --seed=7 --alloc=user|ucx
//                       --control-fd=N
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/testing/bootstrap.h"
#include "oscarkv/transport/transport.h"
#include "test_pages.h"

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "transport_test_peer: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace oscarkv;
  using namespace oscarkv::transport;
  using oscarkv::testing::ParseControlFd;
  using oscarkv::testing::SendBlob;
  using oscarkv::testing::ServeUntilClosed;
  std::map<std::string, std::string> opt = {{"tls", "tcp"},     {"shape", "refmodel"},
                                            {"kind", "int2"},    {"pages", "64"},
                                            {"seed", "1"},       {"max-seconds", "120"},
                                            {"alloc", "user"}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "usage: %s --key=value ...\n", argv[0]);
      return 2;
    }
    opt[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  absl::StatusOr<int> fd = ParseControlFd(opt["control-fd"]);
  if (!fd.ok()) return Fail(fd.status());
  absl::StatusOr<CodecProfile> profile = BuiltinProfile(opt["shape"]);
  if (!profile.ok()) return Fail(profile.status());
  const PageKind kind = opt["kind"] == "bf16" ? PageKind::kBf16 : PageKind::kInt2;
  const size_t page_bytes = GeometryFor(*profile, kind).page_bytes();
  uint32_t pages = 0, seed = 0, max_seconds = 0;
  if (!absl::SimpleAtoi(opt["pages"], &pages) || !absl::SimpleAtoi(opt["seed"], &seed) ||
      !absl::SimpleAtoi(opt["max-seconds"], &max_seconds) || pages == 0) {
    return Fail(absl::InvalidArgumentError("bad --pages/--seed/--max-seconds"));
  }

  ContextOptions copts;
  copts.tls = opt["tls"];
  copts.net_devices = "lo";
  auto ctx = Context::Create(copts);
  if (!ctx.ok()) return Fail(ctx.status());
  auto worker = Worker::Create(**ctx);
  if (!worker.ok()) return Fail(worker.status());

  // --alloc=user: our memory, registered; --alloc=ucx: UCX-allocated (shm peers map it).
  std::unique_ptr<uint8_t[]> user_pool;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region;
  if (opt["alloc"] == "ucx") {
    region = (*ctx)->Allocate(page_bytes * pages);
  } else {
    user_pool.reset(new uint8_t[page_bytes * pages]);
    region = (*ctx)->Register(user_pool.get(), page_bytes * pages);
  }
  if (!region.ok()) return Fail(region.status());
  uint8_t* pool = (*region)->base();
  for (uint32_t i = 0; i < pages; ++i) {
    if (absl::Status s = transport::testing::FillPage(
            *profile, kind, seed, i, {pool + size_t{i} * page_bytes, page_bytes});
        !s.ok()) {
      return Fail(s);
    }
  }
  if (absl::Status s = SendBlob(*fd, (*worker)->address()); !s.ok()) return Fail(s);
  if (absl::Status s = SendBlob(*fd, (*region)->exported()); !s.ok()) return Fail(s);

  absl::Status served = ServeUntilClosed(
      **worker, *fd, absl::Seconds(max_seconds), [&](const std::string& cmd) -> std::string {
        if (cmd == "count-valid") {
          return absl::StrCat(transport::testing::CountValidPages(pool, page_bytes, pages));
        }
        if (cmd == "transports") return (*ctx)->capabilities().ToString();
        return "unknown command";
      });
  if (!served.ok()) return Fail(served);
  return 0;
}
