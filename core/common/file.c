#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

static const char *kind_of(mode_t m) {
  return S_ISFIFO(m)  ? "a FIFO"
         : S_ISDIR(m) ? "a directory"
         : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "not a regular file";
}

tsr_status tsr_file_open(const char *path, int *fd) {
  *fd = -1;
  /* O_NONBLOCK: opening a FIFO must not wait for a writer before it is refused */
  const int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f < 0) return tsr_error_set(TSR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(f, &sb) != 0) {
    const int e = errno;
    close(f);
    return tsr_error_set(TSR_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(f);
    return tsr_error_set(TSR_ERR_IO, "%s: not a regular file (%s)", path, kind_of(sb.st_mode));
  }
  const int flags = fcntl(f, F_GETFL);
  if (flags >= 0) fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
  *fd = f;
  return TSR_OK;
}

tsr_status tsr_file_fopen(const char *path, FILE **out) {
  *out = NULL;
  int fd;
  tsr_status st = tsr_file_open(path, &fd);
  if (st != TSR_OK) return st;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    const int e = errno;
    close(fd);
    return tsr_error_set(TSR_ERR_IO, "%s: cannot open: %s", path, strerror(e));
  }
  *out = f;
  return TSR_OK;
}
