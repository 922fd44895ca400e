#include "fatal_error.h"

#include <cstdio>

#include <c10/util/Exception.h>

#include <ddp/errors.h>

namespace examples {

int report_fatal_error(const char* program, const std::exception& error) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&error);
  std::fprintf(stderr, "%s: error: %s\n", program,
               torch_error != nullptr ? torch_error->what_without_backtrace() : error.what());
  return dynamic_cast<const ddp::UsageError*>(&error) != nullptr ? 2 : 1;
}

}  // namespace examples
