// PULSESync for Python: encode, apply, digest, inspect, diff, sender and receiver state, relay,
// safetensors files. Every call that touches tensor bytes releases the GIL while it works.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "bindings.hpp"
#include "compressed_copy.hpp"
#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "state.hpp"
#include "sync/checkpoint.hpp"
#include "sync/patch_summary.hpp"
#include "sync/relay.hpp"
#include "coding/signing.hpp"

namespace py = pybind11;
using namespace pulse::sync;

namespace pulse::python {
namespace {

struct Coding {
  std::string values, indices, compressor;
  int level;
  unsigned threads = 0;  // parts coded at once; 0: the cores
  EncodeOptions options(std::uint64_t base_version, std::uint64_t target_version, const SecretKey* key) const {
    EncodeOptions o;
    o.values = parse_value_coding(values);
    o.indices = parse_index_coding(indices);
    o.compressor = parse_compressor(compressor);
    o.level = level;
    o.base_version = base_version;
    o.target_version = target_version;
    o.signing_key = key;
    o.threads = threads;
    return o;
  }
};

py::bytes to_bytes(const std::vector<std::uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

py::bytes encode(const py::list& base, const py::list& target, std::uint64_t base_version, std::uint64_t target_version,
                 const Coding& coding, const std::optional<py::bytes>& signing_key) {
  std::optional<SecretKey> key;
  if (signing_key) key = key_from_bytes<SecretKey>(*signing_key, "signing_key");
  const StateBuffers b = state_buffers(base, false), t = state_buffers(target, false);
  std::vector<std::uint8_t> patch;
  {
    py::gil_scoped_release release;
    patch = encode_patch(b.refs, t.refs, coding.options(base_version, target_version, key ? &*key : nullptr));
  }
  return to_bytes(patch);
}

// What a committed patch changed beyond the bytes of kept tensors, for Python to mirror in its dict.
py::dict change_dict(std::uint64_t written, StateChange&& change) {
  py::dict out;
  out["written"] = written;
  out["removed"] = change.removed;
  py::list added;
  for (std::size_t i = 0; i < change.added.size(); ++i) {
    const auto& a = change.added[i];
    added.append(state_entry({a.name, a.dtype, a.shape, nullptr, 0}, std::move(change.added_bytes[i])));
  }
  out["added"] = added;
  return out;
}

// The digests of a state, hashed on `threads` threads (0: the cores), by ranges of blocks.
StateDigests digests_on(const std::vector<TensorRef>& refs, unsigned threads) { return compute_digests(refs, {}, threads); }

// The tensors whose digest differs between two digests of a state (or that only one holds), by name.
std::vector<std::string> changed_tensors(const StateDigests& kept, const StateDigests& now) {
  std::vector<std::string> changed;
  for (const auto& [name, d] : now.tensors) {
    const auto it = kept.tensors.find(name);
    if (it == kept.tensors.end() || it->second != d) changed.push_back(name);
  }
  for (const auto& [name, d] : kept.tensors)
    if (!now.tensors.count(name)) changed.push_back(name);
  return changed;
}

// Receives patches into a state held in Python. It keeps the digests of the version it last
// wrote, and hashes the state before each patch: a tensor that another writer changed since
// is named in a one-line refusal instead of the receiver diverging from the sender.
class Receiver {
 public:
  Receiver(const py::list& state, std::uint64_t version, unsigned threads) : version_(version), threads_(threads) {
    const StateBuffers s = state_buffers(state, false);
    py::gil_scoped_release release;
    digests_ = digests_on(s.refs, threads_);
  }

  // rehash false: the state is known to hold what this receiver hashed last (it was built over
  // it just now), so it is not hashed again.
  py::dict apply(const py::list& state, const py::buffer& patch_buffer, const std::optional<py::bytes>& public_key,
                 bool rehash) {
    const std::optional<PublicKey> key = public_key_from(public_key);
    const StateBuffers s = state_buffers(state, true);
    const PatchBytes patch(patch_buffer);
    std::uint64_t written = 0;
    StateChange change;
    try {
      py::gil_scoped_release release;
      const StateDigests now = rehash ? digests_on(s.refs, threads_) : digests_;
      if (rehash) check_unchanged(now);
      PatchLimits limits;
      limits.max_patch_bytes = patch_bytes_limit(s.refs);
      const ParsedPatch p = parse_patch(patch.data(), patch.size(), limits, key ? &*key : nullptr);
      auto tensors = s.mutables();
      StateDigests after;
      written = apply_patch(p, tensors, limits, &now, &after, {}, &change, nullptr, threads_);
      digests_ = std::move(after);  // by name: still the dict's once Python mirrors a layout change
      version_ = p.header.target_version;
    } catch (const Error& e) {
      throw PatchError(e.what());
    }
    return change_dict(written, std::move(change));
  }

  std::uint64_t version() const { return version_; }

 private:
  // Throws unless the state holds exactly the tensors (names and bytes) this receiver last wrote;
  // a dtype or shape changed over the same bytes is the decoder's layout check's.
  void check_unchanged(const StateDigests& now) const {
    const std::vector<std::string> changed = changed_tensors(digests_, now);
    if (changed.empty()) return;
    const std::string more = changed.size() > 1 ? " (and " + std::to_string(changed.size() - 1) + " more)" : "";
    throw Error("Receiver: tensor '" + changed.front() + "'" + more + " changed since this receiver wrote version " +
                std::to_string(version_) + ": another writer changed the dict, so it no longer holds that version; nothing written (undo the "
                "change, or build a new Receiver for the state as it is now)");
  }
  StateDigests digests_;
  std::uint64_t version_ = 0;
  unsigned threads_ = 0;  // 0: the cores
};

// Keeps the previous version's digests, and its bytes: a copy (the caller then writes the next
// version into the same tensors), a compressed copy (the same, in about 0.7 of the bytes for
// BF16 weights, for CPU time), or the caller's own tensors, which it hands back with the next
// state and must not have written in between (checked: they are hashed again first, unless
// rehash is false: a caller that owns them, as pulse.torch's recorder its versions).
class Sender {
 public:
  enum class Kept { copy, compressed, reference };

  Sender(const py::list& state, std::uint64_t version, const std::string& kept, unsigned threads)
      : kept_(parse_kept(kept)), version_(version) {
    const StateBuffers s = state_buffers(state, false);
    py::gil_scoped_release release;
    remember(s.refs, threads);
    digests_ = digests_on(s.refs, threads);
  }

  py::bytes patch(const py::list& state, const std::optional<py::list>& previous, const Coding& coding,
                  const std::optional<py::bytes>& signing_key, bool rehash) {
    std::optional<SecretKey> key;
    if (signing_key) key = key_from_bytes<SecretKey>(*signing_key, "signing_key");
    PULSE_CHECK(kept_ != Kept::reference || previous, "Sender: the version sent is needed");
    PULSE_CHECK(!lost_, "Sender: keeping version " + std::to_string(version_ + 1) +
                            " failed (out of memory?), so it is not held; build a new Sender");
    const StateBuffers t = state_buffers(state, false);
    std::optional<StateBuffers> held;
    if (kept_ == Kept::reference) held = state_buffers(*previous, false);
    std::vector<std::uint8_t> patch;
    {
      py::gil_scoped_release release;
      const std::vector<TensorRef> base = kept_ == Kept::reference ? held->refs
                                          : kept_ == Kept::copy    ? previous_refs()
                                                                   : compressed_.layout();
      if (kept_ == Kept::reference && rehash) {
        const auto changed = changed_tensors(digests_, digests_on(base, coding.threads));
        PULSE_CHECK(changed.empty(), "Sender(copy=False): tensor '" + (changed.empty() ? "" : changed.front()) +
                                         "' of version " + std::to_string(version_) +
                                         " was written after it was sent; give each version as new tensors, or "
                                         "use copy=True to write the next version into the same ones");
      }
      StateDigests after;
      const TensorLoader base_loader = kept_ == Kept::compressed ? compressed_.loader() : TensorLoader{};
      patch = encode_patch(base, t.refs, coding.options(version_, version_ + 1, key ? &*key : nullptr), &digests_,
                           &after, {}, {}, base_loader);
      try {
        remember(t.refs, coding.threads);
      } catch (...) {
        lost_ = true;  // the copy is part old, part new
        throw;
      }
      digests_ = std::move(after);
    }
    ++version_;
    return to_bytes(patch);
  }

  std::uint64_t version() const { return version_; }
  // The bytes this Sender holds of the version sent (none when it holds the caller's tensors).
  std::size_t kept_bytes() const {
    std::size_t total = 0;
    for (const auto& b : bytes_) total += b.size();
    return kept_ == Kept::compressed ? compressed_.stored_bytes() : total;
  }

 private:
  static Kept parse_kept(const std::string& kept) {
    if (kept == "copy") return Kept::copy;
    if (kept == "compressed") return Kept::compressed;
    PULSE_CHECK(kept == "reference", "Sender: keep the version sent as copy, compressed or reference, not " + kept);
    return Kept::reference;
  }
  std::vector<TensorRef> previous_refs() const {
    std::vector<TensorRef> refs = layout_;
    for (std::size_t i = 0; i < refs.size(); ++i) refs[i].data = bytes_[i].data(), refs[i].bytes = bytes_[i].size();
    return refs;
  }
  void remember(const std::vector<TensorRef>& refs, unsigned threads) {
    if (kept_ == Kept::compressed) compressed_.assign(refs, threads);
    if (kept_ != Kept::copy) return;
    layout_ = refs;
    bytes_.resize(refs.size());
    for (std::size_t i = 0; i < refs.size(); ++i) {
      bytes_[i].resize(refs[i].bytes);
      std::memcpy(bytes_[i].data(), refs[i].data, refs[i].bytes);
      layout_[i].data = nullptr;
    }
  }
  Kept kept_;
  std::vector<TensorRef> layout_;            // Kept::copy: the version sent in bytes_
  std::vector<std::vector<std::byte>> bytes_;
  CompressedCopy compressed_;                // Kept::compressed
  StateDigests digests_;
  std::uint64_t version_;
  bool lost_ = false;
};

py::list checkpoint_entries(Checkpoint&& c) {
  py::list out;
  for (std::size_t i = 0; i < c.layout.size(); ++i) out.append(state_entry(c.layout[i], std::move(c.data[i])));
  return out;
}

Checkpoint checkpoint_copy(const StateBuffers& s) {
  Checkpoint c;
  c.layout = s.refs;
  for (auto& t : c.layout) {
    c.data.emplace_back(t.data, t.data + t.bytes);
    t.data = c.data.back().data();
  }
  return c;
}

// pulse-sync diff --json and inspect --json's objects (sync/patch_summary.hpp), as Python dicts.
py::object json_object(const std::string& text) { return py::module_::import("json").attr("loads")(text); }

py::object diff(const py::list& base, const py::list& target) {
  const StateBuffers a = state_buffers(base, false), b = state_buffers(target, false);
  std::string text;
  {
    py::gil_scoped_release release;
    text = diff_json(diff_states(a.refs, b.refs, {}, {}, 0));  // dicts of tensors: no metadata
  }
  return json_object(text);
}

py::object inspect(const py::buffer& patch_buffer) {
  const PatchBytes patch(patch_buffer);
  std::string text;
  try {
    py::gil_scoped_release release;
    text = describe_patch(parse_patch(patch.data(), patch.size()));
  } catch (const Error& e) {
    throw PatchError(e.what());
  }
  return json_object(text);
}

}  // namespace

void bind_sync(py::module_& m) {
  py::class_<Coding>(m, "Coding")
      .def(py::init([](std::string values, std::string indices, std::string compressor, int level, unsigned threads) {
             return Coding{std::move(values), std::move(indices), std::move(compressor), level, threads};
           }),
           py::arg("values"), py::arg("indices"), py::arg("compressor"), py::arg("level"), py::arg("threads") = 0);

  m.def("encode", &encode, py::arg("base"), py::arg("target"), py::arg("base_version"), py::arg("target_version"),
        py::arg("coding"), py::arg("signing_key"));
  m.def("diff", &diff, py::arg("base"), py::arg("target"));
  m.def("inspect", &inspect, py::arg("patch"));
  m.def("digest", [](const py::list& state) {
    const StateBuffers s = state_buffers(state, false);
    py::gil_scoped_release release;
    return to_hex(state_digest(s.refs));
  });
  m.def("generate_keypair", [] {
    const KeyPair k = generate_keypair();
    return py::make_tuple(py::bytes(reinterpret_cast<const char*>(k.public_key.data()), k.public_key.size()),
                          py::bytes(reinterpret_cast<const char*>(k.secret_key.data()), k.secret_key.size()));
  });
  m.def("load", [](const std::string& path) {
    Checkpoint c;
    {
      py::gil_scoped_release release;
      c = load_checkpoint(path);
    }
    py::dict metadata = py::cast(c.metadata);
    return py::make_tuple(checkpoint_entries(std::move(c)), metadata);
  });
  m.def("save", [](const py::list& state, const std::string& path, const std::map<std::string, std::string>& metadata) {
    const StateBuffers s = state_buffers(state, false);
    std::vector<io::TensorToWrite> tensors;
    for (const auto& t : s.refs) tensors.push_back({t.name, io::parse_dtype(t.dtype), t.shape, t.data, t.bytes});
    py::gil_scoped_release release;
    io::write_safetensors(path, tensors, metadata);
  });

  // A flat state (tensors, the folder's files as __file__/ U8 tensors, the index among them)
  // written as a model folder: planned and checked first, written whole, swapped in.
  m.def("save_folder", [](const py::list& state, const std::string& path, const std::map<std::string, std::string>& metadata) {
    struct stat st {};
    PULSE_CHECK(::stat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode), path + " is a file; a model folder cannot replace it");
    const StateBuffers s = state_buffers(state, false);  // views of the caller's tensors, no copy
    py::gil_scoped_release release;
    save_state(path, s.refs, metadata, /*from_folder=*/true);
  });

  py::class_<Receiver>(m, "Receiver")
      .def(py::init<const py::list&, std::uint64_t, unsigned>(), py::arg("state"), py::arg("version"),
           py::arg("threads") = 0)
      .def("apply", &Receiver::apply, py::arg("state"), py::arg("patch"), py::arg("public_key"), py::arg("rehash") = true)
      .def_property_readonly("version", &Receiver::version);
  py::class_<Sender>(m, "Sender")
      .def(py::init<const py::list&, std::uint64_t, const std::string&, unsigned>(), py::arg("state"),
           py::arg("version"), py::arg("kept"), py::arg("threads") = 0)
      .def("patch", &Sender::patch, py::arg("state"), py::arg("previous"), py::arg("coding"), py::arg("signing_key"),
           py::arg("rehash") = true)
      .def_property_readonly("version", &Sender::version)
      .def_property_readonly("kept_bytes", &Sender::kept_bytes);

  py::class_<Relay>(m, "Relay")
      .def(py::init<std::string>())
      .def("head",
           [](const Relay& r, const std::optional<py::bytes>& public_key) -> py::object {
             const std::optional<PublicKey> key = public_key_from(public_key);
             const auto h = r.head(key ? &*key : nullptr);
             if (!h) return py::none();
             return py::dict(py::arg("version") = h->version, py::arg("state") = to_hex(h->state),
                             py::arg("signed") = h->is_signed, py::arg("relay") = h->relay);
           })
      .def("publish",
           [](Relay& r, std::uint64_t version, const py::list& state, const std::optional<py::list>& previous,
              std::uint64_t anchor_every, std::uint64_t keep_anchors, bool compress_anchors, const Coding& coding,
              const std::optional<py::bytes>& signing_key) {
             std::optional<SecretKey> key;
             if (signing_key) key = key_from_bytes<SecretKey>(*signing_key, "signing_key");
             PublishOptions o;
             o.anchor_every = anchor_every;
             o.keep_anchors = keep_anchors;
             o.compress_anchors = compress_anchors;
             o.encode = coding.options(0, 0, key ? &*key : nullptr);
             const StateBuffers s = state_buffers(state, false);
             std::optional<StateBuffers> p;
             if (previous) p = state_buffers(*previous, false);
             py::gil_scoped_release release;
             r.publish(version, s.refs, p ? &p->refs : nullptr, o);
           })
      .def("pull", [](const Relay& r, const std::optional<py::list>& have, std::uint64_t have_version,
                      const std::optional<py::bytes>& public_key, std::uint64_t min_version) {
        const std::optional<PublicKey> key = public_key_from(public_key);
        std::optional<Checkpoint> held;
        if (have) held = checkpoint_copy(state_buffers(*have, false));
        PullResult result;
        {
          py::gil_scoped_release release;
          PullOptions o;
          o.public_key = key ? &*key : nullptr;
          o.min_version = min_version;
          result = r.pull(held ? &*held : nullptr, have_version, o);
        }
        py::dict info;
        info["version"] = result.version;
        info["fast_path"] = result.fast_path;
        info["patches_applied"] = result.patches_applied;
        info["anchor"] = result.anchor;
        info["fallback"] = result.fallback;
        info["metadata"] = py::cast(result.state.metadata);
        return py::make_tuple(checkpoint_entries(std::move(result.state)), info);
      });
}

}  // namespace pulse::python
