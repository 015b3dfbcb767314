// Operator subcommands talking to a running oscarkvd through the client library:
//   oscarkv stats | health | lookup | evict | clear | codec unregister
// Each takes --addr (default 127.0.0.1:50051), --tls-ca/--tls-cert/--tls-key (gRPC over TLS),
// --shared-namespace (a tenant's shared namespace) and --json. Exit codes: 0 ok, 1 the operation failed (the daemon is down or answered an
// error: one readable line on stderr), 2 usage (a bad flag or flag value, refused before
// anything is sent).
#if __has_include("oscarkv/client/client.h")  // built only with the client module
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "command.h"
#include "nlohmann/json.hpp"
#include "oscarkv/client/client.h"
#include "oscarkv/util/args.h"
#include "oscarkv/util/host_port.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::cli {
namespace {

using client::Client;
using json = nlohmann::json;

constexpr char kDefaultAddr[] = "127.0.0.1:50051";

void AddCommon(Args& a) {
  a.Option("addr", kDefaultAddr, "oscarkvd address (HOST:PORT or unix:/path)");
  a.Option("timeout-ms", "3000", "deadline of each call to the daemon");
  a.Option("tls-ca", "", "gRPC over TLS: CA bundle (PEM) the daemon's certificate must chain to "
                         "(a daemon started with --tls-cert); default plaintext");
  a.Option("tls-cert", "", "client certificate (PEM) for a daemon with --tls-client-ca (with "
                           "--tls-key and --tls-ca)");
  a.Option("tls-key", "", "private key (PEM) of --tls-cert");
  a.Option("tls-server-name", "", "name checked against the daemon's certificate (default: the "
                                  "--addr host)");
  a.Option("shared-namespace", "", "act in this shared namespace of the daemon's config "
                                   "(shared_namespaces:) instead of the tenant's own; the "
                                   "--tls-cert's tenant must be a member (else PERMISSION_DENIED)");
  a.Flag("json", "print JSON instead of text");
}

void AddCodecOptions(Args& a) {
  a.Option("shape", "qwen3-8b", "codec: a built-in profile (qwen3-8b, refmodel), registered on use");
  a.Option("codec", "", "codec: a 32-hex codec id instead of --shape (not registered)");
  a.Option("page-tokens", "64", "tokens per block with --codec (for --tokens-file)");
  a.Option("salt", "", "tenant salt of the block keys (with --tokens-file)");
  a.Option("tokens-file", "", "file of token ids (integers separated by spaces, commas or newlines)");
  a.Option("keys", "", "comma-separated 32-hex block keys instead of --tokens-file");
}

// The flag values that can be checked without the daemon; a bad one is a usage error (exit 2).
absl::Status CheckUsage(const Args& a, bool takes_keys) {
  HostPortRules dial;
  dial.allow_port_zero = false;
  if (auto hp = ParseHostPort(a.str("addr"), dial); !hp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--addr ", hp.status().message()));
  }
  auto t = a.integer("timeout-ms");
  if (!t.ok()) return t.status();
  if (*t <= 0) return absl::InvalidArgumentError("--timeout-ms must be > 0");
  if (a.str("tls-cert").empty() != a.str("tls-key").empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!a.str("tls-cert").empty() && a.str("tls-ca").empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert needs --tls-ca (the CA the daemon's certificate chains to)");
  }
  if (a.given("codec")) OSCARKV_RETURN_IF_ERROR(CodecId::FromHex(a.str("codec")).status());
  if (a.given("shape")) OSCARKV_RETURN_IF_ERROR(BuiltinProfile(a.str("shape")).status());
  if (!takes_keys) return absl::OkStatus();
  OSCARKV_ASSIGN_OR_RETURN(int64_t pt, a.integer("page-tokens"));
  if (pt < 1 || pt > 4096) return absl::InvalidArgumentError("--page-tokens must be 1..4096");
  if (a.given("keys") == a.given("tokens-file")) {
    return absl::InvalidArgumentError("give exactly one of --keys HEX,... or --tokens-file FILE");
  }
  for (absl::string_view h : absl::StrSplit(a.str("keys"), ',', absl::SkipEmpty())) {
    if (!BlockKey::FromHex(std::string(h)).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--keys: '", std::string(h), "' is not a 32-hex block key"));
    }
  }
  return absl::OkStatus();
}

// Parses argv; returns -1 to continue, else the exit code (help: 0, usage error: 2).
int ParseOrExit(Args& a, int argc, char** argv, bool takes_keys = false) {
  if (auto rc = a.ParseOrExitCode(argc, argv)) return *rc;
  if (!a.positional().empty()) {
    std::fprintf(stderr, "unexpected argument '%s'\n\n%s", a.positional()[0].c_str(), a.Help().c_str());
    return 2;
  }
  if (absl::Status s = CheckUsage(a, takes_keys); !s.ok()) {
    std::fprintf(stderr, "oscarkv %s: %s\n", a.command().c_str(), std::string(s.message()).c_str());
    return 2;
  }
  return -1;
}

int Fail(const std::string& cmd, const absl::Status& s) {
  std::fprintf(stderr, "oscarkv %s: %s\n", cmd.c_str(), std::string(s.message()).c_str());
  return 1;
}

absl::StatusOr<std::unique_ptr<Client>> Dial(const Args& a) {
  client::ConnectOptions o;
  o.address = a.str("addr");
  o.client_name = "oscarkv-cli";
  o.data_path = client::DataPath::kGrpc;  // operator calls move no page bytes
  auto t = a.integer("timeout-ms");
  if (!t.ok()) return t.status();
  if (*t <= 0) return absl::InvalidArgumentError("--timeout-ms must be > 0");
  o.rpc_timeout_ms = *t;
  o.tls_ca_file = a.str("tls-ca");
  o.tls_cert_file = a.str("tls-cert");
  o.tls_key_file = a.str("tls-key");
  o.tls_server_name = a.str("tls-server-name");
  o.shared_namespace = a.str("shared-namespace");
  auto c = Client::Connect(o);
  if (!c.ok()) {
    // The client's message already names the address; keep the one line short.
    std::string msg(c.status().message());
    const std::string prefix = absl::StrCat("handshake with oscarkvd at ", o.address, ": ");
    if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
    return absl::Status(c.status().code(),
                        absl::StrCat("cannot reach oscarkvd at ", o.address, " (",
                                     absl::StatusCodeToString(c.status().code()), "): ", msg));
  }
  return c;
}

absl::StatusOr<client::Codec> ResolveCodec(const Args& a, Client& c) {
  if (a.given("codec")) {
    client::Codec codec;
    OSCARKV_ASSIGN_OR_RETURN(codec.id, CodecId::FromHex(a.str("codec")));
    OSCARKV_ASSIGN_OR_RETURN(int64_t pt, a.integer("page-tokens"));
    if (pt < 1 || pt > 4096) return absl::InvalidArgumentError("--page-tokens must be 1..4096");
    codec.profile.page_tokens = static_cast<uint32_t>(pt);
    return codec;
  }
  OSCARKV_ASSIGN_OR_RETURN(CodecProfile p, BuiltinProfile(a.str("shape")));
  return c.RegisterCodec(p);
}

absl::StatusOr<std::vector<uint32_t>> ReadTokens(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read tokens file ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<uint32_t> out;
  for (absl::string_view t : absl::StrSplit(ss.str(), absl::ByAnyChar(" ,\t\r\n[]"),
                                            absl::SkipEmpty())) {
    uint32_t v = 0;
    if (!absl::SimpleAtoi(t, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", std::string(t), "' is not a token id (0..4294967295)"));
    }
    out.push_back(v);
  }
  return out;
}

// Keys from --keys or --tokens-file (exactly one of them).
absl::StatusOr<std::vector<BlockKey>> ResolveKeys(const Args& a, const client::Codec& codec,
                                                  size_t* tokens_out = nullptr) {
  if (a.given("keys") == a.given("tokens-file")) {
    return absl::InvalidArgumentError("give exactly one of --keys HEX,... or --tokens-file FILE");
  }
  std::vector<BlockKey> keys;
  if (a.given("keys")) {
    for (absl::string_view h : absl::StrSplit(a.str("keys"), ',', absl::SkipEmpty())) {
      auto k = BlockKey::FromHex(std::string(h));
      if (!k.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--keys: '", std::string(h), "' is not a 32-hex block key"));
      }
      keys.push_back(*k);
    }
    if (keys.empty()) return absl::InvalidArgumentError("--keys is empty");
    return keys;
  }
  OSCARKV_ASSIGN_OR_RETURN(auto tokens, ReadTokens(a.str("tokens-file")));
  if (tokens_out) *tokens_out = tokens.size();
  keys = Client::BlockKeys(codec, tokens, a.str("salt"));
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        a.str("tokens-file"), " holds ", tokens.size(), " tokens: less than one block of ",
        codec.profile.page_tokens));
  }
  return keys;
}

std::string Mb(uint64_t b) { return absl::StrCat(b / (1 << 20), " MiB"); }

int RunStats(int argc, char** argv) {
  Args a("stats", "Prints the counters of a running oscarkvd (pool, pages, leases, hit rate).");
  AddCommon(a);
  if (int rc = ParseOrExit(a, argc, argv); rc >= 0) return rc;
  auto c = Dial(a);
  if (!c.ok()) return Fail("stats", c.status());
  auto s = (*c)->GetStats();
  if (!s.ok()) return Fail("stats", s.status());
  const double hit_rate = s->hits + s->misses ? double(s->hits) / double(s->hits + s->misses) : 0;
  if (a.flag("json")) {
    json j = {{"addr", a.str("addr")}, {"node_id", s->node_id},
              {"server_version", s->server_version}, {"pool_bytes", s->pool_bytes},
              {"pool_used_bytes", s->pool_used_bytes}, {"pages", s->pages},
              {"pinned_pages", s->pinned_pages}, {"leases", s->leases},
              {"reservations", s->reservations}, {"lookups", s->lookups}, {"hits", s->hits},
              {"misses", s->misses}, {"hit_rate", hit_rate}, {"evictions", s->evictions},
              {"bytes_written", s->bytes_written}, {"bytes_read", s->bytes_read},
              {"codecs", s->codecs}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s  node %s  at %s\n", s->server_version.c_str(), s->node_id.c_str(),
              a.str("addr").c_str());
  std::printf("  pool        %s used of %s (%.1f%%)\n", Mb(s->pool_used_bytes).c_str(),
              Mb(s->pool_bytes).c_str(),
              s->pool_bytes ? 100.0 * double(s->pool_used_bytes) / double(s->pool_bytes) : 0.0);
  std::printf("  pages       %llu (%llu pinned), %u codecs\n", (unsigned long long)s->pages,
              (unsigned long long)s->pinned_pages, s->codecs);
  std::printf("  leases      %llu   reservations %llu\n", (unsigned long long)s->leases,
              (unsigned long long)s->reservations);
  std::printf("  lookups     %llu   keys hit %llu, missed %llu (hit rate %.1f%%)\n",
              (unsigned long long)s->lookups, (unsigned long long)s->hits,
              (unsigned long long)s->misses, 100 * hit_rate);
  std::printf("  evictions   %llu\n", (unsigned long long)s->evictions);
  std::printf("  bytes       %s written, %s read\n", Mb(s->bytes_written).c_str(),
              Mb(s->bytes_read).c_str());
  return 0;
}

int RunHealth(int argc, char** argv) {
  Args a("health",
         "Checks that oscarkvd answers (handshake + stats). Exit 0 healthy, 1 not: usable as a "
         "liveness probe.");
  AddCommon(a);
  if (int rc = ParseOrExit(a, argc, argv); rc >= 0) return rc;
  auto c = Dial(a);
  absl::StatusOr<client::Stats> s = c.ok() ? (*c)->GetStats() : absl::StatusOr<client::Stats>(c.status());
  if (a.flag("json")) {
    json j = {{"addr", a.str("addr")}, {"healthy", s.ok()}};
    if (s.ok()) {
      const auto& info = (*c)->server();
      j.update({{"server_version", info.server_version}, {"node_id", info.node_id},
                {"shm_path", info.shm_path}, {"max_batch", info.max_batch},
                {"pool_bytes", s->pool_bytes}, {"pool_used_bytes", s->pool_used_bytes},
                {"pages", s->pages}});
    } else {
      j["error"] = std::string(s.status().message());
    }
    std::printf("%s\n", j.dump(2).c_str());
    return s.ok() ? 0 : 1;
  }
  if (!s.ok()) return Fail("health", s.status());
  const auto& info = (*c)->server();
  std::printf("ok: %s node %s at %s, %llu pages, pool %s of %s used, max batch %u%s\n",
              info.server_version.c_str(), info.node_id.c_str(), a.str("addr").c_str(),
              (unsigned long long)s->pages, Mb(s->pool_used_bytes).c_str(),
              Mb(s->pool_bytes).c_str(), info.max_batch,
              info.shm_path.empty() ? "" : absl::StrCat(", shm ", info.shm_path).c_str());
  return 0;
}

int RunLookup(int argc, char** argv) {
  Args a("lookup",
         "Asks oscarkvd for the longest cached prefix of a token sequence (or of block keys). "
         "A probe: nothing is pinned.");
  AddCommon(a);
  AddCodecOptions(a);
  a.Epilog(
      "examples:\n"
      "  oscarkv lookup --tokens-file prompt.txt --shape qwen3-8b\n"
      "  oscarkv lookup --keys 5d55a8bf9ffbceec922d5a1b7acc1d7f --codec 4be25704bf3761cb7196d7029b0c67ed");
  if (int rc = ParseOrExit(a, argc, argv, /*takes_keys=*/true); rc >= 0) return rc;
  auto c = Dial(a);
  if (!c.ok()) return Fail("lookup", c.status());
  auto codec = ResolveCodec(a, **c);
  if (!codec.ok()) return Fail("lookup", codec.status());
  size_t tokens = 0;
  auto keys = ResolveKeys(a, *codec, &tokens);
  if (!keys.ok()) return Fail("lookup", keys.status());
  auto r = (*c)->Lookup(*codec, *keys);
  if (!r.ok()) return Fail("lookup", r.status());
  const uint64_t cached_tokens = uint64_t{r->matched} * codec->profile.page_tokens;
  if (a.flag("json")) {
    json hits = json::array();
    for (size_t i = 0; i < keys->size(); ++i) {
      hits.push_back({{"key", (*keys)[i].Hex()}, {"cached", i < r->matched}});
    }
    json j = {{"codec_id", codec->id.Hex()}, {"keys", keys->size()}, {"matched", r->matched},
              {"cached_tokens", cached_tokens}, {"blocks", hits}};
    if (tokens) j["tokens"] = tokens;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("codec %s: %u of %zu blocks cached", codec->id.Hex().c_str(), r->matched,
              keys->size());
  if (tokens) {
    std::printf(" (%llu of %zu tokens)", (unsigned long long)cached_tokens, tokens);
  }
  std::printf("\n");
  for (size_t i = 0; i < keys->size() && i < 64; ++i) {
    std::printf("  %4zu  %s  %s\n", i, (*keys)[i].Hex().c_str(), i < r->matched ? "hit" : "miss");
  }
  if (keys->size() > 64) std::printf("  ... %zu more\n", keys->size() - 64);
  return 0;
}

int RunEvict(int argc, char** argv) {
  Args a("evict",
         "Deletes the given pages from oscarkvd. Pinned pages are deleted once their lease ends.");
  AddCommon(a);
  AddCodecOptions(a);
  if (int rc = ParseOrExit(a, argc, argv, /*takes_keys=*/true); rc >= 0) return rc;
  auto c = Dial(a);
  if (!c.ok()) return Fail("evict", c.status());
  auto codec = ResolveCodec(a, **c);
  if (!codec.ok()) return Fail("evict", codec.status());
  auto keys = ResolveKeys(a, *codec);
  if (!keys.ok()) return Fail("evict", keys.status());
  auto r = (*c)->Delete(*codec, *keys);
  if (!r.ok()) return Fail("evict", r.status());
  int removed = 0, missing = 0, pinned = 0, other = 0;
  json items = json::array();
  for (size_t i = 0; i < r->size(); ++i) {
    const absl::Status& s = (*r)[i];
    const char* what = s.ok() ? "removed"
                       : absl::IsNotFound(s)           ? "not cached"
                       : absl::IsFailedPrecondition(s) ? "pinned (removed when released)"
                                                       : "error";
    (s.ok() ? removed : absl::IsNotFound(s) ? missing : absl::IsFailedPrecondition(s) ? pinned : other)++;
    items.push_back({{"key", (*keys)[i].Hex()}, {"result", what}, {"message", std::string(s.message())}});
    if (!a.flag("json")) std::printf("  %s  %s\n", (*keys)[i].Hex().c_str(), what);
  }
  if (a.flag("json")) {
    json j = {{"removed", removed}, {"not_cached", missing}, {"pinned", pinned},
              {"errors", other}, {"items", items}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("evict: %d removed, %d not cached, %d pinned, %d errors\n", removed, missing,
                pinned, other);
  }
  return other ? 1 : 0;
}

int RunClear(int argc, char** argv) {
  Args a("clear", "Drops cached pages: of one codec (--shape/--codec) or of all (--all).");
  AddCommon(a);
  a.Option("shape", "", "clear pages of this built-in profile's codec (qwen3-8b, refmodel)");
  a.Option("codec", "", "clear pages of this 32-hex codec id");
  a.Flag("all", "clear pages of every codec");
  a.Flag("include-pinned", "also drop pages pinned by leases (their holders' loads then fail)");
  a.Flag("codecs", "then unregister the cleared codecs that hold nothing any more (no page, "
                   "reservation or transfer handle): frees their codec slots and quota, as "
                   "`oscarkv codec unregister` does (--all: every codec of the tenant; an admin's: "
                   "everyone's)");
  if (int rc = ParseOrExit(a, argc, argv); rc >= 0) return rc;
  const int chosen = a.given("shape") + a.given("codec") + a.flag("all");
  if (chosen != 1) {
    std::fprintf(stderr, "oscarkv clear: say which pages: exactly one of --all, --codec HEX, --shape NAME\n");
    return 2;
  }
  CodecId id;
  if (a.given("codec")) {
    auto parsed = CodecId::FromHex(a.str("codec"));
    if (!parsed.ok()) return Fail("clear", parsed.status());
    id = *parsed;
  } else if (a.given("shape")) {
    auto p = BuiltinProfile(a.str("shape"));
    if (!p.ok()) return Fail("clear", p.status());
    id = p->Id();
  }
  auto c = Dial(a);
  if (!c.ok()) return Fail("clear", c.status());
  uint32_t freed = 0;
  auto n = (*c)->Clear(a.flag("all") ? nullptr : &id, a.flag("include-pinned"), a.flag("codecs"),
                       &freed);
  if (!n.ok()) return Fail("clear", n.status());
  if (a.flag("json")) {
    json j = {{"pages_removed", *n}};
    if (a.flag("codecs")) j["codecs_freed"] = freed;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("clear: %llu pages removed%s", (unsigned long long)*n,
                a.flag("include-pinned") ? "" : " (pinned pages kept)");
    if (a.flag("codecs")) std::printf(", %u codecs unregistered", freed);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

// `oscarkv codec unregister` (cmd_codec.cc dispatches here).
int RunCodecUnregister(int argc, char** argv) {
  Args a("codec unregister",
         "Removes a codec registration from oscarkvd (--shape or --codec): its codec slot and "
         "the tenant's codec quota are free again, and a restart does not bring it back. Refused "
         "(FAILED_PRECONDITION) while the codec holds pages or transfer handles, unless "
         "--drop-pages.");
  AddCommon(a);
  a.Option("shape", "", "the codec of this built-in profile (qwen3-8b, refmodel)");
  a.Option("codec", "", "the codec of this 32-hex id");
  a.Flag("drop-pages", "delete its pages (pinned ones too) and transfer handles first");
  if (int rc = ParseOrExit(a, argc, argv); rc >= 0) return rc;
  if (a.given("shape") + a.given("codec") != 1) {
    std::fprintf(stderr, "oscarkv codec unregister: say which codec: exactly one of --codec HEX, "
                         "--shape NAME\n");
    return 2;
  }
  CodecId id;
  if (a.given("codec")) {
    id = *CodecId::FromHex(a.str("codec"));  // checked by ParseOrExit
  } else {
    id = BuiltinProfile(a.str("shape"))->Id();
  }
  auto c = Dial(a);
  if (!c.ok()) return Fail("codec unregister", c.status());
  auto n = (*c)->UnregisterCodec(id, a.flag("drop-pages"));
  if (!n.ok()) {
    return Fail("codec unregister",
                absl::Status(n.status().code(),
                             absl::StrCat(absl::StatusCodeToString(n.status().code()), ": ",
                                          n.status().message())));
  }
  if (a.flag("json")) {
    std::printf("%s\n", json({{"codec_id", id.Hex()}, {"pages_removed", *n}}).dump(2).c_str());
  } else {
    std::printf("codec %s unregistered; %llu pages removed\n", id.Hex().c_str(),
                (unsigned long long)*n);
  }
  return 0;
}

namespace {

OSCARKV_COMMAND("stats", "counters of a running oscarkvd (pool, pages, leases, hit rate)", RunStats);
OSCARKV_COMMAND("health", "is oscarkvd up and answering? (exit 0 / 1)", RunHealth);
OSCARKV_COMMAND("lookup", "longest cached prefix of a token file or block keys", RunLookup);
OSCARKV_COMMAND("evict", "delete given pages from oscarkvd", RunEvict);
OSCARKV_COMMAND("clear", "drop cached pages of a codec or of all codecs", RunClear);

}  // namespace
}  // namespace oscarkv::cli
#endif  // __has_include client.h
