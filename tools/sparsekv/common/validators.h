// Checks of option values for the `sparsekv` subcommands, with the allowed range said in words.
// Read each value as the type of the field it is stored in (`AtLeast<int32_t>` for an int32_t).
//
// CLI11's own CLI::Range and CLI::PositiveNumber print their bounds in full ("not in range 0 to
// 1797...", the 309-digit largest double); these print "--batch: must be >= 1 (got 0)". Attach
// them with `->check(...)`; on a delimited option each value is checked.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>

namespace sparsekv::tools {
namespace validators_internal {

template <typename T>
std::string Text(T value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// True if `input` is a whole number written in decimal, of any size.
inline bool IsWholeNumber(const std::string& input) {
  const size_t digits = !input.empty() && (input[0] == '-' || input[0] == '+') ? 1 : 0;
  return input.size() > digits &&
         input.find_first_not_of("0123456789", digits) == std::string::npos;
}

// Reads `input` as a T; false (and `error` set) if it is not one. A whole number beyond an
// integral T's range says the range from `lo`.
template <typename T>
bool Read(const std::string& input, T& value, std::string& error,
          T lo = std::numeric_limits<T>::lowest()) {
  if (CLI::detail::lexical_cast(input, value)) return true;
  if (std::is_integral_v<T> && IsWholeNumber(input)) {
    error = "must be in [" + Text(lo) + ", " + Text(std::numeric_limits<T>::max()) + "] (got " +
            input + ")";
    return false;
  }
  error = std::is_integral_v<T> ? "must be a whole number" : "must be a number";
  error += " (got '" + input + "')";
  return false;
}

}  // namespace validators_internal

// lo <= value <= hi, read as T (int64_t for whole numbers, double for real ones).
template <typename T>
CLI::Validator Between(T lo, T hi) {
  namespace in = validators_internal;
  const std::string words = "must be in [" + in::Text(lo) + ", " + in::Text(hi) + "]";
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        T value{};
        std::string error;
        if (!in::Read(input, value, error, lo)) {
          return in::IsWholeNumber(input) ? words + " (got " + input + ")" : error;
        }
        // Also refuses NaN for reals.
        return value >= lo && value <= hi ? "" : words + " (got " + input + ")";
      },
      "[" + in::Text(lo) + ", " + in::Text(hi) + "]");
}

// value >= lo, read as T: the option's own type (int32_t for an int32_t field, so that a value
// beyond it says the range rather than failing to convert).
template <typename T>
CLI::Validator AtLeast(T lo) {
  namespace in = validators_internal;
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        T value{};
        std::string error;
        if (!in::Read(input, value, error, lo)) return error;
        return value >= lo ? "" : "must be >= " + in::Text(lo) + " (got " + input + ")";
      },
      ">= " + in::Text(lo));
}

// A real number > 0 (and finite).
inline CLI::Validator PositiveReal() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        double value = 0;
        std::string error;
        if (!validators_internal::Read(input, value, error)) return error;
        return value > 0 && value < 1e300 ? "" : "must be a number > 0 (got " + input + ")";
      },
      "> 0");
}

// A fraction in [0, 1].
inline CLI::Validator Fraction() { return Between(0.0, 1.0); }

// A whole number >= 0 written without a sign, for unsigned options such as seeds (CLI11 would
// otherwise turn -1 into 2^64 - 1).
inline CLI::Validator Unsigned() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        const bool digits =
            !input.empty() && input.find_first_not_of("0123456789") == std::string::npos;
        uint64_t value = 0;
        const char* end = input.data() + input.size();
        const auto [stop, error] = std::from_chars(input.data(), end, value);
        if (digits && error == std::errc() && stop == end) return "";
        return "must be a whole number in [0, 2^64) (got '" + input + "')";
      },
      ">= 0");
}

// A non-empty string (names, ids, prefixes).
inline CLI::Validator NonEmpty() {
  return CLI::Validator(
      [](std::string& input) -> std::string { return input.empty() ? "must not be empty" : ""; },
      "NON-EMPTY");
}

}  // namespace sparsekv::tools
