// "The store never lies", against a real oscarkvd: a page whose Commit fails is not left behind
// as a reservation that a later Store of the same key counts as deduplicated.
#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::PageWrite;

// The sequence of issue 23: store a page with a corrupt checksum -> DATA_LOSS; store the
// correct page under the same key -> stored=1, and Lookup matches it.
TEST(StoreTruthTest, CorruptCommitThenCorrectStoreIsStored) {
  for (client::DataPath path : {client::DataPath::kAuto, client::DataPath::kGrpc}) {
    auto daemon = StartDaemon();
    ASSERT_NE(daemon, nullptr);
    auto c = Connect(daemon->address(), path);
    ASSERT_NE(c, nullptr);
    const client::Codec codec = RegisterRefmodel(*c);
    const std::vector<BlockKey> keys =
        client::Client::BlockKeys(codec, Tokens(7, codec.profile.page_tokens));
    ASSERT_EQ(keys.size(), 1u);
    const std::vector<uint8_t> good = MakePage(codec.profile, PageKind::kInt2, 7);
    std::vector<uint8_t> corrupt = good;
    corrupt[corrupt.size() / 2] ^= 0x40;  // payload byte: the header parses, the checksum fails

    const PageWrite bad_write{keys[0], PageKind::kInt2, corrupt};
    auto bad = c->Store(codec, std::span<const PageWrite>(&bad_write, 1));
    ASSERT_TRUE(bad.ok()) << bad.status();
    EXPECT_EQ(bad->stored, 0u);
    EXPECT_EQ(bad->deduplicated, 0u);
    EXPECT_EQ(bad->failed, 1u);
    EXPECT_EQ(bad->item_status[0].code(), absl::StatusCode::kDataLoss) << bad->item_status[0];
    EXPECT_EQ(c->Lookup(codec, keys, {})->matched, 0u);

    const PageWrite good_write{keys[0], PageKind::kInt2, good};
    auto ok = c->Store(codec, std::span<const PageWrite>(&good_write, 1));
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->stored, 1u) << ok->item_status[0];
    EXPECT_EQ(ok->deduplicated, 0u);
    EXPECT_EQ(c->Lookup(codec, keys, {})->matched, 1u);
    auto loaded = c->Load(codec, keys);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->matched, 1u);
    EXPECT_EQ(loaded->pages[0], good);
    // Stored now: a third store is deduplicated against the verified page.
    auto again = c->Store(codec, std::span<const PageWrite>(&good_write, 1));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->deduplicated, 1u);
  }
}

}  // namespace
}  // namespace oscarkv::testing
