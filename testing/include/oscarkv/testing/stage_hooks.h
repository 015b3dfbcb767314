// Failure injection at named stages: product code exposes a stage hook (a
// std::function<void(std::string_view stage)>, empty by default, e.g. pd::gpu::StageHook) and
// calls it as it enters each stage; tests and the tools that drive them (`oscarkv pd
// gpu-handoff --die SIDE:STAGE`) install the hook below so that the process dies there, as a
// crashed peer would. Part of oscarkv::testing (not installed).
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace oscarkv::testing {

// A hook that, at stage `stage`, prints "<who>: dying at stage '<stage>' (failure injection)"
// on stderr and SIGKILLs this process; every other stage passes. An empty `stage` gives an empty
// hook (no failure injection).
std::function<void(std::string_view)> KillAtStage(std::string stage, std::string who);

}  // namespace oscarkv::testing
