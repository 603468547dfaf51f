// DictWatch: whether any of a set of Python dicts changed since it was made, in O(1) or one
// pass in C. kiln._state keeps one per kiln.jit function over its modules' __dict__,
// _parameters, _buffers and _modules, so a call of a whole model reads its slots and guards
// again only after something changed (a .train(), a replaced parameter, a new attribute value)
// instead of walking every module on every call.
//   Python 3.12 and later: a dict watcher (PyDict_AddWatcher) counts every change of a watched
//   dict; the watch compares that count with the one it was made at (any change of any dict any
//   DictWatch watches makes every watch stale: conservative, and changes between calls are rare).
//   Earlier: PEP 509's ma_version_tag, which changes with every change of that dict.
#pragma once

#include <nanobind/nanobind.h>

namespace kiln::python {

void bind_dict_watch(nanobind::module_& m);

}  // namespace kiln::python
