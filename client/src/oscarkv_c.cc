// The C ABI (oscarkv_c.h) over oscarkv::client::Client.
#include "oscarkv/client/oscarkv_c.h"

#include <cstring>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/client/client.h"

using oscarkv::BlockKey;
using oscarkv::CodecProfile;
using oscarkv::PageKind;
using oscarkv::client::Client;
using oscarkv::client::Codec;

struct oscarkv_client {
  std::unique_ptr<Client> client;
  absl::Mutex mu;
  // Registered codecs by id: the C side passes only the id, the client needs the profile.
  absl::flat_hash_map<std::string, Codec> codecs ABSL_GUARDED_BY(mu);
};

namespace {

thread_local std::string last_error;

int Fail(const absl::Status& s) {
  last_error = std::string(s.message());
  return static_cast<int>(s.code());
}
int Fail(int code, const char* message) {
  last_error = message;
  return code;
}
int Ok() {
  last_error.clear();
  return OSCARKV_OK;
}

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

const char* oscarkv_last_error(void) { return last_error.c_str(); }

void oscarkv_connect_options_init(oscarkv_connect_options* opts) {
  if (opts == nullptr) return;
  *opts = {};
  opts->data_path = OSCARKV_PATH_AUTO;
  opts->verify_checksums = 1;
  opts->rpc_timeout_ms = 10000;
  opts->lookup_path = OSCARKV_LOOKUP_AUTO;
}

int oscarkv_connect(const oscarkv_connect_options* opts, oscarkv_client** out) {
  if (out == nullptr) return Fail(OSCARKV_E_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  oscarkv::client::ConnectOptions o;
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
  CodecProfile p;
  p.model_id = profile->model_id ? profile->model_id : "";
  p.model_revision = profile->model_revision ? profile->model_revision : "";
  p.num_layers = profile->num_layers;
  p.num_kv_heads = profile->num_kv_heads;
  p.tp_rank = profile->tp_rank;
  p.tp_size = profile->tp_size;
  p.head_dim = profile->head_dim;
  p.page_tokens = profile->page_tokens;
  p.group_size = profile->group_size;
  p.scale_dtype = static_cast<oscarkv::ScaleDtype>(profile->scale_dtype);
  p.sink_tokens = profile->sink_tokens;
  p.recent_tokens = profile->recent_tokens;
  std::memcpy(p.rotation_digest.data(), profile->rotation_digest, 32);
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

int oscarkv_store(oscarkv_client* client, const oscarkv_codec* codec, const oscarkv_page* pages,
                  size_t n_pages, oscarkv_store_result* result) {
  if (client == nullptr || result == nullptr || (pages == nullptr && n_pages > 0)) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "NULL argument");
  }
  auto c = FindCodec(client, codec);
  if (!c.ok()) return Fail(c.status());
  std::vector<oscarkv::client::PageWrite> writes(n_pages);
  for (size_t i = 0; i < n_pages; ++i) {
    if (pages[i].key == nullptr || (pages[i].data == nullptr && pages[i].bytes > 0)) {
      return Fail(OSCARKV_E_INVALID_ARGUMENT, "page with a NULL key or data");
    }
    if (pages[i].kind != OSCARKV_PAGE_INT2 && pages[i].kind != OSCARKV_PAGE_BF16) {
      return Fail(OSCARKV_E_INVALID_ARGUMENT, "page kind must be OSCARKV_PAGE_INT2 or _BF16");
    }
    std::memcpy(writes[i].key.bytes.data(), pages[i].key, 16);
    writes[i].kind = static_cast<PageKind>(pages[i].kind);
    writes[i].bytes = {static_cast<const uint8_t*>(pages[i].data), pages[i].bytes};
  }
  auto r = client->client->Store(*c, writes);
  if (!r.ok()) return Fail(r.status());
  *result = {r->stored, r->deduplicated, r->failed, OSCARKV_OK};
  for (const auto& s : r->item_status) {
    if (!s.ok() && !absl::IsAlreadyExists(s)) {
      result->first_error = static_cast<int>(s.code());
      last_error = std::string(s.message());
      return OSCARKV_OK;  // the call worked; per-page failures are in the result
    }
  }
  return Ok();
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
