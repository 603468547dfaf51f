// Two error channels, always on (DESIGN.md section 5):
//  * KILN_CHECK(cond) << msg   — the user's mistake. Throws kiln::UserError whose message is a full
//    sentence naming the op, the user's source line and the fix.
//  * KILN_ASSERT(cond) << msg  — kiln's own bug. Throws kiln::InternalError.
// Both throw instead of aborting so that a bad input never takes the process down.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

// A mistake in the user's program or input: bad shapes, dtypes, indices, malformed trace text.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A malformed trace file: the message is already `file:line:col: error: ...`.
class ParseError : public UserError {
 public:
  using UserError::UserError;
};

// A program kiln cannot compile (yet), though eager PyTorch runs it: the message names the op,
// the source line and what to do instead. Loud, never wrong (DESIGN.md section 1).
class UnsupportedError : public UserError {
 public:
  using UserError::UserError;
};

// An index tensor holds a position outside the dim it indexes (index_select, index_copy, ...):
// raised before the kernel that would use it runs. Python sees an IndexError, as eager raises.
class IndexOutOfRange : public UserError {
 public:
  using UserError::UserError;
};

// A bug in kiln itself.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

// Collects a message with operator<< and throws when the full expression ends.
template <class E>
class Thrower {
 public:
  Thrower(const char* prefix, const char* file, int line) {
    if (prefix) stream_ << prefix;
    file_ = file;
    line_ = line;
  }
  Thrower(const Thrower&) = delete;
  template <class T>
  Thrower& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  // The location is appended as text (std::to_string, not the stream's number formatting): on
  // the H100 machine (GCC 13 headers, libstdc++ 6.0.33) formatting the int here crashed the
  // process instead of raising.
  [[noreturn]] ~Thrower() noexcept(false) {
    std::string message = stream_.str();
    if constexpr (std::is_same_v<E, InternalError>) {
      message += std::string(" [kiln internal error at ") + file_ + ":" + std::to_string(line_) +
                 "; please report it]";
    }
    throw E(message);
  }

 private:
  std::ostringstream stream_;
  const char* file_;
  int line_;
};

// Lets `KILN_CHECK(c) << a << b` be one expression whose stream part only runs when c fails.
struct Voidify {
  template <class T>
  void operator&(T&&) {}
};

}  // namespace detail

// The op and source location a user error is about. Scoped: the builder and the interpreter set
// it while they work on one node, so that every KILN_CHECK message can name them.
struct ErrorContext {
  std::string op;
  std::string location;  // "file:line", may be empty
};

// Prefix for a user error: "kiln: <op> at <file:line>: ".
std::string user_error_prefix();

class ScopedErrorContext {
 public:
  ScopedErrorContext(std::string op, std::string location);
  ~ScopedErrorContext();
  ScopedErrorContext(const ScopedErrorContext&) = delete;
  ScopedErrorContext& operator=(const ScopedErrorContext&) = delete;

 private:
  ErrorContext saved_;
};

}  // namespace kiln

#define KILN_CHECK(cond)                                                               \
  (cond) ? (void)0                                                                     \
         : ::kiln::detail::Voidify() &                                                 \
               ::kiln::detail::Thrower<::kiln::UserError>(nullptr, __FILE__, __LINE__) \
                   << ::kiln::user_error_prefix()

#define KILN_ASSERT(cond)                                      \
  (cond) ? (void)0                                             \
         : ::kiln::detail::Voidify() &                         \
               ::kiln::detail::Thrower<::kiln::InternalError>( \
                   "kiln internal error: assertion `" #cond "` failed: ", __FILE__, __LINE__)

#define KILN_UNSUPPORTED(cond)                                                                \
  (cond) ? (void)0                                                                            \
         : ::kiln::detail::Voidify() &                                                        \
               ::kiln::detail::Thrower<::kiln::UnsupportedError>(nullptr, __FILE__, __LINE__) \
                   << ::kiln::user_error_prefix() << "not supported by kiln: "

#define KILN_USER_ERROR()                                                 \
  ::kiln::detail::Thrower<::kiln::UserError>(nullptr, __FILE__, __LINE__) \
      << ::kiln::user_error_prefix()
