// `oscarkv bench tier`: the daemon's SSD tier (service/tier.h over tiering's RocksDB store)
// beside plain file I/O in the same directory, in one run:
// * demotion GB/s: Qwen3-8B INT2 pages (1,327,168 B) through PageTier::Demote (the copy an
//   eviction makes, the queue, the writer's RocksDB puts) until Flush() returns (the queue
//   drained and the tier synced: on disk, fsynced) -- beside a sequential write() of the same
//   bytes into one file followed by one fsync;
// * promotion GB/s: PageTier::Read of every page (RocksDB read + header/XXH3 verification) and
//   the copy into a pool-sized destination a promotion makes -- beside a sequential read() of
//   the file. Both sides first drop their own files from the OS page cache
//   (posix_fadvise DONTNEED after fsync), so both read from the device; nothing else's cache is
//   touched;
// * restart: the time to reopen a tier holding N pages of the reference model's shape
//   (~74 KB each; 100,000 by default, ~7.4 GB of disk) -- PageTier::Open plus the codecs file,
//   what oscarkvd does before it serves.
#pragma once

namespace oscarkv::bench {

// argv[0] is the command name. Exit code: 0 ok, 1 failed, 2 usage.
int TierBenchMain(int argc, char** argv);

}  // namespace oscarkv::bench
