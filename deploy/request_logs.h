// The nodes' log files of a local cluster (k3-cluster --log-dir DIR: every child's output lines, which
// carry its log lines, and its stderr go to DIR/<node>.log) and one request's path through them: the lines that name its request id (router,
// every prefill stage, decode), from every file, in time order. Log lines start with spdlog's
// "[YYYY-MM-DD HH:MM:SS.mmm]" stamp, which sorts as text; all nodes of a local cluster share one clock.
#pragma once
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3::deploy {

// The log file of node `node` ("router", "prefill/p/0", ...) in `dir`: '/' becomes '_'.
std::string node_log_path(const std::string& dir, const std::string& node);

// The launcher's writer of those files: one per node, opened on its first line, appended to (a restarted
// node continues its file), flushed per line so `k3-cluster logs` sees what was said so far.
class NodeLogFiles {
 public:
  explicit NodeLogFiles(std::string dir) : dir_(std::move(dir)) {}
  void append(const std::string& node, const std::string& line);

 private:
  std::string dir_;
  std::map<std::string, std::ofstream> files_;
};

struct RequestLogLine {
  std::string node;   // the file's node name ('_' for '/', as node_log_path wrote it)
  std::string stamp;  // "[YYYY-MM-DD HH:MM:SS.mmm]" or "" when the line has none
  std::string text;   // the whole line
};

// Every line of every *.log file in `dir` that names `request_id` as a whole word (not a longer id it is a
// prefix of), ordered by stamp (stable: a file's own order among equal stamps). Errors: the directory is
// missing or unreadable, or the id is empty.
Result<std::vector<RequestLogLine>> request_log_lines(const std::string& dir, const std::string& request_id);

}  // namespace k3::deploy
