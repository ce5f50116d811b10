// Runs a kernel over a grid the way Metal's dispatchThreads does: threadgroups of
// min(threadgroup, grid) threads (smaller at the grid's far edges), one threadgroup at a time,
// each of its threads a std::thread; threads are grouped into simdgroups of 32 by their linear
// index in the threadgroup. `stagger_us` delays every thread but the first of each threadgroup,
// so a body that reads threadgroup memory without a barrier reads it before it is written.
#pragma once

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "metal_shim.h"

namespace emu {

struct Position {
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threads_per_threadgroup;
  uint3 threadgroups_per_grid;
  uint3 threads_per_grid;
  uint thread_index_in_threadgroup;
  uint simdgroup_index_in_threadgroup;
  uint thread_index_in_simdgroup;
  uint simdgroups_per_threadgroup;
  uint threads_per_simdgroup;
};

template <class Body>
void run_threadgroup(const Body& body, Position base, uint3 size, int stagger_us) {
  const int count = int(size.x * size.y * size.z);
  const int simdgroups = (count + kSimdWidth - 1) / kSimdWidth;
  std::barrier<> group_barrier(count);
  std::vector<std::unique_ptr<std::barrier<>>> simd_barriers;
  std::vector<SimdShared> simd(simdgroups);
  for (int s = 0; s < simdgroups; ++s) {
    const int width = std::min(kSimdWidth, count - s * kSimdWidth);
    simd_barriers.push_back(std::make_unique<std::barrier<>>(width));
    simd[s].barrier = simd_barriers.back().get();
    simd[s].width = width;
  }
  std::vector<std::thread> threads;
  threads.reserve(count);
  for (int index = 0; index < count; ++index) {
    Position at = base;
    at.threads_per_threadgroup = size;
    at.thread_position_in_threadgroup = {uint(index) % size.x, (uint(index) / size.x) % size.y,
                                         uint(index) / (size.x * size.y)};
    at.thread_position_in_grid = {
        base.threadgroup_position_in_grid.x * base.threads_per_threadgroup.x +
            at.thread_position_in_threadgroup.x,
        base.threadgroup_position_in_grid.y * base.threads_per_threadgroup.y +
            at.thread_position_in_threadgroup.y,
        base.threadgroup_position_in_grid.z * base.threads_per_threadgroup.z +
            at.thread_position_in_threadgroup.z};
    at.thread_index_in_threadgroup = uint(index);
    at.simdgroup_index_in_threadgroup = uint(index / kSimdWidth);
    at.thread_index_in_simdgroup = uint(index % kSimdWidth);
    at.simdgroups_per_threadgroup = uint(simdgroups);
    at.threads_per_simdgroup = uint(kSimdWidth);
    threads.emplace_back([&body, &group_barrier, &simd, at, index, stagger_us] {
      self.threadgroup_barrier = &group_barrier;
      self.simd = &simd[at.simdgroup_index_in_threadgroup];
      self.lane = at.thread_index_in_simdgroup;
      self.bank = 0;
      if (index > 0 && stagger_us > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(stagger_us));
      body(at);
    });
  }
  for (auto& t : threads) t.join();
}

// grid and threadgroup in threads, as mx.fast.metal_kernel takes them.
template <class Body>
void run_grid(const Body& body, const int* grid, const int* group_size, int stagger_us) {
  const uint3 tg = {uint(std::min(group_size[0], grid[0])), uint(std::min(group_size[1], grid[1])),
                    uint(std::min(group_size[2], grid[2]))};
  const uint3 groups = {(uint(grid[0]) + tg.x - 1) / tg.x, (uint(grid[1]) + tg.y - 1) / tg.y,
                        (uint(grid[2]) + tg.z - 1) / tg.z};
  Position base{};
  base.threads_per_threadgroup = tg;
  base.threadgroups_per_grid = groups;
  base.threads_per_grid = {uint(grid[0]), uint(grid[1]), uint(grid[2])};
  for (uint z = 0; z < groups.z; ++z)
    for (uint y = 0; y < groups.y; ++y)
      for (uint x = 0; x < groups.x; ++x) {
        base.threadgroup_position_in_grid = {x, y, z};
        const uint3 size = {std::min(tg.x, uint(grid[0]) - x * tg.x),
                            std::min(tg.y, uint(grid[1]) - y * tg.y),
                            std::min(tg.z, uint(grid[2]) - z * tg.z)};
        run_threadgroup(body, base, size, stagger_us);
      }
}

}  // namespace emu

#include "metal_qualifiers.h"
