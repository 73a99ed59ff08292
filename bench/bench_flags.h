// Host-only helpers shared by the benchmarks: fatal errors, --flags, a tiny JSON writer (the GPU
// machine has no JSON library). bench_util.h adds the CUDA helpers; benchmarks that run without
// CUDA (remote_read_bench) include this alone.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace sparsekv::bench {

[[noreturn]] inline void Fail(const std::string& message) {
  std::fprintf(stderr, "FATAL: %s\n", message.c_str());
  std::exit(1);
}

// ---- Flags: --name=value or --name value ----------------------------------------------------

class Flags {
 public:
  // `defaults` names every accepted flag and its default; anything else is an error.
  Flags(int argc, char** argv, std::map<std::string, std::string> defaults)
      : values_(std::move(defaults)) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::printf("flags (default):\n");
        for (const auto& [k, v] : values_) std::printf("  --%s (%s)\n", k.c_str(), v.c_str());
        std::exit(0);
      }
      if (arg.rfind("--", 0) != 0) Fail("unexpected argument '" + arg + "'");
      std::string name = arg.substr(2);
      std::string value;
      if (const size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        Fail("flag --" + name + " needs a value");
      }
      if (values_.count(name) == 0) Fail("unknown flag --" + name + " (try --help)");
      values_[name] = value;
    }
  }

  const std::string& Str(const std::string& name) const { return values_.at(name); }
  int64_t Int(const std::string& name) const { return ParseInt(name, Str(name)); }
  double Double(const std::string& name) const { return ParseDouble(name, Str(name)); }
  std::vector<std::string> StrList(const std::string& name) const { return Split(Str(name)); }
  std::vector<int64_t> IntList(const std::string& name) const {
    std::vector<int64_t> out;
    for (const std::string& item : Split(Str(name))) out.push_back(ParseInt(name, item));
    return out;
  }
  std::vector<double> DoubleList(const std::string& name) const {
    std::vector<double> out;
    for (const std::string& item : Split(Str(name))) out.push_back(ParseDouble(name, item));
    return out;
  }

 private:
  static std::vector<std::string> Split(const std::string& list) {
    std::vector<std::string> out;
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');) {
      if (!item.empty()) out.push_back(item);
    }
    return out;
  }
  static int64_t ParseInt(const std::string& name, const std::string& text) {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0') Fail("--" + name + ": '" + text + "' is not an integer");
    return v;
  }
  static double ParseDouble(const std::string& name, const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') Fail("--" + name + ": '" + text + "' is not a number");
    return v;
  }

  std::map<std::string, std::string> values_;
};

// ---- JSON (write-only) ------------------------------------------------------------------------

// Builds one JSON object or array as text. Non-finite numbers become null.
class Json {
 public:
  static Json Object() { return Json('{', '}'); }
  static Json Array() { return Json('[', ']'); }

  Json& Add(const std::string& key, double v) { return Raw(key, Number(v)); }
  Json& Add(const std::string& key, int64_t v) { return Raw(key, std::to_string(v)); }
  Json& Add(const std::string& key, int v) { return Add(key, static_cast<int64_t>(v)); }
  Json& Add(const std::string& key, bool v) { return Raw(key, v ? "true" : "false"); }
  Json& Add(const std::string& key, const std::string& v) { return Raw(key, Quote(v)); }
  Json& Add(const std::string& key, const char* v) { return Add(key, std::string(v)); }
  Json& Add(const std::string& key, const Json& v) { return Raw(key, v.str()); }
  Json& Push(const Json& v) { return Raw("", v.str()); }
  Json& Push(const std::string& v) { return Raw("", Quote(v)); }

  std::string str() const { return text_ + close_; }

  static std::string Number(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    return buf;
  }

 private:
  Json(char open, char close) : text_(1, open), close_(1, close) {}
  Json& Raw(const std::string& key, const std::string& value) {
    if (!first_) text_ += ",\n";
    first_ = false;
    if (close_ == "}") text_ += Quote(key) + ": ";
    text_ += value;
    return *this;
  }
  static std::string Quote(const std::string& s) {
    std::string out = "\"";
    for (const char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }

  std::string text_;
  std::string close_;
  bool first_ = true;
};

inline void WriteFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) Fail("cannot open " + path + " for writing");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) Fail("cannot write " + path);
}

}  // namespace sparsekv::bench
