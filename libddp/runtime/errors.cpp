#include <ddp/errors.h>

namespace ddp {

std::string first_line_of(const std::exception& error) {
  const std::string what = error.what();
  return what.substr(0, what.find('\n'));
}

}  // namespace ddp
