// Metal's address-space qualifiers, last of all (they would break `std::thread` and friends).
// `threadgroup` variables become function-local statics: one copy shared by every thread of
// the threadgroup, which is right because the driver runs one threadgroup at a time.
#pragma once
#define device
#define constant
#define thread
#define threadgroup static
