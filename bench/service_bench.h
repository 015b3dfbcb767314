// `oscarkv bench service`: starts its own oscarkvd (127.0.0.1, port 0), stores Qwen3-8B-shaped
// INT2 pages made by the real page writer, and measures through the client library:
//   * lookups/s and p50/p99 latency with 1, 8 and 64 closed-loop clients;
//   * open loop: a fixed schedule of lookups at --rate per second spread over 64 clients,
//     latency measured from each request's SCHEDULED send time (so queueing counts);
//   * both lookup phases once per lookup path, phase by phase side by side: the client
//     library's default (kAuto: the daemon's local control socket, as the daemon runs on this
//     host) and gRPC (--lookup-path picks one);
//   * load GB/s of --batch-page batches over shared memory and over gRPC streaming, each
//     interleaved with a plain memcpy of the same pool bytes into the same buffers;
//   * store and verified-load GB/s of --batch pages through the client library's defaults,
//     each beside a memcpy of the same bytes between two buffers of its own
//     (bench/store_load_vs_memcpy.h).
#pragma once

namespace oscarkv::bench {

// argv[0] is the command name. Exit code: 0 ok, 1 failed, 2 usage.
int ServiceBenchMain(int argc, char** argv);

}  // namespace oscarkv::bench
