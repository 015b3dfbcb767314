#include "cache_wire.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oscarkv/proto/codec_convert.h"

namespace oscarkv::service::wire {

static_assert(kWireVersion == pb::WIRE_VERSION_1, "cache_types.h's kWireVersion is the proto's");

namespace {

absl::Status ParseCodecId(const std::string& bytes, CodecId* id) {
  if (bytes.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec_id must be 16 bytes, got ", bytes.size()));
  }
  std::memcpy(id->bytes.data(), bytes.data(), 16);
  return absl::OkStatus();
}

bool ParseKey(const std::string& bytes, BlockKey* key) {
  if (bytes.size() != 16) return false;
  std::memcpy(key->bytes.data(), bytes.data(), 16);
  return true;
}

absl::Status BadKey(size_t size) {
  return absl::InvalidArgumentError(
      absl::StrCat("key has ", size, " bytes; keys are 16 bytes"));
}

// Every key, or INVALID_ARGUMENT naming the first that is not 16 bytes.
absl::Status ParseAllKeys(const google::protobuf::RepeatedPtrField<std::string>& in,
                          std::vector<BlockKey>* out) {
  out->resize(in.size());
  for (int i = 0; i < in.size(); ++i) {
    if (!ParseKey(in.Get(i), &(*out)[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys[", i, "] has ", in.Get(i).size(), " bytes; keys are 16 bytes"));
    }
  }
  return absl::OkStatus();
}

std::string Bytes(const std::array<uint8_t, 16>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

void SetItem(pb::ItemStatus* st, const absl::Status& s) {
  st->set_code(static_cast<int32_t>(s.code()));
  if (!s.ok()) st->set_message(std::string(s.message()));
}

}  // namespace

void ToWire(const PageRef& ref, pb::PageRef* out) {
  out->set_key(Bytes(ref.key.bytes));
  out->set_offset(ref.offset);
  out->set_bytes(ref.bytes);
  out->set_kind(proto::ToProto(ref.kind));
  out->set_token_count(ref.token_count);
}

absl::Status Handshake(PageCache& cache, const Caller& caller, const pb::HandshakeRequest& req,
                       pb::HandshakeResponse* resp) {
  auto info = cache.Handshake(caller, {req.wire_version()});
  if (!info.ok()) return info.status();
  resp->set_wire_version(info->wire_version);
  resp->set_server_version(info->server_version);
  resp->set_node_id(info->node_id);
  resp->set_shm_path(info->shm_path);
  resp->set_shm_bytes(info->shm_bytes);
  resp->set_shm_isolated(info->shm_isolated);
  resp->set_max_batch(info->max_batch);
  return absl::OkStatus();
}

absl::Status RegisterCodec(PageCache& cache, const Caller& caller,
                           const pb::RegisterCodecRequest& req, pb::RegisterCodecResponse* resp) {
  auto profile = proto::FromProto(req.profile());
  if (!profile.ok()) return profile.status();
  auto reg = cache.RegisterCodec(caller, *profile);
  if (!reg.ok()) return reg.status();
  resp->set_codec_id(Bytes(reg->id.bytes));
  resp->set_int2_page_bytes(reg->int2_page_bytes);
  resp->set_bf16_page_bytes(reg->bf16_page_bytes);
  return absl::OkStatus();
}

absl::Status Lookup(PageCache& cache, const Caller& caller, const pb::LookupRequest& req,
                    pb::LookupResponse* resp) {
  // Per-thread scratch: Lookup is the hot call, and both front ends run it on long-lived
  // threads, so after warm-up this translation allocates nothing.
  thread_local std::vector<BlockKey> keys;
  thread_local LookupResult result;
  LookupQuery q;
  if (absl::Status s = ParseCodecId(req.codec_id(), &q.codec); !s.ok()) return s;
  if (absl::Status s = cache.CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  if (absl::Status s = ParseAllKeys(req.keys(), &keys); !s.ok()) return s;
  q.keys = keys;
  q.pin = req.pin();
  q.lease_ms = req.lease_ms();
  if (absl::Status s = cache.LookupInto(caller, q, &result); !s.ok()) return s;
  resp->set_matched(result.matched);
  resp->set_lease_id(result.lease_id);
  resp->set_lease_deadline_unix_ms(result.lease_deadline_unix_ms);
  for (const PageRef& ref : result.pages) ToWire(ref, resp->add_pages());
  return absl::OkStatus();
}

absl::Status Reserve(PageCache& cache, const Caller& caller, const pb::ReserveRequest& req,
                     pb::ReserveResponse* resp) {
  ReserveArgs args;
  if (absl::Status s = ParseCodecId(req.codec_id(), &args.codec); !s.ok()) return s;
  if (absl::Status s = cache.CheckBatch(req.items_size(), "items"); !s.ok()) return s;
  args.ttl_ms = req.ttl_ms();
  // Items the wire got wrong are answered here; the rest go to the cache, in order.
  std::vector<absl::Status> wire_error(req.items_size());
  args.items.reserve(req.items_size());
  for (int i = 0; i < req.items_size(); ++i) {
    const pb::ReserveItem& item = req.items(i);
    ReserveItem ri;
    if (!ParseKey(item.key(), &ri.key)) {
      wire_error[i] = BadKey(item.key().size());
      continue;
    }
    if (item.kind() != pb::PAGE_KIND_INT2 && item.kind() != pb::PAGE_KIND_BF16) {
      wire_error[i] = absl::InvalidArgumentError(absl::StrCat(
          "page kind ", static_cast<int>(item.kind()), " is not INT2 (1) or BF16 (2)"));
      continue;
    }
    ri.kind = *proto::FromProto(item.kind());
    args.items.push_back(ri);
  }
  auto result = cache.Reserve(caller, args);
  if (!result.ok()) return result.status();
  size_t next = 0;
  for (int i = 0; i < req.items_size(); ++i) {
    pb::ReserveResult* out = resp->add_results();
    if (!wire_error[i].ok()) {
      SetItem(out->mutable_status(), wire_error[i]);
      continue;
    }
    const ReserveItemResult& r = result->items[next++];
    SetItem(out->mutable_status(), r.status);
    if (r.status.ok()) {
      pb::PageRef* slot = out->mutable_slot();
      slot->set_key(req.items(i).key());
      slot->set_offset(r.slot.offset);
      slot->set_bytes(r.slot.bytes);
      slot->set_kind(req.items(i).kind());
    }
  }
  resp->set_reservation_id(result->reservation_id);
  return absl::OkStatus();
}

absl::Status Commit(PageCache& cache, const Caller& caller, const pb::CommitRequest& req,
                    pb::CommitResponse* resp) {
  CommitArgs args;
  args.reservation_id = req.reservation_id();
  args.checksums_verified = req.checksums_verified();
  args.all_items = req.keys_size() == 0;
  std::vector<absl::Status> wire_error;
  if (!args.all_items) {
    if (absl::Status s = cache.CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
    wire_error.resize(req.keys_size());
    args.keys.reserve(req.keys_size());
    for (int i = 0; i < req.keys_size(); ++i) {
      BlockKey key;
      if (!ParseKey(req.keys(i), &key)) {
        wire_error[i] = BadKey(req.keys(i).size());
        cache.mutable_counters().commit_failures.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      args.keys.push_back(key);
    }
  }
  auto results = cache.Commit(caller, args);
  if (!results.ok()) return results.status();
  if (args.all_items) {
    for (const absl::Status& s : *results) SetItem(resp->add_results(), s);
    return absl::OkStatus();
  }
  size_t next = 0;
  for (int i = 0; i < req.keys_size(); ++i) {
    SetItem(resp->add_results(), wire_error[i].ok() ? (*results)[next++] : wire_error[i]);
  }
  return absl::OkStatus();
}

absl::Status Abort(PageCache& cache, const Caller& caller, const pb::AbortRequest& req,
                   pb::AbortResponse*) {
  return cache.Abort(caller, req.reservation_id());
}

absl::StatusOr<uint64_t> WriteChunk(PageCache& cache, const Caller& caller,
                                    const pb::WriteChunk& chunk) {
  WriteChunkArgs args;
  if (!ParseKey(chunk.key(), &args.key)) return BadKey(chunk.key().size());
  args.reservation_id = chunk.reservation_id();
  args.offset = chunk.offset();
  args.data = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(chunk.data().data()),
                                       chunk.data().size());
  return cache.WriteChunk(caller, args);
}

absl::StatusOr<std::unique_ptr<ReadPlan>> PrepareRead(PageCache& cache, const Caller& caller,
                                                      const pb::ReadRequest& req) {
  if (absl::Status s = cache.CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  ReadArgs args;
  args.lease_id = req.lease_id();
  args.keys.resize(req.keys_size());
  for (int i = 0; i < req.keys_size(); ++i) {
    if (!ParseKey(req.keys(i), &args.keys[i])) return BadKey(req.keys(i).size());
  }
  return cache.PrepareRead(caller, args);
}

absl::Status Release(PageCache& cache, const Caller& caller, const pb::ReleaseRequest& req,
                     pb::ReleaseResponse*) {
  return cache.Release(caller, req.lease_id());
}

absl::Status RenewLease(PageCache& cache, const Caller& caller, const pb::RenewLeaseRequest& req,
                        pb::RenewLeaseResponse* resp) {
  auto deadline = cache.RenewLease(caller, {req.lease_id(), req.lease_ms()});
  if (!deadline.ok()) return deadline.status();
  resp->set_lease_deadline_unix_ms(*deadline);
  return absl::OkStatus();
}

absl::Status Delete(PageCache& cache, const Caller& caller, const pb::DeleteRequest& req,
                    pb::DeleteResponse* resp) {
  DeleteArgs args;
  if (absl::Status s = ParseCodecId(req.codec_id(), &args.codec); !s.ok()) return s;
  if (absl::Status s = cache.CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  std::vector<absl::Status> wire_error(req.keys_size());
  args.keys.reserve(req.keys_size());
  for (int i = 0; i < req.keys_size(); ++i) {
    BlockKey key;
    if (!ParseKey(req.keys(i), &key)) {
      wire_error[i] = BadKey(req.keys(i).size());
      continue;
    }
    args.keys.push_back(key);
  }
  auto results = cache.Delete(caller, args);
  if (!results.ok()) return results.status();
  size_t next = 0;
  for (int i = 0; i < req.keys_size(); ++i) {
    SetItem(resp->add_results(), wire_error[i].ok() ? (*results)[next++] : wire_error[i]);
  }
  return absl::OkStatus();
}

absl::Status Clear(PageCache& cache, const Caller& caller, const pb::ClearRequest& req,
                   pb::ClearResponse* resp) {
  ClearArgs args;
  args.include_pinned = req.include_pinned();
  if (!req.codec_id().empty()) {
    CodecId id;
    if (absl::Status s = ParseCodecId(req.codec_id(), &id); !s.ok()) return s;
    args.codec = id;
  }
  auto removed = cache.Clear(caller, args);
  if (!removed.ok()) return removed.status();
  resp->set_pages_removed(*removed);
  if (req.free_codecs()) {
    auto freed = cache.FreeUnusedCodecs(caller, args.codec);
    if (!freed.ok()) return freed.status();
    resp->set_codecs_freed(*freed);
  }
  return absl::OkStatus();
}

absl::Status UnregisterCodec(PageCache& cache, const Caller& caller,
                             const pb::UnregisterCodecRequest& req,
                             pb::UnregisterCodecResponse* resp) {
  CodecId id;
  if (absl::Status s = ParseCodecId(req.codec_id(), &id); !s.ok()) return s;
  auto r = cache.UnregisterCodec(caller, id, req.drop_pages());
  if (!r.ok()) return r.status();
  resp->set_codecs_unregistered(r->codecs);
  resp->set_pages_removed(r->pages_removed);
  return absl::OkStatus();
}

void ToWire(const CacheStats& st, pb::StatsResponse* out) {
  out->set_pool_bytes(st.pool_bytes);
  out->set_pool_used_bytes(st.pool_used_bytes);
  out->set_pages(st.pages);
  out->set_pinned_pages(st.pinned_pages);
  out->set_leases(st.leases);
  out->set_reservations(st.reservations);
  out->set_lookups(st.lookups);
  out->set_hits(st.hits);
  out->set_misses(st.misses);
  out->set_evictions(st.evictions);
  out->set_bytes_written(st.bytes_written);
  out->set_bytes_read(st.bytes_read);
  out->set_codecs(st.codecs);
  out->set_node_id(st.node_id);
  out->set_server_version(st.server_version);
  out->set_handles(st.handles);
  out->set_tier_capacity_bytes(st.tier_capacity_bytes);
  out->set_tier_bytes(st.tier_bytes);
  out->set_tier_pages(st.tier_pages);
  out->set_tier_demotions(st.tier_demotions);
  out->set_tier_promotions(st.tier_promotions);
  out->set_tier_hits(st.tier_hits);
  out->set_tier_misses(st.tier_misses);
  out->set_tier_demote_drops(st.tier_demote_drops);
  out->set_tier_corruptions(st.tier_corruptions);
  out->set_tier_evictions(st.tier_evictions);
  out->set_tier_queued_bytes(st.tier_queued_bytes);
}

absl::Status Stats(PageCache& cache, const Caller& caller, const pb::StatsRequest&,
                   pb::StatsResponse* resp) {
  auto st = cache.Stats(caller);
  if (!st.ok()) return st.status();
  ToWire(*st, resp);
  return absl::OkStatus();
}

absl::Status PublishHandle(PageCache& cache, const Caller& caller,
                           const pb::PublishHandleRequest& req, pb::PublishHandleResponse* resp) {
  PublishHandleArgs args;
  if (absl::Status s = ParseCodecId(req.codec_id(), &args.codec); !s.ok()) return s;
  if (absl::Status s = cache.CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  if (absl::Status s = ParseAllKeys(req.keys(), &args.keys); !s.ok()) return s;
  args.name = req.handle();
  args.metadata = req.metadata();
  args.ttl_ms = req.ttl_ms();
  auto deadline = cache.PublishHandle(caller, args);
  if (!deadline.ok()) return deadline.status();
  resp->set_deadline_unix_ms(*deadline);
  return absl::OkStatus();
}

absl::Status OpenHandle(PageCache& cache, const Caller& caller, const pb::OpenHandleRequest& req,
                        pb::OpenHandleResponse* resp) {
  auto h = cache.OpenHandle(caller, {req.handle(), req.lease_ms()});
  if (!h.ok()) return h.status();
  resp->set_codec_id(Bytes(h->codec.bytes));
  resp->set_metadata(h->metadata);
  resp->set_handle_deadline_unix_ms(h->handle_deadline_unix_ms);
  for (const PageRef& ref : h->pages) ToWire(ref, resp->add_pages());
  resp->set_lease_id(h->lease_id);
  resp->set_lease_deadline_unix_ms(h->lease_deadline_unix_ms);
  return absl::OkStatus();
}

absl::Status CloseHandle(PageCache& cache, const Caller& caller,
                         const pb::CloseHandleRequest& req, pb::CloseHandleResponse*) {
  return cache.CloseHandle(caller, req.handle());
}

}  // namespace oscarkv::service::wire
