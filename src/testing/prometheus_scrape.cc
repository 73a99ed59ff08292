#include "testing/prometheus_scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace sparsekv::testing {
namespace {

std::string Trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

}  // namespace

StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Unavailable(std::string("socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return Unavailable("connect to 127.0.0.1:" + std::to_string(port) + ": " + why);
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, 0);
    if (n <= 0) {
      close(fd);
      return Unavailable("send failed");
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) response.append(buffer, n);
  close(fd);
  const size_t end_of_headers = response.find("\r\n\r\n");
  if (end_of_headers == std::string::npos) return Internal("no HTTP response: " + response);
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (status_line.find(" 200 ") == std::string::npos) return Internal(status_line);
  return response.substr(end_of_headers + 4);
}

StatusOr<Exposition> ParseExposition(const std::string& text) {
  Exposition e;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    if (line.rfind("# TYPE ", 0) == 0 || line.rfind("# HELP ", 0) == 0) {
      const std::string rest = line.substr(7);
      const size_t space = rest.find(' ');
      if (space == std::string::npos) return InvalidArgument("bad line: " + line);
      (line[2] == 'T' ? e.types : e.help)[rest.substr(0, space)] = rest.substr(space + 1);
      continue;
    }
    if (line[0] == '#') continue;
    // name{labels} value [timestamp]; label values may hold spaces, so split after the '}'.
    const size_t brace = line.find('}');
    const size_t space = line.find(' ', brace == std::string::npos ? 0 : brace);
    if (space == std::string::npos) return InvalidArgument("bad sample: " + line);
    std::istringstream value(line.substr(space + 1));
    double v = 0;
    if (!(value >> v)) {
      const std::string word = Trim(line.substr(space + 1));
      if (word == "+Inf") {
        v = std::numeric_limits<double>::infinity();
      } else if (word == "NaN" || word == "Nan") {  // prometheus-cpp writes Nan
        v = std::numeric_limits<double>::quiet_NaN();
      } else {
        return InvalidArgument("bad value: " + line);
      }
    }
    e.samples[line.substr(0, space)] = v;
  }
  return e;
}

std::vector<DocumentedMetric> ReadDocumentedMetrics(const std::string& path) {
  std::vector<DocumentedMetric> metrics;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `sparsekv_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(Trim(cell));
    if (cells.size() < 4) continue;
    DocumentedMetric m;
    m.name = cells[0].substr(1, cells[0].find('`', 1) - 1);
    m.type = cells[1];
    m.source = cells[3];
    metrics.push_back(m);
  }
  return metrics;
}

}  // namespace sparsekv::testing
