#include "kiln/support/dump.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>

namespace kiln {

bool dump_enabled(std::string_view what) {
  const char* env = std::getenv("KILN_DUMP");
  if (!env || !*env) return false;
  std::string_view list(env);
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    if (item == what || item == "all") return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

void dump(std::string_view what, const std::string& name, const std::string& text) {
  if (!dump_enabled(what)) return;
  static std::mutex mutex;
  static std::atomic<int> counter{0};
  std::lock_guard<std::mutex> lock(mutex);
  const char* dir = std::getenv("KILN_DUMP_DIR");
  if (dir && *dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    char prefix[16];
    std::snprintf(prefix, sizeof prefix, "%04d-", counter++);
    std::ofstream(std::filesystem::path(dir) / (prefix + name)) << text;
    return;
  }
  std::cerr << "// ==== kiln dump: " << name << "\n" << text;
  if (!text.empty() && text.back() != '\n') std::cerr << "\n";
}

}  // namespace kiln
