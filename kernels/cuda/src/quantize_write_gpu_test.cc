// GPU tests of quantize-on-write against ReferenceQuantizeWrite (CPU, built from the codec's
// ClipRowAtQuantile / QuantizeRowInt2 / RotateRow):
//   * unrotated rows (the flush, R_V absorbed): page bytes identical, bit for bit, for INT2 and
//     BF16 destinations, groups 128 and 64, clip ratios < 1 and = 1;
//   * rotated rows: the tensor-core rotation differs from RotateRow's summation order (~1e-6
//     relative), so BF16 rows may differ by one bf16 ulp and an INT2 code may move by one step
//     where a value sits on a rounding boundary; we require <= 0.5% of INT2 codes and bf16
//     elements to differ, every dequantized INT2 element within one quantization step of the
//     reference, and fp16 parameters within 4 ulps;
//   * the flush of a BF16 page into an INT2 page, reading the page's own segments;
//   * every case runs every load path (LoadPath::kRound1, the round-1 kernel, checked against the
//     reference as above; every other LoadPath, the wgmma rotation included on sm_90): their
//     written rows must equal the round-1 kernel's byte for byte, into pages poisoned first (so
//     every row is written).
#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/internal/quantize_launch.h"
#include "oscarkv/cuda/reference.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/quantize.h"

namespace oscarkv::cuda {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device: GPU test skipped"

struct WriteCase {
  uint32_t group = 128, kv_heads = 2, layers = 3, first_layer = 1, layer_count = 2;
  uint32_t page_tokens = 64;
  int32_t tokens = 200;
  bool rotate = false;
  bool precise = true;  // QuantizeWriteParams::precise_rotation
  // Rotated by signed permutation matrices instead (exact in any precision: the streaming
  // kernel's bytes must then equal the reference bit for bit).
  bool exact_rotation = false;
  // Rotated writes: allowed fractions of differing INT2 codes and bf16 elements; with `loose`,
  // up to far_group_frac of the groups may also pick another range candidate (a near tie of two
  // candidates' scores; their fp16 parameters and dequantized values then differ by more than
  // the per-element bounds).
  double code_frac = 0.005, bf16_frac = 0.005, far_group_frac = 0.01;
  bool loose = false;
  std::vector<float> clip_values = {0.9f, 1.0f, 0.96f};
  uint32_t seed = 1;
  RangeMode range_mode = RangeMode::kMinMax;
  std::vector<uint8_t> range_modes;  // per (layer, K|V, head), cycled; empty: range_mode
  // Source rows: 0 Gaussian; 1 heavy ties (multiples of 0.5 in [-2, 2]); 2 the largest
  // magnitudes all in channels 0..31 (one lane of the quad holds the row's top values, so the
  // top-8 selection must fall back); 3 constant rows, some holding +-inf (unrotated only).
  int pattern = 0;
  // Real rows instead of random ones: [layer_count][tokens][kv_heads][128] bf16 bits.
  const std::vector<uint16_t>* real_k = nullptr;
  const std::vector<uint16_t>* real_v = nullptr;
};

// Writes of one layer (of a one-layer page).
void OneLayer(WriteCase& c) {
  c.layers = 1;
  c.first_layer = 0;
  c.layer_count = 1;
}
// Rotated writes with R as fp16 only (R to ~2^-12: a bf16 rounding boundary, an INT2 step or a
// range candidate's tie is crossed more often than with hi + lo).
void HiOnlyTolerances(WriteCase& c) {
  c.loose = true;
  c.code_frac = 0.01;
  c.bf16_frac = 0.15;
  c.far_group_frac = 0.05;
}

struct Pages {
  std::vector<std::vector<uint8_t>> host;  // reference output
  std::vector<uint8_t> kinds;
};

void RunWrite(const WriteCase& c) {
  SCOPED_TRACE("G" + std::to_string(c.group) + (c.rotate ? " rotated" : " unrotated") +
               " tokens " + std::to_string(c.tokens) + " range mode " +
               std::to_string(static_cast<int>(c.range_mode)));
  const uint32_t d = 128, H = c.kv_heads;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd;
  // Source rows [layer_count][tokens][H][d] bf16, K and V.
  const size_t n_src = size_t{c.layer_count} * c.tokens * H * d;
  std::vector<uint16_t> ksrc(n_src), vsrc(n_src);
  for (size_t i = 0; i < n_src; ++i) {
    ksrc[i] = FloatToBf16(nd(rng) * 3.0f + (i % 7 == 0 ? 5.0f : 0.0f));
    vsrc[i] = FloatToBf16(nd(rng));
    const size_t ch = i % d, row = i / d;
    if (c.pattern == 1) {
      ksrc[i] = FloatToBf16(0.5f * std::clamp(std::round(2.0f * nd(rng)), -4.0f, 4.0f));
      vsrc[i] = FloatToBf16(0.5f * static_cast<float>(rng() % 3));
    } else if (c.pattern == 2) {
      const float big = ch < 32 ? 8.0f : 1.0f;
      ksrc[i] = FloatToBf16(nd(rng) * big);
      vsrc[i] = FloatToBf16((ch < 32 ? 4.0f + std::fabs(nd(rng)) : nd(rng)) * (row % 2 ? -1.0f : 1.0f));
    } else if (c.pattern == 3) {
      const float v = 0.25f * static_cast<float>(row % 11) - 1.0f;
      const float inf = std::numeric_limits<float>::infinity();
      ksrc[i] = FloatToBf16(row % 5 == 1 && ch == row % d ? (row % 2 ? inf : -inf) : v);
      vsrc[i] = FloatToBf16(row % 7 == 3 && ch % 16 == 0 ? inf : -v);
    }
  }
  if (c.real_k != nullptr) {
    ASSERT_EQ(c.real_k->size(), n_src);
    ksrc = *c.real_k;
    vsrc = *c.real_v;
  }
  // Destinations: pages alternate INT2/BF16; tokens go to shuffled (page, slot) pairs.
  const uint32_t n_pages = (c.tokens + c.page_tokens - 1) / c.page_tokens + 1;
  std::vector<uint8_t> kinds(n_pages);
  std::vector<size_t> sizes(n_pages);
  for (uint32_t i = 0; i < n_pages; ++i) {
    kinds[i] = static_cast<uint8_t>(i % 3 == 1 ? PageKind::kBf16 : PageKind::kInt2);
    const PageGeometry g{c.layers, H, d, c.group, c.page_tokens, static_cast<PageKind>(kinds[i])};
    sizes[i] = g.page_bytes();
  }
  std::vector<int32_t> slots_all;
  for (uint32_t i = 0; i < n_pages * c.page_tokens; ++i) slots_all.push_back(static_cast<int32_t>(i));
  std::shuffle(slots_all.begin(), slots_all.end(), rng);
  std::vector<int32_t> dst_page(c.tokens), dst_slot(c.tokens);
  for (int32_t t = 0; t < c.tokens; ++t) {
    dst_page[t] = slots_all[t] / static_cast<int32_t>(c.page_tokens);
    dst_slot[t] = slots_all[t] % static_cast<int32_t>(c.page_tokens);
  }
  std::vector<float> clips(size_t{c.layer_count} * 2 * H);
  for (size_t i = 0; i < clips.size(); ++i) clips[i] = c.clip_values[i % c.clip_values.size()];
  RotationSet rot = RotationSet::Hadamard(c.layers, H, d);
  {
    // A non-Hadamard rotation for the rotated case: compose with a random orthogonal-ish U
    // (ComposeOscarRotation of a random permutation matrix keeps it orthogonal).
    std::vector<float> mats(rot.matrices());
    for (uint32_t m = 0; m < c.layers * 2 * H; ++m) {
      std::vector<uint32_t> perm(d);
      for (uint32_t i = 0; i < d; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<float> u(size_t{d} * d, 0.f);
      for (uint32_t i = 0; i < d; ++i) u[size_t{i} * d + perm[i]] = (rng() & 1) ? 1.f : -1.f;
      std::vector<float> r = c.exact_rotation ? u : ComposeOscarRotation(u, d);
      std::copy(r.begin(), r.end(), mats.begin() + size_t{m} * d * d);
    }
    auto rs = RotationSet::FromData(c.layers, H, d, mats, rot.clips());
    ASSERT_TRUE(rs.ok());
    rot = *std::move(rs);
  }

  // CPU reference.
  std::vector<std::vector<uint8_t>> ref(n_pages);
  std::vector<uint8_t*> ref_ptrs(n_pages);
  for (uint32_t i = 0; i < n_pages; ++i) {
    ref[i].assign(sizes[i], 0);
    ref_ptrs[i] = ref[i].data();
  }
  QuantizeWriteParams hp;
  hp.num_layers = c.layers;
  hp.num_kv_heads = H;
  hp.group_size = c.group;
  hp.page_tokens = c.page_tokens;
  hp.first_layer = c.first_layer;
  hp.layer_count = c.layer_count;
  hp.src_layer_stride = int64_t{c.tokens} * H * d;
  hp.src_token_stride = H * d;
  hp.src_head_stride = d;
  hp.num_tokens = c.tokens;
  hp.range_mode = c.range_mode;
  std::vector<uint8_t> modes(clips.size());
  for (size_t i = 0; i < modes.size() && !c.range_modes.empty(); ++i) {
    modes[i] = c.range_modes[i % c.range_modes.size()];
  }
  QuantizeWriteParams rp = hp;
  if (!c.range_modes.empty()) rp.range_modes = modes.data();
  rp.k_src = ksrc.data();
  rp.v_src = vsrc.data();
  rp.page_ptrs = ref_ptrs.data();
  rp.page_kinds = kinds.data();
  rp.dst_page = dst_page.data();
  rp.dst_slot = dst_slot.data();
  rp.clips = clips.data();
  ASSERT_TRUE(ReferenceQuantizeWrite(rp, c.rotate ? &rot : nullptr).ok());

  // GPU.
  std::vector<DeviceBuffer> dpages;
  std::vector<uint8_t*> ptrs;
  for (uint32_t i = 0; i < n_pages; ++i) {
    auto b = DeviceBuffer::Create(sizes[i]);
    ASSERT_TRUE(b.ok());
    ASSERT_EQ(cudaMemset(b->get(), 0, sizes[i]), cudaSuccess);
    ptrs.push_back(b->as<uint8_t>());
    dpages.push_back(*std::move(b));
  }
  auto d_ptrs = DeviceBuffer::FromHost(ptrs);
  auto d_kinds = DeviceBuffer::FromHost(kinds);
  auto d_page = DeviceBuffer::FromHost(dst_page);
  auto d_slot = DeviceBuffer::FromHost(dst_slot);
  auto d_k = DeviceBuffer::FromHost(ksrc);
  auto d_v = DeviceBuffer::FromHost(vsrc);
  auto d_clips = DeviceBuffer::FromHost(clips);
  // Rotations of the written layers, [layer_count][2][H][d][d].
  std::vector<float> mats(rot.matrix(c.first_layer, KV::kKey, 0),
                          rot.matrix(c.first_layer, KV::kKey, 0) + size_t{c.layer_count} * 2 * H * d * d);
  auto d_mats = DeviceBuffer::FromHost(mats);
  auto d_frag = DeviceBuffer::Create(size_t{c.layer_count} * 2 * H * kRotationFragmentBytes);
  for (auto* b : {&d_ptrs, &d_kinds, &d_page, &d_slot, &d_k, &d_v, &d_clips, &d_mats, &d_frag}) {
    ASSERT_TRUE(b->ok()) << b->status();
  }
  QuantizeWriteArgs gp(hp);
  gp.precise_rotation = c.precise;
  gp.k_src = d_k->as<uint16_t>();
  gp.v_src = d_v->as<uint16_t>();
  gp.page_ptrs = d_ptrs->as<uint8_t*>();
  gp.page_kinds = d_kinds->as<uint8_t>();
  gp.dst_page = d_page->as<int32_t>();
  gp.dst_slot = d_slot->as<int32_t>();
  gp.clips = d_clips->as<float>();
  auto d_modes = DeviceBuffer::FromHost(modes);
  ASSERT_TRUE(d_modes.ok());
  if (!c.range_modes.empty()) gp.range_modes = d_modes->as<uint8_t>();
  if (c.rotate) {
    ASSERT_TRUE(PrepareRotationFragments(d_mats->as<float>(), c.layer_count * 2 * H, d_frag->get(), nullptr).ok());
    gp.rot_fragments = d_frag->get();
  }
  // Both load paths (staged, the default, and the round-1 direct loads) write every byte, and
  // write the same bytes (the same arithmetic in the same order), rotated or not.
  std::vector<std::vector<uint8_t>> round1(n_pages);
  using LoadPath = QuantizeWriteArgs::LoadPath;
  int cc_major = 0, cc_minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  const bool sm90 = cc_major == 9 && cc_minor == 0;
  // The streaming kernel (kStream; kAuto where it applies) rotates with R as bf16 hi + lo, so its
  // rotated rows are compared with the reference like the round-1 kernel's, not byte for byte
  // with them (bit for bit with the reference under exact rotations).
  const bool no_clip = std::all_of(clips.begin(), clips.end(), [](float x) { return x >= 1.0f; });
  const auto fixed_or_minmax = [](uint8_t m) { return m == 0 || (m >= 16 && m <= 23); };
  const bool stream_modes = c.range_modes.empty()
                                ? fixed_or_minmax(static_cast<uint8_t>(c.range_mode))
                                : std::all_of(c.range_modes.begin(), c.range_modes.end(), fixed_or_minmax);
  // Unrotated rows (the flush) take it too, whatever `precise` says (nothing to rotate).
  const bool stream_fits = (!c.rotate || c.precise) && no_clip && stream_modes;
  gp.range_modes_fixed_only = stream_modes && !c.range_modes.empty();
  for (LoadPath path : {LoadPath::kRound1, LoadPath::kDirect, LoadPath::kStaged, LoadPath::kAuto,
                        LoadPath::kLoadAhead, LoadPath::kLoadAtTile,
                        LoadPath::kPrefetchL1, LoadPath::kWgmma4, LoadPath::kWgmma8,
                        LoadPath::kWgmma12, LoadPath::kStream, LoadPath::kStream3}) {
  const bool stream_path = path == LoadPath::kStream || path == LoadPath::kStream3;
  const bool stream = stream_fits && (stream_path || path == LoadPath::kAuto);
  // Compared with the round-1 kernel's bytes (else with the reference).
  const bool staged = path != LoadPath::kRound1 && !stream;
  SCOPED_TRACE("load path " + std::to_string(static_cast<int>(path)) + (stream ? " (streaming kernel)" : ""));
  if (path == LoadPath::kStream && !c.precise) continue;  // R hi only there: a timing diagnostic
  if (stream_path && !(stream_fits && QuantizeWriteHasWgmma())) {
    // Refused with a reason, never run on what it does not support.
    gp.load_path = path;
    gp.clips = no_clip ? nullptr : d_clips->as<float>();
    const absl::Status st = LaunchQuantizeWrite(gp, nullptr);
    EXPECT_FALSE(st.ok());
    ASSERT_FALSE(stream_fits && sm90) << "sm_90 device but no streaming kernel";
    continue;
  }
  const bool wgmma = path == LoadPath::kWgmma4 || path == LoadPath::kWgmma8 || path == LoadPath::kWgmma12;
  if ((wgmma || stream_path) && !QuantizeWriteHasWgmma()) {
    // The default build (sm_90) compiles the write kernels for sm_90a: on an sm_90 device the
    // wgmma paths must be there.
    ASSERT_FALSE(sm90) << "sm_90 device but no sm_90a (wgmma) quantize-on-write kernels";
    continue;
  }
  for (uint32_t i = 0; i < n_pages; ++i) {
    ASSERT_EQ(cudaMemset(dpages[i].get(), staged ? 0x5a : 0, sizes[i]), cudaSuccess);
  }
  gp.load_path = path;
  // kAuto runs kernels compiled without the clip when `clips` is null: cases without clipping
  // (every ratio >= 1, so the same bytes) pass null on that path.
  gp.clips = (path == LoadPath::kAuto || stream_path) && no_clip ? nullptr : d_clips->as<float>();
  ASSERT_TRUE(LaunchQuantizeWrite(gp, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  size_t code_diff = 0, codes = 0, bf_diff = 0, bfs = 0, groups = 0, far_groups = 0;
  for (uint32_t i = 0; i < n_pages; ++i) {
    auto got = dpages[i].ToHost<uint8_t>();
    ASSERT_TRUE(got.ok());
    if (staged) {
      // Unwritten bytes (headers, unused slots) hold the poison here and 0 in round1: compare
      // the written rows only, through the reference's layout below, plus the whole page for
      // unrotated writes.
      const PageGeometry g{c.layers, H, d, c.group, c.page_tokens, static_cast<PageKind>(kinds[i])};
      for (int32_t t = 0; t < c.tokens; ++t) {
        if (static_cast<uint32_t>(dst_page[t]) != i) continue;
        for (uint32_t l = c.first_layer; l < c.first_layer + c.layer_count; ++l)
          for (uint32_t kv = 0; kv < 2; ++kv)
            for (uint32_t h = 0; h < H; ++h) {
              const size_t seg = g.segment_offset(l, kv, h);
              const uint32_t slot = static_cast<uint32_t>(dst_slot[t]);
              std::vector<std::pair<size_t, size_t>> spans;
              if (static_cast<PageKind>(kinds[i]) == PageKind::kBf16) {
                spans.push_back({seg + g.bf16_row_offset(slot), 2 * d});
              } else {
                spans.push_back({seg + g.code_row_offset(slot), d / 4});
                spans.push_back({seg + g.scale_offset(slot, 0), size_t{g.groups_per_row()} * 4});
              }
              for (auto [off, len] : spans) {
                ASSERT_EQ(0, std::memcmp(got->data() + off, round1[i].data() + off, len))
                    << "this load path and the round-1 kernel differ: page " << i << " token " << t << " layer " << l
                    << " kv " << kv << " head " << h;
              }
            }
      }
      continue;  // round1 was checked against the reference below
    }
    if (path == LoadPath::kRound1) round1[i] = *got;
    if (!c.rotate || (stream && c.exact_rotation)) {
      if (stream) {  // poisoned: compare the rows it wrote (the reference zeroes the rest)
        const PageGeometry g{c.layers, H, d, c.group, c.page_tokens, static_cast<PageKind>(kinds[i])};
        for (int32_t t = 0; t < c.tokens; ++t) {
          if (static_cast<uint32_t>(dst_page[t]) != i) continue;
          for (uint32_t l = c.first_layer; l < c.first_layer + c.layer_count; ++l)
            for (uint32_t kv = 0; kv < 2; ++kv)
              for (uint32_t h = 0; h < H; ++h) {
                const size_t seg = g.segment_offset(l, kv, h);
                const uint32_t slot = static_cast<uint32_t>(dst_slot[t]);
                const bool bf = static_cast<PageKind>(kinds[i]) == PageKind::kBf16;
                const size_t off[2] = {seg + (bf ? g.bf16_row_offset(slot) : g.code_row_offset(slot)),
                                       bf ? 0 : seg + g.scale_offset(slot, 0)};
                const size_t len[2] = {bf ? 2 * d : d / 4, bf ? 0 : size_t{g.groups_per_row()} * 4};
                for (int k = 0; k < 2; ++k) {
                  ASSERT_EQ(0, std::memcmp(got->data() + off[k], ref[i].data() + off[k], len[k]))
                      << "streaming kernel differs from the reference: page " << i << " token " << t
                      << " layer " << l << " kv " << kv << " head " << h;
                }
              }
        }
        continue;
      }
      ASSERT_EQ(*got, ref[i]) << "page " << i << " kind " << int{kinds[i]} << " differs";
      continue;
    }
    const PageKind kind = static_cast<PageKind>(kinds[i]);
    const PageGeometry g{c.layers, H, d, c.group, c.page_tokens, kind};
    for (uint32_t l = c.first_layer; l < c.first_layer + c.layer_count; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t h = 0; h < H; ++h) {
          const size_t seg = g.segment_offset(l, kv, h);
          for (uint32_t t = 0; t < c.page_tokens; ++t) {
            if (kind == PageKind::kBf16) {
              // The streaming kernel's R is bf16 hi + lo (~2^-17 relative per entry): its absolute
              // error is bounded by ~2^-17 of the row's L1 norm (<= sqrt(d) times the rotated row's).
              double row_l1 = 0;
              for (uint32_t e = 0; e < d; ++e) {
                uint16_t b;
                std::memcpy(&b, ref[i].data() + seg + g.bf16_row_offset(t) + 2 * e, 2);
                row_l1 += std::fabs(Bf16ToFloat(b));
              }
              const double abs_tol = !c.precise ? 1e-2 : stream ? 0x1p-17 * std::sqrt(double(d)) * row_l1 : 1e-6;
              for (uint32_t e = 0; e < d; ++e) {
                uint16_t a, b;
                std::memcpy(&a, got->data() + seg + g.bf16_row_offset(t) + 2 * e, 2);
                std::memcpy(&b, ref[i].data() + seg + g.bf16_row_offset(t) + 2 * e, 2);
                ++bfs;
                if (a != b) {
                  ++bf_diff;
                  // R fp16 only: absolute errors ~1e-4 of the row's scale (values near 0).
                  EXPECT_NEAR(Bf16ToFloat(a), Bf16ToFloat(b), 0.01 * std::fabs(Bf16ToFloat(b)) + abs_tol);
                }
              }
              continue;
            }
            float xa[128], xb[128];
            uint16_t sa[4], sb[4];
            std::memcpy(sa, got->data() + seg + g.scale_offset(t, 0), g.groups_per_row() * 4);
            std::memcpy(sb, ref[i].data() + seg + g.scale_offset(t, 0), g.groups_per_row() * 4);
            DequantizeRowInt2(got->data() + seg + g.code_row_offset(t), sa, d, c.group, xa);
            DequantizeRowInt2(ref[i].data() + seg + g.code_row_offset(t), sb, d, c.group, xb);
            bool group_far[4] = {false, false, false, false};
            for (uint32_t gi = 0; gi < g.groups_per_row(); ++gi) {
              ++groups;
              for (int k = 0; k < 2; ++k) {
                const float pa = HalfToFloat(sa[2 * gi + k]), pb = HalfToFloat(sb[2 * gi + k]);
                if (!(std::fabs(pa - pb) <= 4 * 0.001 * std::fabs(pb) + 1e-6)) {
                  group_far[gi] = true;
                  if (!c.loose) ADD_FAILURE() << "fp16 parameter " << pa << " vs " << pb;
                }
              }
              far_groups += group_far[gi];
            }
            for (uint32_t e = 0; e < d; ++e) {
              ++codes;
              const float step = HalfToFloat(sb[2 * (e / c.group)]);
              const int ca = (got->data()[seg + g.code_row_offset(t) + e / 4] >> (2 * (e % 4))) & 3;
              const int cb = (ref[i].data()[seg + g.code_row_offset(t) + e / 4] >> (2 * (e % 4))) & 3;
              if (group_far[e / c.group]) continue;
              if (ca != cb) ++code_diff;
              EXPECT_LE(std::fabs(xa[e] - xb[e]), 1.01f * step + 1e-3f);
            }
          }
        }
      }
    }
  }
  if (c.rotate && !staged && !c.exact_rotation) {
    EXPECT_LE(code_diff, codes * c.code_frac) << code_diff << " of " << codes << " codes differ";
    EXPECT_LE(bf_diff, bfs * c.bf16_frac) << bf_diff << " of " << bfs << " bf16 elements differ";
    EXPECT_LE(far_groups, groups * c.far_group_frac) << far_groups << " of " << groups
                                                     << " groups chose another range";
    std::printf("rotated G%u %s mode %d%s: %zu/%zu codes, %zu/%zu bf16, %zu/%zu groups differ\n", c.group,
                c.precise ? "R hi+lo" : "R hi", static_cast<int>(c.range_mode),
                stream ? " (streaming kernel, R bf16 hi+lo)" : "", code_diff, codes, bf_diff, bfs, far_groups,
                groups);
  }
  }  // staged
}

TEST(QuantizeWriteGpu, UnrotatedBitExactGroup128) {
  SKIP_WITHOUT_GPU();
  WriteCase c;
  RunWrite(c);
}

TEST(QuantizeWriteGpu, UnrotatedBitExactGroup64OddTokens) {
  SKIP_WITHOUT_GPU();
  WriteCase c;
  c.group = 64;
  c.tokens = 131;
  c.page_tokens = 128;
  c.seed = 2;
  RunWrite(c);
}

// Write-time range modes (docs/FORMAT.md §1.3.1) mirrored bit for bit; clips both near the top
// (order statistics by the top walk) and lower (the bitwise selection), and no clip.
TEST(QuantizeWriteGpu, RangeModesBitExact) {
  SKIP_WITHOUT_GPU();
  for (RangeMode mode : {RangeMode::kSearch, RangeMode::kUnbiased}) {
    for (uint32_t g : {128u, 64u}) {
      WriteCase c;
      c.group = g;
      c.range_mode = mode;
      c.tokens = g == 128 ? 200 : 131;
      c.page_tokens = g == 128 ? 64 : 128;
      c.clip_values = {0.96f, 1.0f, 0.5f, 0.92f, 0.999f};
      c.seed = 40 + g + static_cast<uint32_t>(mode);
      RunWrite(c);
    }
  }
}

TEST(QuantizeWriteGpu, PerHeadRangeModesBitExact) {
  SKIP_WITHOUT_GPU();
  for (uint32_t g : {128u, 64u}) {
    WriteCase c;
    c.group = g;
    c.kv_heads = 3;
    c.range_modes = {0, 1, 3, 3, 0, 1, 1};
    c.clip_values = {0.96f, 1.0f, 0.92f};
    c.seed = 60 + g;
    RunWrite(c);
  }
}

TEST(QuantizeWriteGpu, QuantileClipAtManyRatiosBitExact) {
  SKIP_WITHOUT_GPU();
  WriteCase c;
  c.clip_values = {0.0f, 0.3f, 0.7f, 0.87f, 0.88f, 0.89f, 0.9f, 0.95f, 0.99f, 0.995f, 1.0f};
  c.kv_heads = 6;
  c.layers = 2;
  c.first_layer = 0;
  c.seed = 77;
  RunWrite(c);
}

// The quantile selection's corner cases against the CPU, every range mode: heavy ties, the
// row's top values all in one lane's channels (the top-8 lists run out: exact fallback),
// constant rows and rows holding +-inf; clips near the top (top-8 merge), lower (bitwise
// selection) and none.
TEST(QuantizeWriteGpu, TiesOneLaneTopsConstantAndInfRowsBitExact) {
  SKIP_WITHOUT_GPU();
  for (int pattern : {1, 2, 3}) {
    for (uint32_t g : {128u, 64u}) {
      WriteCase c;
      c.pattern = pattern;
      c.group = g;
      c.kv_heads = 3;
      c.tokens = 150;
      c.range_modes = {0, 1, 3, 3, 1, 0, 3};
      c.clip_values = {0.92f, 0.96f, 1.0f, 0.88f, 0.999f, 0.5f, 0.9449f, 0.95f};
      c.seed = 90 + 7 * pattern + g;
      SCOPED_TRACE("pattern " + std::to_string(pattern));
      RunWrite(c);
    }
  }
}

// Enough tokens that the staged kernels' CTAs take several tiles each (one balanced wave: with
// 2 heads, K and V, ~400 resident CTAs, 20011 tokens are ~7 tiles per CTA), so every stage of
// the load ring is refilled several times; a partial last tile. Unrotated bit for bit in every
// range mode, rotated with R as fp16 only (errors large enough to show a misplaced row) and
// unbiased ranges.
TEST(QuantizeWriteGpu, ManyTilesPerCtaBitExact) {
  SKIP_WITHOUT_GPU();
  for (bool rotate : {false, true}) {
    for (uint32_t g : {128u, 64u}) {
      WriteCase c;
      c.group = g;
      c.rotate = rotate;
      c.precise = false;
      OneLayer(c);
      c.tokens = 20011;
      c.range_modes = rotate ? std::vector<uint8_t>{3} : std::vector<uint8_t>{0, 3, 1, 3};
      c.clip_values = {1.0f, 1.0f, 0.96f, 1.0f};
      c.seed = 500 + g + rotate;
      if (rotate) HiOnlyTolerances(c);
      RunWrite(c);
    }
  }
}

TEST(QuantizeWriteGpu, RotatedWithinOneStep) {
  SKIP_WITHOUT_GPU();
  for (uint32_t g : {128u, 64u}) {
    WriteCase c;
    c.group = g;
    c.rotate = true;
    c.tokens = 333;
    c.seed = 3 + g;
    RunWrite(c);
  }
}

// The default codec write (`oscarkv calibrate` defaults: rotate, no clip, unbiased) and the
// same with OSCAR's clips, R as fp16 hi + lo and hi only.
TEST(QuantizeWriteGpu, RotatedDefaultCodecWithinOneStep) {
  SKIP_WITHOUT_GPU();
  for (bool clip : {false, true})
  for (bool precise : {true, false}) {
    for (uint32_t g : {128u, 64u}) {
      WriteCase c;
      c.group = g;
      c.rotate = true;
      c.precise = precise;
      c.tokens = 333;
      c.range_mode = RangeMode::kUnbiased;
      c.clip_values = clip ? std::vector<float>{0.96f, 0.92f} : std::vector<float>{1.0f};
      c.seed = 11 + g + precise + 2 * clip;
      c.loose = true;
      if (!precise) HiOnlyTolerances(c);
      SCOPED_TRACE(std::string(precise ? "R hi+lo" : "R hi only") + (clip ? ", clip" : ", no clip"));
      RunWrite(c);
    }
  }
}

// The streaming kernel's bit-exact cases: groups 128 and 64 for each row pattern, several heads
// whose per-head modes cycle through `modes`, lengths that are not a multiple of its 64-row tiles
// (one and several tiles per warpgroup), no clip.
void RunStreamBitExactCases(bool exact_rotation, std::initializer_list<int> patterns,
                            const std::vector<uint8_t>& modes, uint32_t seed0) {
  for (int pattern : patterns) {
    for (uint32_t g : {128u, 64u}) {
      WriteCase c;
      c.pattern = pattern;
      c.group = g;
      c.rotate = exact_rotation;
      c.exact_rotation = exact_rotation;
      c.kv_heads = 3;
      c.tokens = pattern == 0 ? 4099 : 333;
      c.page_tokens = g == 128 ? 64 : 128;
      c.range_modes = modes;
      c.clip_values = {1.0f};
      c.seed = seed0 + g + pattern;
      SCOPED_TRACE("pattern " + std::to_string(pattern));
      RunWrite(c);
    }
  }
}

// The streaming kernel (kAuto / kStream for writes without clip, min-max or unbiased-fixed
// ranges): under signed-permutation rotations (exact) its bytes equal the CPU reference bit for
// bit -- BF16 and INT2 pages, groups 128 and 64, per-head modes mixing min-max and every
// fixed candidate, lengths that are not a multiple of its 64-row tiles, one and several tiles
// per warpgroup, ties, one lane holding a row's top values. (Rows holding ±inf rotate into NaN,
// whose bytes the format leaves unspecified: pattern 3 is not used here.)
TEST(QuantizeWriteGpu, StreamKernelExactRotationBitExact) {
  SKIP_WITHOUT_GPU();
  RunStreamBitExactCases(true, {0, 1, 2}, {16, 0, 17, 18, 19, 20, 21, 22, 23, 22}, 900);
}

// The streaming kernel on rows that are already rotated (kAuto takes it for the flush and for V
// with R_V absorbed: no clip, min-max or unbiased-fixed ranges): bit for bit with the reference
// -- the same cases, plus constant rows and rows holding ±inf (the other load paths run each case
// beside it).
TEST(QuantizeWriteGpu, StreamKernelUnrotatedBitExact) {
  SKIP_WITHOUT_GPU();
  RunStreamBitExactCases(false, {0, 1, 2, 3}, {0, 16, 17, 18, 19, 20, 21, 22, 23, 16}, 950);
}

// Unbiased-fixed ranges under real rotations: the streaming kernel (R as bf16 hi + lo) and the
// older kernels (R as fp16 hi + lo, clips forcing them) against the fp32 CPU rotation.
TEST(QuantizeWriteGpu, RotatedUnbiasedFixedWithinOneStep) {
  SKIP_WITHOUT_GPU();
  for (bool clip : {false, true}) {
    for (uint32_t g : {128u, 64u}) {
      WriteCase c;
      c.group = g;
      c.rotate = true;
      c.tokens = 1000;
      c.range_modes = {22, 23, 0, 16};
      c.clip_values = clip ? std::vector<float>{0.96f, 0.92f} : std::vector<float>{1.0f};
      c.seed = 950 + g + clip;
      c.loose = true;
      SCOPED_TRACE(clip ? "clip (older kernels)" : "no clip (streaming kernel)");
      RunWrite(c);
    }
  }
}

// The flush: tail rows already in a BF16 page (all layers) move into an INT2 page.
TEST(QuantizeWriteGpu, FlushBf16PageIntoInt2Page) {
  SKIP_WITHOUT_GPU();
  const uint32_t L = 3, H = 2, d = 128, T = 64;
  CodecProfile prof;
  prof.model_id = "t";
  prof.num_layers = L;
  prof.num_kv_heads = H;
  prof.page_tokens = T;
  const PageGeometry gb = GeometryFor(prof, PageKind::kBf16);
  const PageGeometry g2 = GeometryFor(prof, PageKind::kInt2);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> kvdata(size_t{L} * 2 * T * H * d);
  for (auto& v : kvdata) v = nd(rng);
  KVSequenceView view{kvdata.data(), L, H, d, T};
  RotationSet rot = RotationSet::Hadamard(L, H, d, 0.96f, 0.92f);
  auto bf = EncodePage(prof, &rot, PageKind::kBf16, view, 0, 50);
  ASSERT_TRUE(bf.ok());
  std::vector<float> clips;
  for (uint32_t l = 0; l < L; ++l)
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t h = 0; h < H; ++h) clips.push_back(rot.clip(l, static_cast<KV>(kv), h));
  QuantizeWriteParams p;
  p.num_layers = L;
  p.num_kv_heads = H;
  p.page_tokens = T;
  p.first_layer = 0;
  p.layer_count = L;
  p.num_tokens = 50;
  p.src_layer_stride = static_cast<int64_t>(2 * H * gb.segment_bytes() / 2);
  p.src_token_stride = d;
  p.src_head_stride = static_cast<int64_t>(gb.segment_bytes() / 2);
  std::vector<int32_t> page(50, 0), slot(50);
  for (int i = 0; i < 50; ++i) slot[i] = i;
  std::vector<uint8_t> kinds = {static_cast<uint8_t>(PageKind::kInt2)};
  // Reference on the host.
  std::vector<uint8_t> ref(g2.page_bytes(), 0);
  std::vector<uint8_t*> ref_ptrs = {ref.data()};
  QuantizeWriteParams rp = p;
  const uint16_t* seg0 = reinterpret_cast<const uint16_t*>(bf->data() + gb.segment_offset(0, 0, 0));
  rp.k_src = seg0;
  rp.v_src = seg0 + H * gb.segment_bytes() / 2;
  rp.page_ptrs = ref_ptrs.data();
  rp.page_kinds = kinds.data();
  rp.dst_page = page.data();
  rp.dst_slot = slot.data();
  rp.clips = clips.data();
  ASSERT_TRUE(ReferenceQuantizeWrite(rp, nullptr).ok());
  // Device.
  auto d_bf = DeviceBuffer::FromHost(*bf);
  auto d_int2 = DeviceBuffer::Create(g2.page_bytes());
  ASSERT_TRUE(d_bf.ok() && d_int2.ok());
  ASSERT_EQ(cudaMemset(d_int2->get(), 0, g2.page_bytes()), cudaSuccess);
  std::vector<uint8_t*> ptrs = {d_int2->as<uint8_t>()};
  auto d_ptrs = DeviceBuffer::FromHost(ptrs);
  auto d_kinds = DeviceBuffer::FromHost(kinds);
  auto d_page = DeviceBuffer::FromHost(page);
  auto d_slot = DeviceBuffer::FromHost(slot);
  auto d_clips = DeviceBuffer::FromHost(clips);
  QuantizeWriteParams gp = p;
  const uint16_t* dseg0 = reinterpret_cast<const uint16_t*>(d_bf->as<uint8_t>() + gb.segment_offset(0, 0, 0));
  gp.k_src = dseg0;
  gp.v_src = dseg0 + H * gb.segment_bytes() / 2;
  gp.page_ptrs = d_ptrs->as<uint8_t*>();
  gp.page_kinds = d_kinds->as<uint8_t>();
  gp.dst_page = d_page->as<int32_t>();
  gp.dst_slot = d_slot->as<int32_t>();
  gp.clips = d_clips->as<float>();
  ASSERT_TRUE(LaunchQuantizeWrite(gp, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto got = d_int2->ToHost<uint8_t>();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, ref);
}

// Real rows: the reference model's post-RoPE K/V (bench/testdata/refmodel_kv.bin, layer 0, 700
// tokens, 2 KV heads), with OSCAR's clip ratios, unrotated (bit-exact) and rotated.
TEST(QuantizeWriteGpu, RealRowsOfTheReferenceModel) {
  SKIP_WITHOUT_GPU();
  std::string path = "bench/testdata/refmodel_kv.bin";
  if (const char* src = std::getenv("OSCARKV_SOURCE_DIR")) path = std::string(src) + "/" + path;
  std::ifstream in(path, std::ios::binary);
  if (!in) GTEST_SKIP() << "no " << path;
  char magic[8];
  uint32_t hdr[5];
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(hdr), sizeof hdr);
  const uint32_t n = hdr[1], H = hdr[3], d = hdr[4];
  ASSERT_EQ(d, 128u);
  uint32_t layer_index;
  in.read(reinterpret_cast<char*>(&layer_index), 4);
  std::vector<uint16_t> k(size_t{n} * H * d), v(k.size());
  in.read(reinterpret_cast<char*>(k.data()), k.size() * 2);
  in.read(reinterpret_cast<char*>(v.data()), v.size() * 2);
  ASSERT_TRUE(in.good());
  auto real_case = [&] {
    WriteCase c;
    c.kv_heads = H;
    OneLayer(c);
    c.tokens = static_cast<int32_t>(n);
    c.real_k = &k;
    c.real_v = &v;
    return c;
  };
  for (bool rotate : {false, true}) {
    WriteCase c = real_case();
    c.rotate = rotate;
    c.clip_values = {0.96f, 0.96f, 0.92f, 0.92f};  // K heads, then V heads
    RunWrite(c);
  }
  // The default codec (no clip, unbiased ranges): unrotated bit for bit; rotated with R as
  // fp16 hi + lo and as fp16 only, the printed code mismatches against the fp32 CPU rotation
  // measure what the fp16-only R costs on real rows.
  for (int variant = 0; variant < 3; ++variant) {
    WriteCase c = real_case();
    c.rotate = variant > 0;
    c.precise = variant == 1;
    c.range_mode = RangeMode::kUnbiased;
    c.clip_values = {1.0f};
    c.loose = true;
    if (variant == 2) HiOnlyTolerances(c);
    SCOPED_TRACE(variant == 0 ? "unrotated" : variant == 1 ? "R hi+lo" : "R hi only");
    RunWrite(c);
  }
}

}  // namespace
}  // namespace oscarkv::cuda
