// The C ABI (oscarkv_c.h): the calls that talk to a daemon, over oscarkv::client::Client. The
// daemon-free calls (profiles, rotations, the page builder) are in oscarkv_c_page.cc.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/client/client.h"
#include "oscarkv/client/oscarkv_c.h"
#include "oscarkv_c_internal.h"

using oscarkv::BlockKey;
using oscarkv::CodecProfile;
using oscarkv::PageKind;
using oscarkv::c_abi::Fail;
using oscarkv::c_abi::Ok;
using oscarkv::client::Client;
using oscarkv::client::Codec;

struct oscarkv_client {
  std::unique_ptr<Client> client;
  absl::Mutex mu;
  // Registered codecs by id: the C side passes only the id, the client needs the profile.
  absl::flat_hash_map<std::string, Codec> codecs ABSL_GUARDED_BY(mu);
};

struct oscarkv_lease {
  oscarkv::client::LookupResult lookup;
};

namespace oscarkv::c_abi {
CodecProfile ProfileFromC(const oscarkv_codec_profile& c);  // oscarkv_c_page.cc
}  // namespace oscarkv::c_abi

namespace {

std::string IdKey(const uint8_t* id) { return std::string(reinterpret_cast<const char*>(id), 16); }

// Looks up the registered codec matching `c`; NOT_FOUND when it was not registered through
// this handle.
absl::StatusOr<Codec> FindCodec(oscarkv_client* h, const oscarkv_codec* c) {
  if (c == nullptr) return absl::InvalidArgumentError("codec is NULL");
  absl::MutexLock lock(&h->mu);
  auto it = h->codecs.find(IdKey(c->codec_id));
  if (it == h->codecs.end()) {
    return absl::NotFoundError("codec not registered on this client (oscarkv_register_codec)");
  }
  return it->second;
}

std::vector<BlockKey> Keys(const uint8_t* keys, size_t n) {
  std::vector<BlockKey> out(n);
  for (size_t i = 0; i < n; ++i) std::memcpy(out[i].bytes.data(), keys + 16 * i, 16);
  return out;
}

int Register(oscarkv_client* h, const CodecProfile& p, oscarkv_codec* out) {
  auto c = h->client->RegisterCodec(p);
  if (!c.ok()) return Fail(c.status());
  std::memcpy(out->codec_id, c->id.bytes.data(), 16);
  out->page_tokens = c->profile.page_tokens;
  out->int2_page_bytes = c->int2_page_bytes;
  out->bf16_page_bytes = c->bf16_page_bytes;
  absl::MutexLock lock(&h->mu);
  h->codecs[IdKey(out->codec_id)] = *std::move(c);
  return Ok();
}

}  // namespace

extern "C" {

void oscarkv_connect_options_init(oscarkv_connect_options* opts) {
  if (opts == nullptr) return;
  *opts = {};
  opts->data_path = OSCARKV_PATH_AUTO;
  opts->verify_checksums = 1;
  opts->rpc_timeout_ms = 10000;
  opts->lookup_path = OSCARKV_LOOKUP_AUTO;
}

void oscarkv_tls_options_init(oscarkv_tls_options* tls) {
  if (tls == nullptr) return;
  *tls = {};
  tls->struct_size = sizeof(oscarkv_tls_options);
}

int oscarkv_connect(const oscarkv_connect_options* opts, oscarkv_client** out) {
  return oscarkv_connect_tls(opts, nullptr, out);
}

int oscarkv_connect_tls(const oscarkv_connect_options* opts, const oscarkv_tls_options* tls,
                        oscarkv_client** out) {
  if (out == nullptr) return Fail(OSCARKV_E_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  oscarkv::client::ConnectOptions o;
  if (tls != nullptr) {
    // ABI 3 callers' struct ends before shared_namespace; read that field only when it is there.
    constexpr size_t kAbi3Size = offsetof(oscarkv_tls_options, shared_namespace);
    if (tls->struct_size != sizeof(oscarkv_tls_options) && tls->struct_size != kAbi3Size) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "oscarkv_tls_options.struct_size is ", tls->struct_size, ", this library (C ABI ",
          OSCARKV_ABI_VERSION, ") knows ", sizeof(oscarkv_tls_options), " (or ", kAbi3Size,
          " of ABI 3): call oscarkv_tls_options_init() first")));
    }
    auto str = [](const char* p) { return p == nullptr ? std::string() : std::string(p); };
    o.tls_ca_file = str(tls->ca_file);
    o.tls_cert_file = str(tls->cert_file);
    o.tls_key_file = str(tls->key_file);
    o.tls_server_name = str(tls->server_name);
    if (tls->struct_size == sizeof(oscarkv_tls_options)) {
      o.shared_namespace = str(tls->shared_namespace);
    }
  }
  o.client_name = "oscarkv-c";
  if (opts != nullptr) {
    if (opts->address != nullptr) o.address = opts->address;
    if (opts->client_name != nullptr) o.client_name = opts->client_name;
    switch (opts->data_path) {
      case OSCARKV_PATH_AUTO: o.data_path = oscarkv::client::DataPath::kAuto; break;
      case OSCARKV_PATH_SHM: o.data_path = oscarkv::client::DataPath::kSharedMemory; break;
      case OSCARKV_PATH_GRPC: o.data_path = oscarkv::client::DataPath::kGrpc; break;
      default: return Fail(OSCARKV_E_INVALID_ARGUMENT, "data_path must be OSCARKV_PATH_*");
    }
    switch (opts->lookup_path) {
      case OSCARKV_LOOKUP_AUTO: o.lookup_path = oscarkv::client::LookupPath::kAuto; break;
      case OSCARKV_LOOKUP_LOCAL: o.lookup_path = oscarkv::client::LookupPath::kLocal; break;
      case OSCARKV_LOOKUP_GRPC: o.lookup_path = oscarkv::client::LookupPath::kGrpc; break;
      default: return Fail(OSCARKV_E_INVALID_ARGUMENT, "lookup_path must be OSCARKV_LOOKUP_*");
    }
    o.verify_checksums = opts->verify_checksums != 0;
    if (opts->rpc_timeout_ms > 0) o.rpc_timeout_ms = opts->rpc_timeout_ms;
  }
  auto c = Client::Connect(o);
  if (!c.ok()) return Fail(c.status());
  auto* h = new oscarkv_client;
  h->client = *std::move(c);
  *out = h;
  return Ok();
}

void oscarkv_close(oscarkv_client* client) { delete client; }

int oscarkv_uses_shm(const oscarkv_client* client) {
  return client != nullptr &&
         client->client->server().data_path == oscarkv::client::DataPath::kSharedMemory;
}

int oscarkv_uses_local_lookups(const oscarkv_client* client) {
  return client != nullptr &&
         client->client->server().lookup_path == oscarkv::client::LookupPath::kLocal;
}

int oscarkv_register_codec(oscarkv_client* client, const oscarkv_codec_profile* profile,
                           oscarkv_codec* out) {
  if (client == nullptr || profile == nullptr || out == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "client, profile and out must not be NULL");
  }
  const CodecProfile p = oscarkv::c_abi::ProfileFromC(*profile);
  return Register(client, p, out);
}

int oscarkv_register_builtin_codec(oscarkv_client* client, const char* shape,
                                   oscarkv_codec* out) {
  if (client == nullptr || shape == nullptr || out == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "client, shape and out must not be NULL");
  }
  auto p = oscarkv::BuiltinProfile(shape);
  if (!p.ok()) return Fail(p.status());
  return Register(client, *p, out);
}

int oscarkv_unregister_codec(oscarkv_client* client, const oscarkv_codec* codec, int drop_pages,
                             uint64_t* pages_removed) {
  if (client == nullptr || codec == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "client and codec must not be NULL");
  }
  if (pages_removed != nullptr) *pages_removed = 0;
  oscarkv::CodecId id;
  std::memcpy(id.bytes.data(), codec->codec_id, 16);
  auto r = client->client->UnregisterCodec(id, drop_pages != 0);
  if (r.ok() || absl::IsNotFound(r.status())) {  // gone from the daemon either way
    absl::MutexLock lock(&client->mu);
    client->codecs.erase(IdKey(codec->codec_id));
  }
  if (!r.ok()) return Fail(r.status());
  if (pages_removed != nullptr) *pages_removed = *r;
  return Ok();
}

int oscarkv_block_keys(const oscarkv_codec* codec, const char* tenant_salt, size_t salt_len,
                       const uint32_t* tokens, size_t n_tokens, uint8_t* keys_out,
                       size_t max_keys, size_t* num_keys) {
  if (codec == nullptr || (tokens == nullptr && n_tokens > 0) || num_keys == nullptr ||
      (keys_out == nullptr && max_keys > 0) || (tenant_salt == nullptr && salt_len > 0)) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  if (codec->page_tokens == 0) return Fail(OSCARKV_E_INVALID_ARGUMENT, "page_tokens is 0");
  oscarkv::CodecId id;
  std::memcpy(id.bytes.data(), codec->codec_id, 16);
  const size_t blocks = std::min(n_tokens / codec->page_tokens, max_keys);
  auto keys = oscarkv::ComputeBlockKeys(
      id, std::string_view(tenant_salt ? tenant_salt : "", salt_len),
      std::span<const uint32_t>(tokens, blocks * codec->page_tokens), codec->page_tokens);
  for (size_t i = 0; i < keys.size(); ++i) std::memcpy(keys_out + 16 * i, keys[i].bytes.data(), 16);
  *num_keys = n_tokens / codec->page_tokens;
  return Ok();
}

int oscarkv_lookup(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                   size_t n_keys, uint32_t* matched) {
  if (client == nullptr || matched == nullptr || (keys == nullptr && n_keys > 0)) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  auto c = FindCodec(client, codec);
  if (!c.ok()) return Fail(c.status());
  auto r = client->client->Lookup(*c, Keys(keys, n_keys));
  if (!r.ok()) return Fail(r.status());
  *matched = r->matched;
  return Ok();
}

int oscarkv_exists(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                   size_t n_keys, uint8_t* present) {
  if (client == nullptr || (n_keys > 0 && (keys == nullptr || present == nullptr))) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  auto c = FindCodec(client, codec);
  if (!c.ok()) return Fail(c.status());
  // One single-key (hence prefix == existence) unpinned lookup per key, at most kWindow in
  // flight; the callbacks only record their answer, this thread waits for them.
  constexpr size_t kWindow = 256;
  struct Answers {
    absl::Mutex mu;
    absl::CondVar answered_one;
    size_t answered ABSL_GUARDED_BY(mu) = 0;
    absl::Status first_error ABSL_GUARDED_BY(mu);
  };
  // Shared with the callbacks: the last one may still be unlocking when this thread returns.
  auto shared = std::make_shared<Answers>();
  Answers& answers = *shared;
  const std::vector<BlockKey> ks = Keys(keys, n_keys);
  for (size_t i = 0; i < n_keys; ++i) {
    {
      absl::MutexLock lock(&answers.mu);
      while (i - answers.answered >= kWindow) answers.answered_one.Wait(&answers.mu);
    }
    client->client->LookupAsync(
        *c, std::span<const BlockKey>(&ks[i], 1), {},
        [shared, present, i](absl::StatusOr<oscarkv::client::LookupResult> r) {
          present[i] = r.ok() && r->matched == 1 ? 1 : 0;
          absl::MutexLock lock(&shared->mu);
          if (!r.ok() && shared->first_error.ok()) shared->first_error = r.status();
          ++shared->answered;
          shared->answered_one.Signal();
        });
  }
  absl::MutexLock lock(&answers.mu);
  while (answers.answered < n_keys) answers.answered_one.Wait(&answers.mu);
  if (!answers.first_error.ok()) return Fail(answers.first_error);
  return Ok();
}

int oscarkv_lookup_pinned(oscarkv_client* client, const oscarkv_codec* codec,
                          const uint8_t* keys, size_t n_keys, uint32_t lease_ms,
                          uint32_t* matched, oscarkv_lease** lease_out) {
  if (client == nullptr || matched == nullptr || lease_out == nullptr ||
      (keys == nullptr && n_keys > 0)) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  *lease_out = nullptr;
  auto c = FindCodec(client, codec);
  if (!c.ok()) return Fail(c.status());
  oscarkv::client::LookupOptions o;
  o.pin = true;
  o.lease_ms = lease_ms;
  auto r = client->client->Lookup(*c, Keys(keys, n_keys), o);
  if (!r.ok()) return Fail(r.status());
  *matched = r->matched;
  *lease_out = new oscarkv_lease{*std::move(r)};
  return Ok();
}

uint64_t oscarkv_lease_deadline_ms(const oscarkv_lease* lease) {
  return lease == nullptr || lease->lookup.lease_ids.empty() ? 0
                                                             : lease->lookup.lease_deadline_unix_ms;
}

int oscarkv_release(oscarkv_client* client, oscarkv_lease* lease) {
  std::unique_ptr<oscarkv_lease> owned(lease);
  if (lease == nullptr) return Ok();
  if (client == nullptr) return Fail(OSCARKV_E_INVALID_ARGUMENT, "client is NULL");
  if (lease->lookup.lease_ids.empty()) return Ok();
  absl::Status s = client->client->Release(lease->lookup);
  return s.ok() ? Ok() : Fail(s);
}

int oscarkv_store(oscarkv_client* client, const oscarkv_codec* codec, const oscarkv_page* pages,
                  size_t n_pages, oscarkv_store_result* result, int* page_codes) {
  if (client == nullptr || result == nullptr || (pages == nullptr && n_pages > 0)) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  *result = {0, 0, static_cast<uint32_t>(n_pages), OSCARKV_OK};
  auto whole_call_failed = [&](const absl::Status& s) {
    result->first_error = static_cast<int>(s.code());
    if (page_codes != nullptr) std::fill(page_codes, page_codes + n_pages, result->first_error);
    return Fail(s);
  };
  auto c = FindCodec(client, codec);
  if (!c.ok()) return whole_call_failed(c.status());
  std::vector<oscarkv::client::PageWrite> writes(n_pages);
  for (size_t i = 0; i < n_pages; ++i) {
    if (pages[i].key == nullptr || (pages[i].data == nullptr && pages[i].bytes > 0)) {
      return whole_call_failed(absl::InvalidArgumentError(
          absl::StrCat("page ", i, " has a NULL key or data; nothing was stored")));
    }
    if (pages[i].kind != OSCARKV_PAGE_INT2 && pages[i].kind != OSCARKV_PAGE_BF16) {
      return whole_call_failed(absl::InvalidArgumentError(absl::StrCat(
          "page ", i, ": kind must be OSCARKV_PAGE_INT2 or _BF16; nothing was stored")));
    }
    std::memcpy(writes[i].key.bytes.data(), pages[i].key, 16);
    writes[i].kind = static_cast<PageKind>(pages[i].kind);
    writes[i].bytes = {static_cast<const uint8_t*>(pages[i].data), pages[i].bytes};
  }
  auto r = client->client->Store(*c, writes);
  if (!r.ok()) return whole_call_failed(r.status());
  *result = {r->stored, r->deduplicated, r->failed, OSCARKV_OK};
  size_t first_failed = n_pages;
  for (size_t i = 0; i < r->item_status.size() && i < n_pages; ++i) {
    const absl::Status& s = r->item_status[i];
    if (page_codes != nullptr) page_codes[i] = static_cast<int>(s.code());
    if (!s.ok() && !absl::IsAlreadyExists(s) && first_failed == n_pages) first_failed = i;
  }
  if (first_failed == n_pages) return Ok();
  const absl::Status& s = r->item_status[first_failed];
  result->first_error = static_cast<int>(s.code());
  return Fail(absl::Status(s.code(), absl::StrCat(r->failed, " of ", n_pages,
                                                  " pages not stored; first: page ",
                                                  first_failed, ": ", s.message())));
}

int oscarkv_delete(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                   size_t n_keys, int* key_codes, uint32_t* deleted) {
  if (client == nullptr || (keys == nullptr && n_keys > 0)) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  if (deleted != nullptr) *deleted = 0;
  auto c = FindCodec(client, codec);
  if (!c.ok()) return Fail(c.status());
  auto r = client->client->Delete(*c, Keys(keys, n_keys));
  if (!r.ok()) return Fail(r.status());
  uint32_t removed = 0;
  size_t first_failed = n_keys;
  for (size_t i = 0; i < r->size() && i < n_keys; ++i) {
    const absl::Status& s = (*r)[i];
    if (key_codes != nullptr) key_codes[i] = static_cast<int>(s.code());
    if (s.ok() || absl::IsFailedPrecondition(s)) {
      ++removed;
    } else if (!absl::IsNotFound(s) && first_failed == n_keys) {
      first_failed = i;
    }
  }
  if (deleted != nullptr) *deleted = removed;
  if (first_failed == n_keys) return Ok();
  const absl::Status& s = (*r)[first_failed];
  return Fail(absl::Status(s.code(), absl::StrCat("key ", first_failed, ": ", s.message())));
}

int oscarkv_load(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                 size_t n_keys, void* const* dst, const size_t* dst_bytes, uint32_t* matched,
                 uint64_t* page_bytes) {
  if (client == nullptr || matched == nullptr ||
      (n_keys > 0 && (keys == nullptr || dst == nullptr || dst_bytes == nullptr))) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  auto c = FindCodec(client, codec);
  if (!c.ok()) return Fail(c.status());
  std::vector<std::span<uint8_t>> bufs(n_keys);
  for (size_t i = 0; i < n_keys; ++i) bufs[i] = {static_cast<uint8_t*>(dst[i]), dst_bytes[i]};
  std::vector<uint64_t> sizes;
  auto r = client->client->LoadInto(*c, Keys(keys, n_keys), bufs, &sizes);
  if (!r.ok()) return Fail(r.status());
  *matched = *r;
  if (page_bytes != nullptr) std::copy(sizes.begin(), sizes.end(), page_bytes);
  return Ok();
}

int oscarkv_load_async(oscarkv_client* client, const oscarkv_codec* codec, const uint8_t* keys,
                       size_t n_keys, void* const* dst, const size_t* dst_bytes,
                       oscarkv_load_done done, void* user) {
  if (client == nullptr || done == nullptr ||
      (n_keys > 0 && (keys == nullptr || dst == nullptr || dst_bytes == nullptr))) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  auto c = FindCodec(client, codec);
  if (!c.ok()) return Fail(c.status());
  struct State {
    Codec codec;
    std::vector<BlockKey> keys;
    std::vector<std::span<uint8_t>> bufs;
  };
  auto st = std::make_shared<State>();
  st->codec = *std::move(c);
  st->keys = Keys(keys, n_keys);
  st->bufs.resize(n_keys);
  for (size_t i = 0; i < n_keys; ++i) st->bufs[i] = {static_cast<uint8_t*>(dst[i]), dst_bytes[i]};
  client->client->LoadIntoAsync(st->codec, st->keys, st->bufs,
                                [st, done, user](absl::StatusOr<uint32_t> r) {
                                  if (r.ok()) {
                                    Ok();
                                    done(user, OSCARKV_OK, *r);
                                  } else {
                                    done(user, Fail(r.status()), 0);
                                  }
                                });
  return Ok();
}

int oscarkv_stats_get(oscarkv_client* client, oscarkv_stats* out) {
  if (client == nullptr || out == nullptr) return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  auto s = client->client->GetStats();
  if (!s.ok()) return Fail(s.status());
  *out = {s->pool_bytes, s->pool_used_bytes, s->pages, s->pinned_pages, s->leases,
          s->lookups,    s->hits,            s->misses, s->evictions};
  return Ok();
}

}  // extern "C"
