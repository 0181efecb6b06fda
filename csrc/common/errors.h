// Error helpers shared by the native core. Every failure becomes a C++
// exception whose message names the operation, the file and the fix; the
// binding layer turns them into Python exceptions without losing the text.
#pragma once

#include <cerrno>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace lsm {

// Builds a message from any streamable pieces: lsm::cat("row ", id, " of ", n).
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Throws std::system_error carrying errno, naming the call that failed.
[[noreturn]] inline void throw_errno(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), what);
}

}  // namespace lsm

// Checks a POSIX call that returns -1 and sets errno on failure.
#define LSM_CHECK_SYSCALL(expr, ...)                              \
  do {                                                            \
    if ((expr) < 0) {                                             \
      const int lsm_saved_errno_ = errno;                         \
      ::lsm::throw_errno(lsm_saved_errno_, ::lsm::cat(__VA_ARGS__)); \
    }                                                             \
  } while (0)

// Checks a condition on user input; raises std::invalid_argument (ValueError).
#define LSM_CHECK_ARG(cond, ...)                                  \
  do {                                                            \
    if (!(cond)) throw std::invalid_argument(::lsm::cat(__VA_ARGS__)); \
  } while (0)
