// The GPU handoff in a build without the CUDA runtime: it says so.
#include "oscarkv/pd/gpu_handoff.h"

namespace oscarkv::pd::gpu {

Capabilities Probe() {
  Capabilities c;
  c.note = "built without the CUDA runtime (configure found no CUDAToolkit)";
  return c;
}

absl::StatusOr<ServeStats> ServePrefill(int, std::vector<HostRequest>, const ServeOptions&) {
  return absl::UnimplementedError("GPU handoff: " + Probe().note);
}

absl::StatusOr<DecodeStats> RunDecode(int, const CodecProfile&, const DecodeOptions&,
                                      const OnVerified&) {
  return absl::UnimplementedError("GPU handoff: " + Probe().note);
}

}  // namespace oscarkv::pd::gpu
