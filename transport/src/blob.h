// Wire layout of the opaque blobs this library hands out (little-endian, x86-64 and aarch64):
//   worker address: "OKVW" u16 version u16 reserved u32 length, then UCX's address bytes;
//   memory region:  "OKVM" u16 version u16 reserved u64 base u64 length u32 rkey length, then
//                   UCX's packed rkey.
// The framing lets a receiver reject a truncated, foreign or stale blob with INVALID_ARGUMENT
// before any byte reaches UCX (which trusts what it unpacks).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace oscarkv::transport::blob {

inline constexpr uint32_t kAddressMagic = 0x57564B4F;  // "OKVW"
inline constexpr uint32_t kMemoryMagic = 0x4D564B4F;   // "OKVM"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kAddressHeader = 12;
inline constexpr size_t kMemoryHeader = 28;

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <typename T>
T Get(absl::string_view in, size_t offset) {
  T v;
  std::memcpy(&v, in.data() + offset, sizeof(v));
  return v;
}

}  // namespace oscarkv::transport::blob
