// `oscarkv bench transfer`: page-batch RMA bandwidth over UCX per transport, beside ucx_perftest
// on the same transport and message size, and the P/D handoff of a 32K-token request at Qwen3-8B
// shape, INT2 page set vs all-BF16 pages, over the same path.
//
// The far side is this same binary re-executed as a peer (`--serve`): it holds registered pools
// of real pages and progresses its worker; the two processes exchange UCX blobs over an AF_UNIX
// socketpair. UCX traffic is confined to loopback (UCX_NET_DEVICES=lo) and shared memory.
#pragma once

namespace oscarkv::bench {

// argv[0] is the command name. Exit code: 0 ok, 1 failed, 2 usage.
int TransferBenchMain(int argc, char** argv);

}  // namespace oscarkv::bench
