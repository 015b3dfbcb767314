#include "oscarkv/proto/codec_convert.h"

#include "gtest/gtest.h"

namespace oscarkv::proto {
namespace {

TEST(CodecConvert, ProfilesRoundTripToTheSameCodecId) {
  for (const char* name : {"qwen3-8b", "refmodel"}) {
    CodecProfile p = *BuiltinProfile(name);
    for (bool rotated : {false, true}) {
      if (rotated) p.rotation_digest.fill(0x5A);
      v1::CodecProfile wire;
      ToProto(p, &wire);
      EXPECT_EQ(wire.rotation_digest().size(), rotated ? 32u : 0u);
      auto back = FromProto(wire);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->Id(), p.Id()) << name << " rotated=" << rotated;
      EXPECT_EQ(back->model_id, p.model_id);
      EXPECT_EQ(back->recent_tokens, p.recent_tokens);
    }
  }
}

TEST(CodecConvert, BadWireProfilesAreInvalidArgument) {
  v1::CodecProfile wire;
  ToProto(*BuiltinProfile("refmodel"), &wire);
  wire.set_scale_dtype(0);  // unset in proto3: fp16
  EXPECT_TRUE(FromProto(wire).ok());
  wire.set_scale_dtype(9);
  EXPECT_EQ(FromProto(wire).status().code(), absl::StatusCode::kInvalidArgument);
  wire.set_scale_dtype(1);
  wire.set_rotation_digest(std::string(31, 'x'));
  EXPECT_EQ(FromProto(wire).status().code(), absl::StatusCode::kInvalidArgument);
  wire.clear_rotation_digest();
  wire.set_model_id(std::string(1025, 'm'));
  EXPECT_EQ(FromProto(wire).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CodecConvert, PageKinds) {
  for (PageKind k : {PageKind::kInt2, PageKind::kBf16}) EXPECT_EQ(*FromProto(ToProto(k)), k);
  EXPECT_EQ(FromProto(static_cast<v1::PageKind>(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProto(static_cast<v1::PageKind>(7)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace oscarkv::proto
