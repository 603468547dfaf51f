#include "kiln/support/error.h"

namespace kiln {
namespace {
thread_local ErrorContext current_context;
}

std::string user_error_prefix() {
  std::string prefix = "kiln: ";
  if (!current_context.op.empty()) {
    prefix += current_context.op;
    if (!current_context.location.empty()) prefix += " at " + current_context.location;
    prefix += ": ";
  }
  return prefix;
}

ScopedErrorContext::ScopedErrorContext(std::string op, std::string location)
    : saved_(current_context) {
  current_context = ErrorContext{std::move(op), std::move(location)};
}

ScopedErrorContext::~ScopedErrorContext() {
  current_context = saved_;
}

}  // namespace kiln
