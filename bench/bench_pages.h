// Pages for the benchmarks: real pages made by the page writer (EncodePage) from seeded random
// K/V rows, so what a benchmark moves, stores or looks up is what an engine would. Benchmarks
// only: tests have their own generators beside them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"

namespace oscarkv::bench {

// 1 layer, 1 KV head, head_dim 64, group 32, 16-token pages: a few-hundred-byte INT2 page, for
// control-plane load where page size does not matter.
CodecProfile TinyBenchProfile(const std::string& model_id);

// Fills `count` consecutive page slots of `dst` (each GeometryFor(p, kind).page_bytes()) with
// whole valid pages of `kind`: `distinct` pages encoded from normal(0, 1) rows drawn from `seed`,
// then repeated. InvalidArgument if `dst` is too small or distinct is 0.
absl::Status FillWithPages(const CodecProfile& p, PageKind kind, std::span<uint8_t> dst,
                           size_t count, size_t distinct, uint32_t seed);

}  // namespace oscarkv::bench
