#pragma once
// The parts of the _pulse extension module, each bound by its own file.
#include <pybind11/pybind11.h>

#include <cstring>
#include <optional>
#include <string>

#include "coding/signing.hpp"
#include "core/error.hpp"

namespace pulse::python {

// A patch that cannot be parsed or applied (pulse.PatchError); the state is unchanged.
class PatchError : public Error {
 public:
  using Error::Error;
};

// A key (sync::PublicKey or SecretKey) from Python bytes of exactly its size.
template <class Key>
Key key_from_bytes(const pybind11::bytes& b, const char* what) {
  const std::string s = b;
  Key k;
  PULSE_CHECK(s.size() == k.size(), std::string(what) + " must be " + std::to_string(k.size()) + " bytes, got " +
                                        std::to_string(s.size()));
  std::memcpy(k.data(), s.data(), k.size());
  return k;
}

// The public_key argument of apply, decode and SlicedApply: none, or 32 bytes.
inline std::optional<sync::PublicKey> public_key_from(const std::optional<pybind11::bytes>& b) {
  if (!b) return std::nullopt;
  return key_from_bytes<sync::PublicKey>(*b, "public_key");
}

// A patch's bytes (any buffer), pinned while parse and apply read them without the GIL.
struct PatchBytes {
  pybind11::buffer_info info;
  explicit PatchBytes(const pybind11::buffer& b) : info(b.request()) {}
  const std::uint8_t* data() const { return static_cast<const std::uint8_t*>(info.ptr); }
  std::size_t size() const { return std::size_t(info.size * info.itemsize); }
};

void bind_sync(pybind11::module_& m);    // sync_bindings.cpp
void bind_decode(pybind11::module_& m);  // decode_bindings.cpp
void bind_stats(pybind11::module_& m);   // stats_bindings.cpp
void bind_sliced(pybind11::module_& m);  // sliced_bindings.cpp
void bind_recorder(pybind11::module_& m);  // recorder_bindings.cpp

}  // namespace pulse::python
