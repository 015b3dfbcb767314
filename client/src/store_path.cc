#include "store_path.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/page_checksum.h"
#include "oscarkv/proto/codec_convert.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/v1/local_control.h"
#include "rpc_core.h"
#include "shm_mapping.h"
#include "shm_staging.h"

namespace oscarkv::client {
namespace {

namespace pb = ::oscarkv::v1;
namespace local = ::oscarkv::v1::local;

absl::Status FromItem(const pb::ItemStatus& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()), s.message());
}

std::string KeyBytes(const BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}
std::string IdBytes(const CodecId& id) {
  return std::string(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
}

class StoreCall {
 public:
  explicit StoreCall(const StoreTarget& t) : t_(t) {}

  // Size, header, codec id, shape and (optionally) checksum of one page of `codec`.
  static absl::Status CheckPage(const Codec& codec, PageKind kind, std::span<const uint8_t> page,
                                bool checksum) {
    const uint64_t want = codec.page_bytes(kind);
    if (page.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat("page is ", page.size(), " bytes; a ",
                                                     PageKindName(kind), " page of codec ",
                                                     codec.id.Hex(), " is ", want));
    }
    OSCARKV_ASSIGN_OR_RETURN(PageHeader h, ParsePageHeader(page, codec.profile, checksum));
    if (h.kind != static_cast<uint8_t>(kind)) {
      return absl::InvalidArgumentError(absl::StrCat("page header says kind ", int{h.kind},
                                                     ", stored as ", PageKindName(kind)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<StoreResult> Run(const Codec& codec, std::span<const PageWrite> pages) {
    StoreResult out;
    out.item_status.assign(pages.size(), absl::OkStatus());
    // Client-side checks first, so a bad page never takes a pool slot.
    std::vector<size_t> valid;
    valid.reserve(pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
      absl::Status s = CheckPage(codec, pages[i].kind, pages[i].bytes, /*checksum=*/false);
      if (s.ok()) {
        valid.push_back(i);
      } else {
        out.item_status[i] = s;
      }
    }
    // Keys another reservation holds uncommitted (ABORTED: in progress) are asked again with a
    // short backoff until that one commits (then they are deduplicated), fails or the wait
    // runs out (then they are reported as not stored, with the daemon's ABORTED).
    const auto give_up = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(std::clamp<int64_t>(
                             t_.options.store_in_progress_wait_ms, 0, t_.options.rpc_timeout_ms));
    auto backoff = std::chrono::microseconds(500);
    std::vector<size_t> todo = std::move(valid);
    while (true) {
      for (size_t begin = 0; begin < todo.size(); begin += t_.max_batch) {
        const size_t n = std::min<size_t>(t_.max_batch, todo.size() - begin);
        OSCARKV_RETURN_IF_ERROR(StoreChunk(
            codec, pages, std::span<const size_t>(todo).subspan(begin, n), &out.item_status));
      }
      std::vector<size_t> busy;
      for (size_t i : todo) {
        if (absl::IsAborted(out.item_status[i])) busy.push_back(i);
      }
      const auto now = std::chrono::steady_clock::now();
      if (busy.empty() || now >= give_up) break;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(backoff,
                                                                               give_up - now));
      backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
      todo = std::move(busy);
    }
    for (const absl::Status& s : out.item_status) {
      if (s.ok()) {
        ++out.stored;
      } else if (absl::IsAlreadyExists(s)) {
        ++out.deduplicated;
      } else {
        ++out.failed;
      }
    }
    return out;
  }


  // Reserve + write + commit for the pages `idx` of `pages` (at most max_batch). Every page of
  // `idx` ends with its status set: OK (committed by this call), ALREADY_EXISTS (committed
  // before), ABORTED (reserved by a reservation that has not committed it: in progress), or why
  // it was not stored. Whatever this call reserved and did not commit is aborted before it
  // returns, so a failed page never leaves a reservation behind that a later Store of the key
  // would trip over.
  absl::Status StoreChunk(const Codec& codec, std::span<const PageWrite> pages,
                          std::span<const size_t> idx, std::vector<absl::Status>* status) {
    pb::ReserveRequest req;
    req.set_codec_id(IdBytes(codec.id));
    for (size_t i : idx) {
      auto* item = req.add_items();
      item->set_key(KeyBytes(pages[i].key));
      item->set_kind(proto::ToProto(pages[i].kind));
    }
    uint64_t reservation = 0;
    std::vector<size_t> reserved;  // indexes into `pages`
    std::vector<pb::PageRef> slots;
    auto admit = [&](const pb::ReserveResponse& resp) -> absl::StatusOr<std::vector<size_t>> {
      reservation = resp.reservation_id();
      absl::Status s = Admit(resp, pages, idx, status, &reserved, &slots);
      if (!s.ok()) {
        if (reservation != 0) AbortReservation(reservation);
        return s;
      }
      if (reserved.empty() && reservation != 0) AbortReservation(reservation);
      return reserved;
    };
    if (t_.staging != nullptr && t_.local_reserve && idx.size() <= local::kMaxReserveItems) {
      // Same host: Reserve on the staging connection, the first pages copied into staging
      // while the daemon answers, then staged (copied, hashed and committed by the daemon).
      std::vector<bool> committed;
      OSCARKV_RETURN_IF_ERROR(
          t_.staging->ReserveAndStage(req, pages, idx, admit, status, &committed));
      if (reserved.empty()) return absl::OkStatus();
      std::vector<size_t> to_commit;
      size_t staged_committed = 0;
      for (size_t i : reserved) {
        if (committed[i]) {
          ++staged_committed;
        } else if ((*status)[i].ok()) {
          to_commit.push_back(i);
        }
      }
      return CommitRest(reservation, pages, reserved, to_commit, staged_committed, status);
    }
    pb::ReserveResponse resp;
    {
      auto ctx = t_.rpc.Context();
      OSCARKV_RETURN_IF_ERROR(FromGrpc(t_.rpc.stub().Reserve(ctx.get(), req, &resp), "Reserve"));
    }
    OSCARKV_RETURN_IF_ERROR(admit(resp).status());
    if (reserved.empty()) return absl::OkStatus();
    // Over shared memory each page is copied into its slot and hashed in the same pass; a page
    // whose bytes do not match its checksum is not committed (DATA_LOSS to this caller).
    std::vector<size_t> to_commit;
    size_t staged_committed = 0;  // committed by the daemon with their last staged chunk
    if (t_.staging != nullptr) {
      // Isolated: the daemon copies each page out of the staging region and hashes what it
      // copied; only the pages it confirmed are committed.
      // The daemon commits each page with its last chunk; only pages it verified but did not
      // commit (an older daemon) take the Commit RPC.
      std::vector<bool> committed;
      (void)t_.staging->StagePages(reservation, pages, reserved, status, &committed);
      for (size_t i : reserved) {
        if (committed[i]) {
          ++staged_committed;
        } else if ((*status)[i].ok()) {
          to_commit.push_back(i);
        }
      }
    } else if (t_.shm != nullptr) {
      for (size_t j = 0; j < reserved.size(); ++j) {
        absl::Status w = WriteShmVerified(pages[reserved[j]].bytes, slots[j]);
        if (w.ok()) {
          to_commit.push_back(reserved[j]);
        } else {
          (*status)[reserved[j]] = w;
        }
      }
    } else {
      absl::Status written = WriteStream(reservation, pages, reserved);
      if (written.ok()) {
        to_commit = reserved;
      } else {
        for (size_t i : reserved) (*status)[i] = written;
      }
    }
    return CommitRest(reservation, pages, reserved, to_commit, staged_committed, status);
  }

  // Of `reserved` (reservation `reservation`): `staged_committed` pages the daemon committed
  // with their last staged chunk, `to_commit` pages written and ready. Commits those, then
  // aborts whatever of the reservation is not committed.
  absl::Status CommitRest(uint64_t reservation, std::span<const PageWrite> pages,
                          const std::vector<size_t>& reserved,
                          const std::vector<size_t>& to_commit, size_t staged_committed,
                          std::vector<absl::Status>* status) {
    if (to_commit.empty()) {
      // Aborting releases only what is not committed; committed pages stay.
      if (staged_committed < reserved.size()) AbortReservation(reservation);
      return absl::OkStatus();
    }
    pb::CommitRequest commit;
    commit.set_reservation_id(reservation);
    for (size_t i : to_commit) commit.add_keys(KeyBytes(pages[i].key));
    // Trusted shared memory: pages were hashed here over the slot's bytes, and the daemon
    // checks their headers without a second pass. Staged pages the daemon hashed itself;
    // streamed pages it verifies at Commit.
    commit.set_checksums_verified(t_.shm != nullptr && t_.staging == nullptr);
    pb::CommitResponse cresp;
    grpc::Status gs;
    {
      auto ctx = t_.rpc.Context();
      gs = t_.rpc.stub().Commit(ctx.get(), commit, &cresp);
    }
    bool all_committed = to_commit.size() + staged_committed == reserved.size();
    if (!gs.ok()) {
      for (size_t i : to_commit) (*status)[i] = FromGrpc(gs, "Commit");
      all_committed = false;
    } else if (static_cast<size_t>(cresp.results_size()) != to_commit.size()) {
      for (size_t i : to_commit) {
        (*status)[i] = absl::InternalError("Commit: daemon returned a result count != key count");
      }
      all_committed = false;
    } else {
      for (size_t j = 0; j < to_commit.size(); ++j) {
        absl::Status s = FromItem(cresp.results(static_cast<int>(j)));
        all_committed &= s.ok();
        (*status)[to_commit[j]] = std::move(s);
      }
    }
    // Aborting releases only what is not committed; committed pages stay.
    if (!all_committed) AbortReservation(reservation);
    return absl::OkStatus();
  }

  // The pages of `idx` that `resp` reserved go to `reserved` (their slots to `slots`); every
  // other page of `idx` gets its status. INTERNAL when the answer does not match the request.
  static absl::Status Admit(const pb::ReserveResponse& resp, std::span<const PageWrite> pages,
                            std::span<const size_t> idx, std::vector<absl::Status>* status,
                            std::vector<size_t>* reserved, std::vector<pb::PageRef>* slots) {
    if (static_cast<size_t>(resp.results_size()) != idx.size()) {
      return absl::InternalError("Reserve: daemon returned a result count != item count");
    }
    for (size_t j = 0; j < idx.size(); ++j) {
      const auto& r = resp.results(static_cast<int>(j));
      if (r.status().code() != 0) {
        (*status)[idx[j]] = FromItem(r.status());
        continue;
      }
      if (r.slot().bytes() != pages[idx[j]].bytes.size()) {
        (*status)[idx[j]] = absl::InternalError(absl::StrCat(
            "daemon reserved a ", r.slot().bytes(), "-byte slot for a ",
            pages[idx[j]].bytes.size(), "-byte page"));
        continue;  // left uncommitted: aborted by the caller
      }
      reserved->push_back(idx[j]);
      slots->push_back(r.slot());
    }
    return absl::OkStatus();
  }

  void AbortReservation(uint64_t id) {
    pb::AbortRequest req;
    req.set_reservation_id(id);
    pb::AbortResponse resp;
    auto ctx = t_.rpc.Context();
    t_.rpc.stub().Abort(ctx.get(), req, &resp);  // best effort: reservations expire anyway
  }

  // Copies one page into its reserved pool slot, hashing it as it goes (one pass); DATA_LOSS
  // when the bytes in the slot do not match the page's checksum.
  absl::Status WriteShmVerified(std::span<const uint8_t> src, const pb::PageRef& slot) {
    if (!t_.shm->Contains(slot.offset(), src.size())) {
      return absl::InternalError("daemon reserved a slot outside its shared-memory segment");
    }
    return CopyPageVerified(std::span<uint8_t>(t_.shm->data() + slot.offset(), src.size()), src);
  }

  absl::Status WriteStream(uint64_t reservation_id, std::span<const PageWrite> pages,
                           const std::vector<size_t>& reserved) {
    auto ctx = t_.rpc.Context();
    pb::WriteResponse resp;
    auto writer = t_.rpc.stub().WritePages(ctx.get(), &resp);
    const size_t chunk = std::max<uint32_t>(t_.options.stream_chunk_bytes, 4096);
    pb::WriteChunk msg;
    bool open = true;  // false once the stream broke; Finish() says why
    for (size_t i = 0; open && i < reserved.size(); ++i) {
      const auto& src = pages[reserved[i]].bytes;
      for (size_t off = 0; open && off < src.size(); off += chunk) {
        msg.set_reservation_id(reservation_id);
        msg.set_key(KeyBytes(pages[reserved[i]].key));
        msg.set_offset(off);
        msg.set_data(src.data() + off, std::min(chunk, src.size() - off));
        open = writer->Write(msg);
      }
    }
    if (open) writer->WritesDone();
    return FromGrpc(writer->Finish(), "WritePages");
  }

 private:
  const StoreTarget& t_;
};

}  // namespace

absl::StatusOr<StoreResult> StorePages(const StoreTarget& target, const Codec& codec,
                                       std::span<const PageWrite> pages) {
  return StoreCall(target).Run(codec, pages);
}

}  // namespace oscarkv::client
