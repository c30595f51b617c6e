#include "deploy/request_logs.h"

#include <algorithm>
#include <filesystem>
#include <cctype>
#include <fstream>
#include <string_view>

namespace k3::deploy {

namespace fs = std::filesystem;

std::string node_log_path(const std::string& dir, const std::string& node) {
  std::string file = node;
  std::replace(file.begin(), file.end(), '/', '_');
  return dir + "/" + file + ".log";
}

void NodeLogFiles::append(const std::string& node, const std::string& line) {
  auto it = files_.find(node);
  if (it == files_.end()) it = files_.emplace(node, std::ofstream(node_log_path(dir_, node), std::ios::app)).first;
  it->second << line << '\n';
  it->second.flush();
}

namespace {

// Request ids are printable ASCII without spaces (router/request_id.h); in a log line they end at a
// space or punctuation a message puts after them. A match followed by another id character is a longer id.
bool id_char(char c) {
  return std::isgraph(static_cast<unsigned char>(c)) && std::string_view(",;:()[]\"'").find(c) == std::string_view::npos;
}

bool names_id(const std::string& line, const std::string& id) {
  for (size_t at = line.find(id); at != std::string::npos; at = line.find(id, at + 1)) {
    const bool starts = at == 0 || !id_char(line[at - 1]);
    const bool ends = at + id.size() == line.size() || !id_char(line[at + id.size()]);
    if (starts && ends) return true;
  }
  return false;
}

std::string stamp_of(const std::string& line) {
  // "[2026-12-01 20:33:00.123]": 25 characters.
  if (line.size() >= 25 && line[0] == '[' && line[24] == ']' && line[11] == ' ') return line.substr(0, 25);
  return "";
}

}  // namespace

Result<std::vector<RequestLogLine>> request_log_lines(const std::string& dir, const std::string& request_id) {
  if (request_id.empty()) return invalid_argument("request id: empty");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return invalid_argument("--log-dir: " + dir + " is not a directory");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".log") files.push_back(e.path());
  if (ec) return invalid_argument("--log-dir: cannot read " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  std::vector<RequestLogLine> out;
  for (const fs::path& f : files) {
    std::ifstream in(f);
    if (!in) return invalid_argument("--log-dir: cannot read " + f.string());
    const std::string node = f.stem().string();
    for (std::string line; std::getline(in, line);)
      if (names_id(line, request_id)) out.push_back({.node = node, .stamp = stamp_of(line), .text = line});
  }
  std::stable_sort(out.begin(), out.end(), [](const RequestLogLine& a, const RequestLogLine& b) { return a.stamp < b.stamp; });
  return out;
}

}  // namespace k3::deploy
