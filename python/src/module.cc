// The `_cachegen` extension behind `import cachegen` (python/cachegen/).
#include "bindings.h"

#include "cachegen/cachegen.h"

namespace cachegen::python {
namespace {

// Exception types, created once when the module loads and kept for the
// process (a static py::object would be released after the interpreter).
PyObject* error_type = nullptr;
PyObject* not_found_type = nullptr;
PyObject* corrupt_type = nullptr;

}  // namespace

void Raise(const Status& status) {
  const std::string& msg = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      throw py::value_error(msg);
    case StatusCode::kIOError:
      PyErr_SetString(PyExc_OSError, msg.c_str());
      throw py::error_already_set();
    case StatusCode::kNotFound:
      PyErr_SetString(not_found_type, msg.c_str());
      throw py::error_already_set();
    case StatusCode::kCorrupt:
      PyErr_SetString(corrupt_type, msg.c_str());
      throw py::error_already_set();
    default:
      PyErr_SetString(error_type, status.ToString().c_str());
      throw py::error_already_set();
  }
}

std::span<const uint8_t> BytesSpan(const py::bytes& bytes) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(bytes.ptr(), &data, &size) != 0) throw py::error_already_set();
  return {reinterpret_cast<const uint8_t*>(data), static_cast<size_t>(size)};
}

py::bytes ToBytes(std::span<const uint8_t> data) {
  return py::bytes(reinterpret_cast<const char*>(data.data()), data.size());
}

}  // namespace cachegen::python

PYBIND11_MODULE(_cachegen, m) {
  namespace py = pybind11;
  using namespace cachegen::python;
  m.doc() = "cachegen: compress transformer KV caches, store them by chunk and stream them back";
  m.attr("__version__") = cg_version();
  error_type = py::exception<std::runtime_error>(m, "Error", PyExc_RuntimeError).release().ptr();
  not_found_type = py::exception<std::out_of_range>(m, "NotFoundError", error_type).release().ptr();
  corrupt_type = py::exception<std::domain_error>(m, "CorruptError", error_type).release().ptr();
  BindCodec(m);
  BindProfiles(m);
  BindStore(m);
  BindStream(m);
}
