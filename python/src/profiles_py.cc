// Model profiles (.cgprof): load, train from captured KV, measured
// sensitivities, and the ProfileSet decoders are given.
#include <pybind11/stl.h>

#include "bindings.h"
#include "cachegen/profile.h"

namespace cachegen::python {
namespace {

std::shared_ptr<Profile> Mutable(std::shared_ptr<const Profile> p) { return std::const_pointer_cast<Profile>(p); }

std::shared_ptr<Profile> Train(const py::sequence& contexts, const CodecConfig& config, bool key_transform,
                               bool key_channel_classes, bool value_transform, bool value_channel_classes,
                               double channel_weight_strength) {
  std::vector<KVBuffer> buffers;
  std::vector<KVView> views;
  for (const py::handle c : contexts) {
    buffers.push_back(ViewOfBuffer(c.cast<py::buffer>(), "", /*writable=*/false));
    views.push_back(buffers.back().view);
  }
  ProfileTrainOptions options;
  options.key_transform = key_transform;
  options.key_channel_classes = key_channel_classes;
  options.value_transform = value_transform;
  options.value_channel_classes = value_channel_classes;
  options.channel_weight_strength = channel_weight_strength;
  Result<std::shared_ptr<const Profile>> p = Status::Internal("not run");
  {
    py::gil_scoped_release release;
    p = Profile::Train(views, config, options);
  }
  return Mutable(Unwrap(std::move(p)));
}

}  // namespace

void BindProfiles(py::module_& m) {
  py::class_<Profile, std::shared_ptr<Profile>>(
      m, "Profile", "A model profile (.cgprof): side information learned from one model's KV; immutable")
      .def_static(
          "from_bytes", [](py::bytes b) { return Mutable(Unwrap(Profile::Parse(BytesSpan(b)))); }, py::arg("data"),
          "Validates a .cgprof's bytes (untrusted: every field checked)")
      .def_static("train", &Train, py::arg("contexts"), py::arg("config"), py::arg("key_transform") = true,
                  py::arg("key_channel_classes") = true, py::arg("value_transform") = false,
                  py::arg("value_channel_classes") = false, py::arg("channel_weight_strength") = 0.0,
                  "Learns a profile from whole contexts ([L, 2, T, H, D] arrays, tokens at positions 0..T-1, "
                  "keys as cached); the coding domain follows config (its rope, rotate and group size)")
      .def(
          "with_sensitivity",
          [](const Profile& p, const std::vector<float>& per_section, const std::vector<float>& steps,
             const std::vector<float>& kl, float q8_kl) {
            SensitivityCurve curve;
            curve.steps = steps;
            curve.kl = kl;
            curve.q8_kl = q8_kl;
            return Mutable(Unwrap(p.WithSensitivity(per_section, curve)));
          },
          py::arg("per_section"), py::arg("steps") = std::vector<float>{}, py::arg("kl") = std::vector<float>{},
          py::arg("q8_kl") = 0.0f, "A copy holding the model's measured sensitivity per section (another id)")
      .def_property_readonly("id", &Profile::id)
      .def_property_readonly("data", [](const Profile& p) { return ToBytes(p.bytes()); }, "The .cgprof bytes")
      .def_property_readonly("layers", &Profile::layers)
      .def_property_readonly("kv_heads", &Profile::kv_heads)
      .def_property_readonly("head_dim", &Profile::head_dim)
      .def_property_readonly("quantizer",
                             [](const Profile& p) -> py::object {
                               auto q = p.quantizer();
                               if (!q) return py::none();
                               return py::str(*q == CodecConfig::Quantizer::kLloyd ? "lloyd" : "uniform");
                             })
      .def("__repr__", [](const Profile& p) {
        char id[17];
        std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(p.id()));
        return "<cachegen.Profile " + std::string(id) + " layers=" + std::to_string(p.layers()) + ">";
      });

  py::class_<ProfileSet, std::shared_ptr<ProfileSet>>(
      m, "ProfileSet", "The profiles a decode may use, found by the id a frame references; thread-safe")
      .def(py::init([](const std::vector<std::shared_ptr<Profile>>& profiles) {
             auto set = std::make_shared<ProfileSet>();
             for (const auto& p : profiles) set->Add(p);
             return set;
           }),
           py::arg("profiles") = std::vector<std::shared_ptr<Profile>>{})
      .def("add", [](ProfileSet& s, std::shared_ptr<Profile> p) { s.Add(std::move(p)); }, py::arg("profile"))
      .def("find", [](const ProfileSet& s, uint64_t id) { return Mutable(s.Find(id)); }, py::arg("id"))
      .def("__len__", &ProfileSet::size);
}

}  // namespace cachegen::python
