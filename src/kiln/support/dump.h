// Debug dumps (DESIGN.md 5): KILN_DUMP=traces,kernels (or all) prints the trace after each pass
// and each generated kernel's source to stderr; with KILN_DUMP_DIR set, each dump is written to a
// file of that folder instead (named by the dump: "0003-fuse.trace", "kernel-<key>.cu", ...).
#pragma once

#include <string>
#include <string_view>

namespace kiln {

// Whether KILN_DUMP names `what` ("traces", "kernels") or "all".
bool dump_enabled(std::string_view what);
// Writes `text` as the dump `name` (a file name) of the kind `what`, when that kind is enabled.
void dump(std::string_view what, const std::string& name, const std::string& text);

}  // namespace kiln
