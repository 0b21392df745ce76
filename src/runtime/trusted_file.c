/* trusted_file.c — files clpar keeps on disk and later obeys (compiled kernel binaries, which
 * on a CPU device are native code run in the process; tuning parameters), read and written so
 * that no other user can plant or swap one.
 *
 * A cache entry's key is computable from public data and its checksum only detects damage,
 * so the entry is only as trustworthy as the directory and the file: clpar uses a directory
 * only when the current user owns it and neither group nor others may write it (it creates a
 * missing one 0700), and reads an entry only when it is a regular file the user owns, that
 * group and others may not write, of a bounded size. Entries are opened relative to the
 * directory's descriptor with O_NOFOLLOW (a symbolic link is refused, not followed) and
 * O_NONBLOCK (a FIFO planted at an entry's path cannot block the open), and checked with
 * fstat on the descriptor that is then read, so nothing can be swapped between check and use.
 * An entry is written to a new file (O_EXCL, 0600, an unpredictable name) in the same
 * directory, synced, and renamed over the old one, so a reader never sees half an entry and a
 * link at the path is replaced, never written through. The API is declared in
 * backends/backend.h, for backends. The other files clpar saves (checkpoints) are written the
 * same way (clpar_file_write_atomic, keeping the mode of the file replaced), and the files it
 * reads are opened by clpar_open_regular, which refuses anything but a regular file. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

/* What a stat mode is, for messages. */
static const char *file_kind(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

clpar_status clpar_open_regular(const char *path, int *fd, int64_t *size) {
  *fd = -1;
  *size = 0;
  int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f < 0) return clpar_set_error(CLPAR_ERROR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  clpar_status s = CLPAR_OK;
  if (fstat(f, &st) != 0)
    s = clpar_set_error(CLPAR_ERROR_IO, "cannot stat %s: %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    s = clpar_set_error(CLPAR_ERROR_IO, "%s is %s, not a regular file", path,
                        file_kind(st.st_mode));
  else if (fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK) != 0)
    s = clpar_set_error(CLPAR_ERROR_IO, "cannot read %s: %s", path, strerror(errno));
  if (s != CLPAR_OK) {
    close(f);
    return s;
  }
  *fd = f;
  *size = (int64_t)st.st_size;
  return CLPAR_OK;
}

/* The checks shared by directories and files: owned by this user, not writable by others. */
static clpar_status check_owner_mode(const char *what, const char *path, const struct stat *st) {
  uid_t me = geteuid();
  if (st->st_uid != me)
    return clpar_set_error(CLPAR_ERROR_IO, "%s %s is owned by uid %lu, not by this user (uid %lu)",
                           what, path, (unsigned long)st->st_uid, (unsigned long)me);
  if (st->st_mode & (S_IWGRP | S_IWOTH))
    return clpar_set_error(CLPAR_ERROR_IO,
                           "%s %s is writable by group or others (mode %04o); only one that no "
                           "other user can write is trusted",
                           what, path, (unsigned)(st->st_mode & 07777));
  return CLPAR_OK;
}

/* mkdir -p with mode 0700 for every directory it creates; errors are left to the open. */
static void make_dirs(const char *path) {
  char *p = strdup(path);
  if (!p) return;
  for (char *c = p + 1; *c; c++) {
    if (*c != '/') continue;
    *c = '\0';
    (void)mkdir(p, 0700);
    *c = '/';
  }
  (void)mkdir(p, 0700);
  free(p);
}

clpar_status clpar_trusted_dir_open(const char *path, int *dirfd) {
  if (!path || !*path || !dirfd)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "cache directory: no path");
  struct stat st;
  if (lstat(path, &st) != 0) {
    make_dirs(path);
    if (lstat(path, &st) != 0)
      return clpar_set_error(CLPAR_ERROR_IO, "cannot create cache directory %s: %s", path,
                             strerror(errno));
  }
  if (S_ISLNK(st.st_mode))
    return clpar_set_error(
        CLPAR_ERROR_IO, "cache directory %s is a symbolic link; give the directory itself", path);
  if (!S_ISDIR(st.st_mode))
    return clpar_set_error(CLPAR_ERROR_IO, "cache directory %s is %s, not a directory", path,
                           file_kind(st.st_mode));
  /* The checks that count are made on the descriptor: path may have changed since lstat. */
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return clpar_set_error(CLPAR_ERROR_IO, "cannot open cache directory %s: %s", path,
                           strerror(errno));
  clpar_status s = CLPAR_OK;
  if (fstat(fd, &st) != 0)
    s = clpar_set_error(CLPAR_ERROR_IO, "cannot stat cache directory %s: %s", path,
                        strerror(errno));
  else if (!S_ISDIR(st.st_mode))
    s = clpar_set_error(CLPAR_ERROR_IO, "cache directory %s is not a directory", path);
  else
    s = check_owner_mode("cache directory", path, &st);
  if (s != CLPAR_OK) {
    close(fd);
    return s;
  }
  *dirfd = fd;
  return CLPAR_OK;
}

/* One warning per distinct reason, not one per program built. */
static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static char warned[512];

static void warn_once(const char *msg) {
  pthread_mutex_lock(&warn_lock);
  int fresh = strncmp(warned, msg, sizeof warned - 1) != 0;
  if (fresh) snprintf(warned, sizeof warned, "%s", msg);
  pthread_mutex_unlock(&warn_lock);
  if (fresh) clpar_log(CLPAR_LOG_WARN, "%s; going on without the disk cache", msg);
}

clpar_status clpar_cache_dir_open(char *path, size_t path_size, int *dirfd) {
  const char *env = getenv("CLPAR_CACHE_DIR");
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  int n;
  clpar_status s;
  if (!path || path_size == 0 || !dirfd)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_cache_dir_open: NULL argument");
  path[0] = '\0';
  if (env && *env)
    n = snprintf(path, path_size, "%s", env);
  else if (xdg && *xdg)
    n = snprintf(path, path_size, "%s/clpar", xdg);
  else if (home && *home)
    n = snprintf(path, path_size, "%s/.cache/clpar", home);
  else
    n = -2;
  if (n == -2)
    s = clpar_set_error(CLPAR_ERROR_IO,
                        "no cache directory: none of CLPAR_CACHE_DIR, "
                        "XDG_CACHE_HOME and HOME is set");
  else if (n < 0 || (size_t)n >= path_size)
    s = clpar_set_error(CLPAR_ERROR_IO, "the cache directory's path is longer than %zu bytes",
                        path_size - 1);
  else
    s = clpar_trusted_dir_open(path, dirfd);
  if (s != CLPAR_OK) warn_once(clpar_last_error());
  return s;
}

/* An entry's name: one path component, so that it cannot leave the directory. */
static clpar_status check_name(const char *name) {
  if (!name || !*name || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "cache entry name \"%s\" is not a file name", name ? name : "(null)");
  return CLPAR_OK;
}

static clpar_status read_all(int fd, const char *name, uint8_t *buf, size_t size) {
  size_t got = 0;
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return clpar_set_error(CLPAR_ERROR_IO, "cache entry %s: read failed: %s", name,
                             strerror(errno));
    if (r == 0)
      return clpar_set_error(CLPAR_ERROR_IO,
                             "cache entry %s: shorter than its size (%zu of %zu "
                             "bytes); it changed while being read",
                             name, got, size);
    got += (size_t)r;
  }
  return CLPAR_OK;
}

clpar_status clpar_trusted_file_read(int dirfd, const char *name, size_t max_bytes, void **data,
                                     size_t *size) {
  if (!data || !size)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_trusted_file_read: NULL argument");
  *data = NULL;
  *size = 0;
  clpar_status s = check_name(name);
  if (s != CLPAR_OK) return s;
  int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return CLPAR_OK;
  if (fd < 0 && errno == ELOOP)
    return clpar_set_error(CLPAR_ERROR_IO, "cache entry %s is a symbolic link; not followed", name);
  if (fd < 0)
    return clpar_set_error(CLPAR_ERROR_IO, "cannot open cache entry %s: %s", name, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0)
    s = clpar_set_error(CLPAR_ERROR_IO, "cannot stat cache entry %s: %s", name, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    s = clpar_set_error(CLPAR_ERROR_IO, "cache entry %s is %s, not a regular file", name,
                        file_kind(st.st_mode));
  else
    s = check_owner_mode("cache entry", name, &st);
  if (s == CLPAR_OK && (st.st_size < 0 || (uint64_t)st.st_size > max_bytes))
    s = clpar_set_error(CLPAR_ERROR_IO, "cache entry %s has %lld bytes, more than the %zu allowed",
                        name, (long long)st.st_size, max_bytes);
  uint8_t *buf = NULL;
  if (s == CLPAR_OK) {
    buf = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
    if (!buf)
      s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "cache entry %s: out of host memory", name);
  }
  if (s == CLPAR_OK) s = read_all(fd, name, buf, (size_t)st.st_size);
  close(fd);
  if (s != CLPAR_OK) {
    free(buf);
    return s;
  }
  *data = buf;
  *size = (size_t)st.st_size;
  return CLPAR_OK;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

void (*clpar_atomic_write_hook)(clpar_write_stage stage);

static void stage(clpar_write_stage st) {
  if (clpar_atomic_write_hook) clpar_atomic_write_hook(st);
}

/* The parts, asked for and written in order; the hook sees the point halfway through the
 * total bytes. CLPAR_ERROR_IO with errno set when a write fails; a producer's own error. */
static clpar_status write_parts(int fd, int n, uint64_t total, clpar_part_fn part, void *user) {
  uint64_t done = 0;
  int halfway = 0;
  for (int i = 0; i < n; i++) {
    const uint8_t *p = NULL;
    size_t left = 0;
    clpar_status s = part(user, i, (const void **)&p, &left);
    if (s != CLPAR_OK) return s;
    while (left > 0) {
      size_t chunk = left;
      if (!halfway && done + chunk > total / 2) chunk = (size_t)(total / 2 - done);
      if (chunk > 0 && write_all(fd, p, chunk) != 0) return CLPAR_ERROR_IO;
      p += chunk;
      left -= chunk;
      done += chunk;
      if (!halfway && done >= total / 2) {
        halfway = 1;
        stage(CLPAR_WRITE_HALFWAY);
      }
    }
  }
  if (!halfway) stage(CLPAR_WRITE_HALFWAY);
  return CLPAR_OK;
}

/* 64 bits that another process cannot guess: from the kernel's generator, else (it cannot
 * fail for 8 bytes on Linux, but other systems) mixed from the clock, the process and a
 * counter. */
static uint64_t unpredictable(void) {
  uint64_t r;
  if (getentropy(&r, sizeof r) == 0) return r;
  static uint64_t counter; /* atomic */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  r = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) ^ (uint64_t)getpid() << 32 ^
      (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 20 ^ (uint64_t)(uintptr_t)&r;
  r = (r ^ (r >> 30)) * 0xBF58476D1CE4E5B9ull;
  r = (r ^ (r >> 27)) * 0x94D049BB133111EBull;
  return r ^ (r >> 31);
}

/* Creates the temporary file next to name: ".<name>.<16 random hex digits>.tmp", O_EXCL, so
 * that nobody can plant a file or a link at the name in advance, nor guess it. */
static clpar_status create_temp(int dirfd, const char *what, const char *name, mode_t mode,
                                int exact, char *tmp, size_t size, int *fd) {
  *fd = -1;
  for (int attempt = 0; *fd < 0 && attempt < 16; attempt++) {
    int len = snprintf(tmp, size, ".%.200s.%016llx.tmp", name, (unsigned long long)unpredictable());
    if (len < 0 || (size_t)len >= size)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s name %s is too long", what, name);
    *fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (*fd < 0 && errno != EEXIST) break;
  }
  /* exact: the mode whatever the umask (the mode of the file replaced is kept) */
  if (*fd >= 0 && exact && fchmod(*fd, mode) != 0) {
    int err = errno;
    close(*fd);
    unlinkat(dirfd, tmp, 0);
    *fd = -1;
    errno = err;
  }
  if (*fd < 0)
    return clpar_set_error(CLPAR_ERROR_IO, "cannot create a temporary file for %s %s: %s", what,
                           name, strerror(errno));
  return CLPAR_OK;
}

/* A new file (O_EXCL, of mode: exactly, or less the umask) next to name, written, synced,
 * renamed over name, and the directory synced so that the rename itself survives a crash.
 * what names the file's kind in messages. */
static clpar_status write_in_dir(int dirfd, const char *what, const char *name, int n,
                                 uint64_t total, clpar_part_fn part, void *user, mode_t mode,
                                 int exact) {
  char tmp[300];
  int fd;
  clpar_status cs = create_temp(dirfd, what, name, mode, exact, tmp, sizeof tmp, &fd);
  if (cs != CLPAR_OK) return cs;
  stage(CLPAR_WRITE_CREATED);
  clpar_status ps = write_parts(fd, n, total, part, user);
  int ok = ps == CLPAR_OK, err = errno;
  if (ok) stage(CLPAR_WRITE_WRITTEN);
  if (ok && fsync(fd) != 0) {
    ok = 0;
    err = errno;
  }
  if (close(fd) != 0 && ok) {
    ok = 0;
    err = errno;
  }
  if (ok) stage(CLPAR_WRITE_SYNCED);
  if (ok && renameat(dirfd, tmp, dirfd, name) != 0) {
    ok = 0;
    err = errno;
  }
  if (!ok) {
    unlinkat(dirfd, tmp, 0);
    if (ps != CLPAR_OK && ps != CLPAR_ERROR_IO) return ps; /* the producer's, with its message */
    return clpar_set_error(CLPAR_ERROR_IO, "cannot write %s %s: %s", what, name, strerror(err));
  }
  stage(CLPAR_WRITE_RENAMED);
  /* Some file systems refuse fsync on a directory (EINVAL); the rename is then as durable as
   * they make it, and the data itself is already synced. */
  if (fsync(dirfd) != 0 && errno != EINVAL && errno != EROFS)
    return clpar_set_error(CLPAR_ERROR_IO, "%s %s: syncing its directory failed: %s", what, name,
                           strerror(errno));
  return CLPAR_OK;
}

typedef struct {
  const void *const *parts;
  const size_t *sizes;
} parts_list;

static clpar_status from_list(void *user, int i, const void **data, size_t *size) {
  const parts_list *l = user;
  *data = l->parts[i];
  *size = l->sizes[i];
  return CLPAR_OK;
}

clpar_status clpar_trusted_file_write(int dirfd, const char *name, const void *data, size_t size) {
  clpar_status s = check_name(name);
  if (s != CLPAR_OK) return s;
  if (!data && size > 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_trusted_file_write: NULL data");
  const void *parts[1] = {data};
  parts_list l = {parts, &size};
  return write_in_dir(dirfd, "cache entry", name, 1, size, from_list, &l, 0600, 1);
}

clpar_status clpar_file_write_atomic(const char *path, int n, uint64_t total, clpar_part_fn part,
                                     void *user) {
  if (!path || !*path || n < 0 || !part)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_file_write_atomic: bad arguments");
  const char *slash = strrchr(path, '/');
  const char *name = slash ? slash + 1 : path;
  if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s does not name a file", path);
  char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
  if (!dir) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
  int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  clpar_status s = CLPAR_OK;
  if (dirfd < 0)
    s = clpar_set_error(CLPAR_ERROR_IO, "cannot open the directory %s of %s: %s", dir, path,
                        strerror(errno));
  free(dir);
  if (s != CLPAR_OK) return s;
  /* A regular file at path keeps its permission bits; a new file gets 0666 less the umask. A
   * symbolic link at path is replaced by the new file, not written through: its target is left
   * as it was (following it would let whoever can write the directory aim the save at any
   * file this user may write). */
  struct stat st;
  int keep = fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
  s = write_in_dir(dirfd, "file", name, n, total, part, user, keep ? st.st_mode & 0777 : 0666,
                   keep);
  close(dirfd);
  return s;
}
