#include "kiln/python/dict_watch.h"

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace nb = nanobind;

namespace kiln::python {

namespace {

#if PY_VERSION_HEX >= 0x030C0000
// Changes of every dict some DictWatch watches (watcher callbacks run with the GIL held).
std::atomic<uint64_t> changes{0};
int watcher_id = -1;

int on_change(PyDict_WatchEvent, PyObject*, PyObject*, PyObject*) {
  changes.fetch_add(1, std::memory_order_relaxed);
  return 0;
}
#endif

class DictWatch {
 public:
  explicit DictWatch(const nb::list& dicts) {
    for (nb::handle d : dicts) {
      if (!PyDict_Check(d.ptr())) throw nb::type_error("DictWatch watches dicts only");
      dicts_.push_back(nb::borrow<nb::object>(d));  // held: a freed dict's address is reused
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (watcher_id < 0) {
      watcher_id = PyDict_AddWatcher(on_change);
      if (watcher_id < 0) throw nb::python_error();
    }
    for (const nb::object& d : dicts_)
      if (PyDict_Watch(watcher_id, d.ptr()) < 0) throw nb::python_error();
    seen_ = changes.load(std::memory_order_relaxed);
#else
    for (const nb::object& d : dicts_)
      versions_.push_back(reinterpret_cast<PyDictObject*>(d.ptr())->ma_version_tag);
#endif
  }

  // True when no watched dict has changed since the watch was made.
  bool unchanged() const {
#if PY_VERSION_HEX >= 0x030C0000
    return changes.load(std::memory_order_relaxed) == seen_;
#else
    for (size_t i = 0; i < dicts_.size(); ++i)
      if (reinterpret_cast<PyDictObject*>(dicts_[i].ptr())->ma_version_tag != versions_[i])
        return false;
    return true;
#endif
  }

 private:
  std::vector<nb::object> dicts_;
#if PY_VERSION_HEX >= 0x030C0000
  uint64_t seen_ = 0;
#else
  std::vector<uint64_t> versions_;
#endif
};

}  // namespace

void bind_dict_watch(nb::module_& m) {
  nb::class_<DictWatch>(m, "DictWatch")
      .def(nb::init<const nb::list&>(), nb::arg("dicts"),
           "Watches the dicts (held until the watch is freed) for any change.")
      .def("unchanged", &DictWatch::unchanged,
           "True when none of the dicts has changed since the watch was made (on Python 3.12 and "
           "later: no dict any watch watches).");
}

}  // namespace kiln::python
