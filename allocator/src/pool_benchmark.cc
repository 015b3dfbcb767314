// PagePool hot paths: allocate+free of INT2-size slots, Ref/Unref, and allocation under churn
// of two size classes. Run: <build>/allocator/pool_benchmark
#include <vector>

#include "benchmark/benchmark.h"
#include "oscarkv/allocator/page_pool.h"

namespace oscarkv {
namespace {

constexpr size_t kInt2Page = 1327168;   // Qwen3-8B INT2 page
constexpr size_t kBf16Page = 9437248;   // Qwen3-8B BF16 page

std::unique_ptr<PagePool> Pool(size_t bytes) {
  auto arena = CreateHeapArena(bytes);
  return std::move(*PagePool::Create(std::move(*arena)));
}

void BM_AllocateFree(benchmark::State& state) {
  auto pool = Pool(size_t{1} << 30);
  const SizeClassId c = *pool->SizeClassFor(kInt2Page);
  const int batch = static_cast<int>(state.range(0));
  std::vector<uint64_t> offs(batch);
  for (auto _ : state) {
    for (int i = 0; i < batch; ++i) offs[i] = *pool->Allocate(c);
    for (int i = 0; i < batch; ++i) pool->Unref(offs[i]);
  }
  state.SetItemsProcessed(state.iterations() * batch * 2);
}
BENCHMARK(BM_AllocateFree)->Arg(1)->Arg(64)->Arg(512);

void BM_RefUnref(benchmark::State& state) {
  auto pool = Pool(size_t{256} << 20);
  const SizeClassId c = *pool->SizeClassFor(kInt2Page);
  const uint64_t off = *pool->Allocate(c);
  for (auto _ : state) {
    pool->Ref(off);
    pool->Unref(off);
  }
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_RefUnref)->ThreadRange(1, 4);

void BM_MixedClassesChurn(benchmark::State& state) {
  // A nearly full pool where INT2 and BF16 slots keep replacing each other.
  auto pool = Pool(size_t{1} << 30);
  const SizeClassId a = *pool->SizeClassFor(kInt2Page);
  const SizeClassId b = *pool->SizeClassFor(kBf16Page);
  std::vector<uint64_t> live;
  size_t i = 0;
  for (auto _ : state) {
    const SizeClassId c = (i++ % 8 == 0) ? b : a;
    auto off = pool->Allocate(c);
    if (off.ok()) {
      live.push_back(*off);
    } else {
      for (size_t k = 0; k < live.size() / 4; ++k) pool->Unref(live[k]);
      live.erase(live.begin(), live.begin() + live.size() / 4);
    }
  }
  for (uint64_t o : live) pool->Unref(o);
}
BENCHMARK(BM_MixedClassesChurn);

}  // namespace
}  // namespace oscarkv

BENCHMARK_MAIN();
