#include "common/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace k3 {
namespace {

// Closes the descriptor on every path out of open(); the mapping itself outlives it.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) return io_error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) return io_error("cannot stat '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return io_error("'" + path + "' is not a regular file");
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (p == MAP_FAILED) return io_error("cannot mmap '" + path + "': " + std::strerror(errno));
    data = static_cast<const uint8_t*>(p);
  }
  return std::shared_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace k3
