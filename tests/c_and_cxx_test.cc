// One process that uses both the C ABI (oscarkv::c_static) and the C++ client (oscarkv::client)
// against a real daemon: pages stored through one API load byte-equal through the other. With
// liboscarkv_c.so in place of oscarkv::c_static this program aborts at load (two copies of the
// oscarkv.proto stubs register with one libprotobuf): the reason oscarkv::c_static exists.
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/client/oscarkv_c.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::PageWrite;

TEST(CAndCxxInOneProcess, PagesStoredByOneApiLoadThroughTheOther) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto cxx = Connect(daemon->address());
  ASSERT_NE(cxx, nullptr);
  const client::Codec codec = RegisterRefmodel(*cxx);

  oscarkv_connect_options o;
  oscarkv_connect_options_init(&o);
  o.address = daemon->address().c_str();
  oscarkv_client* c = nullptr;
  ASSERT_EQ(oscarkv_connect(&o, &c), OSCARKV_OK) << oscarkv_last_error();
  oscarkv_codec cc;
  ASSERT_EQ(oscarkv_register_builtin_codec(c, "refmodel", &cc), OSCARKV_OK) << oscarkv_last_error();
  ASSERT_EQ(std::memcmp(cc.codec_id, codec.id.bytes.data(), 16), 0) << "the APIs disagree on the id";

  // Two blocks: the first stored by C++, the second by C; each API then loads both.
  const auto keys = client::Client::BlockKeys(codec, Tokens(41, 2 * codec.profile.page_tokens));
  ASSERT_EQ(keys.size(), 2u);
  const std::vector<uint8_t> p0 = MakePage(codec.profile, PageKind::kInt2, 41);
  const std::vector<uint8_t> p1 = MakePage(codec.profile, PageKind::kInt2, 42);
  const PageWrite w{keys[0], PageKind::kInt2, p0};
  auto stored = cxx->Store(codec, std::span<const PageWrite>(&w, 1));
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, 1u);
  const oscarkv_page cp{keys[1].bytes.data(), OSCARKV_PAGE_INT2, p1.data(), p1.size()};
  oscarkv_store_result r{};
  ASSERT_EQ(oscarkv_store(c, &cc, &cp, 1, &r, nullptr), OSCARKV_OK) << oscarkv_last_error();
  ASSERT_EQ(r.stored, 1u);

  std::vector<uint8_t> flat(2 * BlockKey{}.bytes.size());
  std::memcpy(flat.data(), keys[0].bytes.data(), 16);
  std::memcpy(flat.data() + 16, keys[1].bytes.data(), 16);
  std::vector<uint8_t> d0(p0.size()), d1(p1.size());
  void* const dst[2] = {d0.data(), d1.data()};
  const size_t dst_bytes[2] = {d0.size(), d1.size()};
  uint32_t matched = 0;
  uint64_t bytes = 0;
  ASSERT_EQ(oscarkv_load(c, &cc, flat.data(), 2, dst, dst_bytes, &matched, &bytes), OSCARKV_OK)
      << oscarkv_last_error();
  ASSERT_EQ(matched, 2u);
  EXPECT_EQ(d0, p0);
  EXPECT_EQ(d1, p1);

  auto loaded = cxx->Load(codec, keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, 2u);
  EXPECT_EQ(loaded->pages[0], p0);
  EXPECT_EQ(loaded->pages[1], p1);
  oscarkv_close(c);
}

}  // namespace
}  // namespace oscarkv::testing
