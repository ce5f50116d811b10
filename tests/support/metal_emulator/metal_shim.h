// The Metal names a kernel body uses, in C++20, so the exact body string handed to
// mx.fast.metal_kernel compiles and runs on Linux (one std::thread per Metal thread).
//
// Honoured: threadgroup memory shared by the threadgroup's threads (the driver runs one
// threadgroup at a time, so a function-local `static` is exactly one threadgroup's memory),
// threadgroup_barrier over all threads of the threadgroup, simdgroup_barrier and the simd_*
// collectives over the 32 lanes of a simdgroup (each a rendezvous of its lanes), half and
// bfloat16 storage rounding.
// Not honoured: simd collectives in divergent control flow (every lane of the simdgroup must
// call them, else the emulator deadlocks where Metal would use the active lanes only);
// `threadgroup` as a pointer qualifier (it would become `static`: keep such pointers out of
// bodies); Metal's float rounding of fast-math or its simd_sum tree order.
#pragma once
// The address-space qualifiers are macros in metal_qualifiers.h, included after the driver.

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>

typedef unsigned int uint;

struct uint3 {
  uint x, y, z;
};

using half = _Float16;
using float16_t = _Float16;

// bfloat16 storage: the top 16 bits of a float, rounded to nearest even on the way in.
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) {
      bits = 0x7fc0;
      return;
    }
    u += 0x7fff + ((u >> 16) & 1);
    bits = uint16_t(u >> 16);
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

enum class mem_flags { mem_none, mem_device, mem_threadgroup, mem_texture };

namespace metal {
using std::exp;
using std::exp2;
using std::log;
using std::sqrt;
template <class T>
inline T max(T a, T b) {
  return a > b ? a : b;
}
template <class T>
inline T min(T a, T b) {
  return a < b ? a : b;
}
namespace fast {
using std::exp;
using std::exp2;
}  // namespace fast
}  // namespace metal

namespace emu {

constexpr int kSimdWidth = 32;

// One simdgroup's rendezvous: a barrier over its lanes and two slot banks, used alternately,
// so a collective needs one barrier (bank k is rewritten two collectives later, after every
// lane has passed the barrier of the collective in between, hence finished reading it).
struct SimdShared {
  std::barrier<>* barrier;
  int width;
  alignas(16) unsigned char slots[2][kSimdWidth][16];
};

struct ThreadState {
  std::barrier<>* threadgroup_barrier = nullptr;
  SimdShared* simd = nullptr;
  uint lane = 0;
  int bank = 0;
};

inline thread_local ThreadState self;

template <class T>
inline int publish(T value) {
  static_assert(sizeof(T) <= 16, "simd collectives take values of at most 16 bytes");
  self.bank ^= 1;
  std::memcpy(self.simd->slots[self.bank][self.lane], &value, sizeof(T));
  self.simd->barrier->arrive_and_wait();
  return self.bank;
}

template <class T>
inline T lane_value(int bank, uint lane) {
  T value;
  std::memcpy(&value, self.simd->slots[bank][lane], sizeof(T));
  return value;
}

}  // namespace emu

inline void threadgroup_barrier(mem_flags) { emu::self.threadgroup_barrier->arrive_and_wait(); }
inline void simdgroup_barrier(mem_flags) { emu::self.simd->barrier->arrive_and_wait(); }

template <class T>
inline T simd_sum(T x) {
  int bank = emu::publish(x);
  T total = emu::lane_value<T>(bank, 0);
  for (int i = 1; i < emu::self.simd->width; ++i) total += emu::lane_value<T>(bank, i);
  return total;
}

template <class T>
inline T simd_max(T x) {
  int bank = emu::publish(x);
  T best = emu::lane_value<T>(bank, 0);
  for (int i = 1; i < emu::self.simd->width; ++i) best = metal::max(best, emu::lane_value<T>(bank, i));
  return best;
}

template <class T>
inline T simd_min(T x) {
  int bank = emu::publish(x);
  T best = emu::lane_value<T>(bank, 0);
  for (int i = 1; i < emu::self.simd->width; ++i) best = metal::min(best, emu::lane_value<T>(bank, i));
  return best;
}

template <class T>
inline T simd_broadcast(T x, uint from_lane) {
  int bank = emu::publish(x);
  return emu::lane_value<T>(bank, from_lane);
}

template <class T>
inline T simd_shuffle(T x, uint from_lane) {
  return simd_broadcast(x, from_lane);
}

// Metal: lanes whose source lane + delta is past the simdgroup keep their own value.
template <class T>
inline T simd_shuffle_down(T x, uint delta) {
  int bank = emu::publish(x);
  uint from = emu::self.lane + delta;
  return int(from) < emu::self.simd->width ? emu::lane_value<T>(bank, from) : x;
}

template <class T>
inline T simd_shuffle_xor(T x, uint mask) {
  int bank = emu::publish(x);
  uint from = emu::self.lane ^ mask;
  return int(from) < emu::self.simd->width ? emu::lane_value<T>(bank, from) : x;
}
