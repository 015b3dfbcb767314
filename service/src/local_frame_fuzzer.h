// Hooks of local_frame_fuzzer.cc for its test (local_frame_fuzz_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace oscarkv::service {

// What the daemon answered so far (how deep the inputs reached).
struct LocalFrameFuzzStats {
  uint64_t frames_sent = 0;
  uint64_t answers_by_code[17] = {};  // by status code
  uint64_t closed_by_daemon = 0;      // connections the daemon closed (malformed, refused)
  uint64_t reserves_ok = 0;           // Reserve frames answered OK
};
LocalFrameFuzzStats& LocalFrameFuzzStatsForTest();
// The id of the codec the fuzz server registered (TinyProfile), for seeds that reserve.
std::string LocalFrameFuzzCodecId();
// A fresh connection and a valid Handshake: true when the daemon answers OK.
bool LocalFrameFuzzServerAlive();

}  // namespace oscarkv::service
