// Splitting text into words and parsing numbers without iostreams: the library's descriptors and
// handles are parsed in host processes (a Python interpreter with other C++ extensions loaded,
// say) whose iostreams may not behave as the library was built to expect.
#pragma once

#include <charconv>
#include <string_view>
#include <system_error>
#include <vector>

namespace sparsekv::text {

// The words of `text`, separated by runs of spaces.
inline std::vector<std::string_view> Words(std::string_view text) {
  std::vector<std::string_view> words;
  size_t at = 0;
  while (true) {
    const size_t begin = text.find_first_not_of(' ', at);
    if (begin == std::string_view::npos) break;
    const size_t end = text.find(' ', begin);
    words.push_back(text.substr(begin, end == std::string_view::npos ? end : end - begin));
    if (end == std::string_view::npos) break;
    at = end;
  }
  return words;
}

// True if all of `text` is a number of T's range in base `base` (then stored in *out).
template <typename T>
bool ParseNumber(std::string_view text, T* out, int base = 10) {
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(text.data(), last, *out, base);
  return error == std::errc() && end == last && !text.empty();
}

}  // namespace sparsekv::text
