#include "kiln/runtime/cache_files.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>

namespace kiln {

namespace fs = std::filesystem;

namespace {
constexpr size_t kTrailerSize = 9 + 32 + 1;
}  // namespace

std::string checksum_trailer(std::string_view payload) {
  return "\nKILNSUM " + content_hash(payload) + "\n";
}

std::optional<std::string_view> verified_payload(std::string_view file) {
  if (file.size() < kTrailerSize) return std::nullopt;
  std::string_view trailer = file.substr(file.size() - kTrailerSize);
  if (!trailer.starts_with("\nKILNSUM ") || trailer.back() != '\n') return std::nullopt;
  std::string_view payload = file.substr(0, file.size() - kTrailerSize);
  if (content_hash(payload) != trailer.substr(9, 32)) return std::nullopt;
  return payload;
}

std::optional<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

fs::path temporary_path(const fs::path& dir, const std::string& what) {
  static std::atomic<uint64_t> counter{0};
  return dir / (".tmp-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" + what);
}

bool write_file(const fs::path& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  return static_cast<bool>(out);
}

bool write_atomically(const fs::path& path, std::string_view content) {
  fs::path tmp = temporary_path(path.parent_path(), path.filename().string());
  if (!write_file(tmp, content)) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return false;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  return !ec;
}

std::string default_cache_dir() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : std::string();
  };
  std::string dir = env("KILN_CACHE_DIR");
  if (!dir.empty()) return dir;
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/kiln";
  if (std::string home = env("HOME"); !home.empty()) return home + "/.cache/kiln";
  return "";
}

}  // namespace kiln
