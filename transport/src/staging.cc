#include "oscarkv/transport/staging.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace oscarkv::transport {

absl::StatusOr<std::unique_ptr<StagingBuffer>> StagingBuffer::Create(Context& context,
                                                                     size_t bounce_bytes) {
  if (bounce_bytes < 8192) {
    return absl::InvalidArgumentError("StagingBuffer: bounce buffer must be at least 8 KiB");
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region = context.Allocate(bounce_bytes);
  if (!region.ok()) return region.status();
  return std::unique_ptr<StagingBuffer>(new StagingBuffer(std::move(*region)));
}

absl::StatusOr<std::vector<std::vector<StagingBuffer::Piece>>> StagingBuffer::Chunk(
    const RemoteMemory& remote, std::span<const TransferDesc> descs) const {
  const size_t half = region_->length() / 2;
  std::vector<std::vector<Piece>> chunks(1);
  size_t used = 0;
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferDesc& d = descs[i];
    if (d.local == nullptr || d.length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("staged op ", i, " is empty"));
    }
    if (!remote.Contains(d.remote, d.length)) {
      return absl::InvalidArgumentError(
          absl::StrCat("staged op ", i, " remote range is outside the remote region"));
    }
    for (size_t off = 0; off < d.length;) {
      if (used == half) {
        chunks.emplace_back();
        used = 0;
      }
      const size_t n = std::min(d.length - off, half - used);
      chunks.back().push_back({static_cast<uint8_t*>(d.local) + off, d.remote + off, n});
      used += n;
      off += n;
    }
  }
  if (chunks.back().empty()) chunks.pop_back();
  return chunks;
}

absl::Status StagingBuffer::Get(Endpoint& ep, const RemoteMemory& remote,
                                std::span<const TransferDesc> descs, const StageCopyFn& to_staged,
                                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::vector<std::vector<Piece>>> chunks = Chunk(remote, descs);
  if (!chunks.ok()) return chunks.status();
  const size_t half = region_->length() / 2;
  // Posts chunk c into bounce half c % 2.
  auto post = [&](size_t c) -> absl::StatusOr<std::unique_ptr<Transfer>> {
    std::vector<TransferDesc> rma;
    uint8_t* at = region_->base() + (c % 2) * half;
    for (const Piece& p : (*chunks)[c]) {
      rma.push_back({at, p.remote, p.length});
      at += p.length;
    }
    return ep.Post(Direction::kGet, *region_, remote, rma);
  };
  absl::StatusOr<std::unique_ptr<Transfer>> current = post(0);
  for (size_t c = 0; c < chunks->size(); ++c) {
    if (!current.ok()) return current.status();
    if (absl::Status s = (*current)->Wait(deadline - absl::Now()); !s.ok()) return s;
    current->reset();
    // Fetch the next chunk into the other half while this one is copied out.
    if (c + 1 < chunks->size()) current = post(c + 1);
    const uint8_t* at = region_->base() + (c % 2) * half;
    for (const Piece& p : (*chunks)[c]) {
      if (absl::Status s = to_staged(p.staged, at, p.length); !s.ok()) return s;
      at += p.length;
    }
  }
  return absl::OkStatus();
}

absl::Status StagingBuffer::Put(Endpoint& ep, const RemoteMemory& remote,
                                std::span<const TransferDesc> descs,
                                const StageCopyFn& from_staged, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::vector<std::vector<Piece>>> chunks = Chunk(remote, descs);
  if (!chunks.ok()) return chunks.status();
  const size_t half = region_->length() / 2;
  std::unique_ptr<Transfer> in_flight;
  for (size_t c = 0; c < chunks->size(); ++c) {
    // Fill half c % 2 (the put of the previous chunk, in the other half, is still running).
    uint8_t* at = region_->base() + (c % 2) * half;
    std::vector<TransferDesc> rma;
    for (const Piece& p : (*chunks)[c]) {
      if (absl::Status s = from_staged(at, p.staged, p.length); !s.ok()) return s;
      rma.push_back({at, p.remote, p.length});
      at += p.length;
    }
    if (in_flight) {
      if (absl::Status s = in_flight->Wait(deadline - absl::Now()); !s.ok()) return s;
      in_flight.reset();
    }
    absl::StatusOr<std::unique_ptr<Transfer>> t = ep.Post(Direction::kPut, *region_, remote, rma);
    if (!t.ok()) return t.status();
    in_flight = std::move(*t);
  }
  if (in_flight) return in_flight->Wait(deadline - absl::Now());
  return absl::OkStatus();
}

}  // namespace oscarkv::transport
