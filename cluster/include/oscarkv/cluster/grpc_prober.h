// The real Prober: an oscarkv Handshake over gRPC with a deadline (it also checks the wire
// version, so a member running an incompatible daemon counts as down).
#pragma once

#include <memory>

#include "oscarkv/cluster/membership.h"

namespace oscarkv::cluster {

std::unique_ptr<Prober> NewGrpcProber();

}  // namespace oscarkv::cluster
