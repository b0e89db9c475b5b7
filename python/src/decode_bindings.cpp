// pulse.decode: a patch decoded against the receiver's state without writing it, for tensors
// pulse does not own (GPU parameters, an inference engine's buffers). Checked as apply checks
// it: structure, sizes, checksum and signature (parse_patch), the receiver's layout and base
// digest, every index and value, and the target state digest of base + changes, all through
// sync::PatchDecoder; nothing is handed back unless every check passed.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "bindings.hpp"
#include "state.hpp"
#include "sync/patch.hpp"
#include "sync/relay.hpp"

namespace py = pybind11;
using namespace pulse::sync;

namespace pulse::python {
namespace {

// A vector handed to Python without a copy: a 1-D numpy array of T that owns it.
template <class T>
py::object owned_array(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({py::ssize_t(owned->size())}, {py::ssize_t(sizeof(T))}, owned->data(), owner);
}

// One decoded entry that writes something, its arrays owned here until Python takes them.
struct Decoded {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  bool added = false;
  EntryKind kind = EntryKind::same;
  std::vector<std::int64_t> indices;  // sparse: flat element indices, sorted
  std::vector<std::uint8_t> values;   // sparse: new values, width bytes each; whole: the new bytes
};

py::dict decode(const py::list& base, const std::map<std::string, std::string>& metadata,
                const py::buffer& patch_buffer, const std::optional<py::bytes>& public_key, unsigned threads) {
  const std::optional<PublicKey> key = public_key_from(public_key);
  const StateBuffers s = state_buffers(base, false);
  const PatchBytes patch(patch_buffer);
  std::vector<Decoded> out;
  ParsedPatch p;
  Digest target_state{};
  try {
    py::gil_scoped_release release;
    PatchLimits limits;
    limits.max_patch_bytes = patch_bytes_limit(s.refs);
    p = parse_patch(patch.data(), patch.size(), limits, key ? &*key : nullptr);
    PatchDecoder decoder(p, s.refs, /*hash_targets=*/true, nullptr, threads);
    const StateDigests before = compute_digests(s.refs, metadata, threads);
    decoder.check_base(before.state);
    std::vector<TensorRef> target_refs;
    std::vector<Digest> after;
    for (std::size_t k = 0; k < decoder.size(); ++k) {
      DecodedEntry w = decoder.next();
      // The target tensor: an added one (patch.added[tensor]) or the base's (its sparse changes
      // hashed by the decoder, or its new bytes carried whole).
      TensorRef target = w.added ? TensorRef{p.added[w.tensor].name, p.added[w.tensor].dtype, p.added[w.tensor].shape}
                                 : s.refs[w.tensor];
      if (w.kind == EntryKind::whole) target.data = reinterpret_cast<const std::byte*>(w.whole);
      target.bytes = std::size_t(w.bytes);
      after.push_back(w.touched() ? w.digest : before.tensors.at(target.name));
      target_refs.push_back(target);
      if (!w.touched()) continue;
      Decoded d{target.name, target.dtype, target.shape, w.added, w.kind, {}, {}};
      if (w.kind == EntryKind::whole) {
        d.values.assign(w.whole, w.whole + w.bytes);
      } else {
        d.indices.assign(w.indices.begin(), w.indices.end());
        d.values = std::move(w.values);
      }
      out.push_back(std::move(d));
    }
    decoder.finish();
    target_state = state_digest(target_refs, after, p.header.changes_metadata ? p.metadata : metadata);
    decoder.check_target(target_state);
  } catch (const Error& e) {
    throw PatchError(e.what());
  }
  py::list changes, whole, added;
  for (auto& d : out) {
    const py::tuple shape = py::cast(d.shape);
    if (d.kind == EntryKind::sparse)
      changes.append(py::make_tuple(d.name, d.dtype, shape, owned_array(std::move(d.indices)),
                                    owned_array(std::move(d.values))));
    else
      (d.added ? added : whole).append(py::make_tuple(d.name, d.dtype, shape, owned_array(std::move(d.values))));
  }
  py::dict r;
  r["base_version"] = p.header.base_version;
  r["target_version"] = p.header.target_version;
  r["base_digest"] = to_hex(p.header.base_state);
  r["target_digest"] = to_hex(target_state);
  r["signed"] = p.header.is_signed;
  r["changes"] = changes;
  r["whole"] = whole;
  r["added"] = added;
  r["removed"] = p.removed;
  r["metadata"] = p.header.changes_metadata ? py::cast(p.metadata) : py::none();
  return r;
}

}  // namespace

void bind_decode(py::module_& m) {
  m.def("decode", &decode, py::arg("base"), py::arg("metadata"), py::arg("patch"), py::arg("public_key"),
        py::arg("threads") = 0);
}

}  // namespace pulse::python
