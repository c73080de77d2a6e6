/*
 * fsops: a small static helper for the volfsd VM test guest.
 *
 * It exposes, as subcommands, the file-system syscalls that busybox does not
 * (renameat2 flags, fallocate modes, SEEK_DATA/SEEK_HOLE, O_DIRECT,
 * copy_file_range, utimensat with nanoseconds, statfs, ...), plus a few
 * fast bulk operations that would be too slow as shell loops under TCG.
 *
 * Conventions:
 *   - exit 0 on success, 1 on a failed check or syscall, 2 on bad usage;
 *   - errors go to stderr as "fsops: <what>: <strerror> (<ERRNO_NAME>)";
 *   - "fsops -e <subcommand> ..." prints the outcome as an errno name on stdout
 *     ("OK", "EEXIST", ...) and exits 0, so scripts can assert on the errno.
 *
 * Build: gcc -static -O2 -Wall -o fsops fsops.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <grp.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
#include <linux/falloc.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

#define MIB (1024UL * 1024UL)
#define DIO_ALIGN 4096UL

static int errno_mode; /* -e: report errno names instead of failing */

static const char *errname(int e)
{
	switch (e) {
	case 0: return "OK";
#define E(x) case x: return #x;
	E(EPERM) E(ENOENT) E(EIO) E(EBADF) E(EAGAIN) E(ENOMEM) E(EACCES)
	E(EFAULT) E(EBUSY) E(EEXIST) E(EXDEV) E(ENODEV) E(ENOTDIR) E(EISDIR)
	E(EINVAL) E(EFBIG) E(ENOSPC) E(ESPIPE) E(EROFS) E(EMLINK) E(ERANGE)
	E(ENAMETOOLONG) E(ENOSYS) E(ENOTEMPTY) E(ELOOP) E(ENXIO) E(EOPNOTSUPP)
	E(ENODATA) E(EOVERFLOW) E(ETXTBSY) E(ESTALE) E(EBADMSG)
#undef E
	default: return "EUNKNOWN";
	}
}

/* Report the result of a syscall; in -e mode print the errno name instead. */
static int report(int ret, int err, const char *what)
{
	if (errno_mode) {
		printf("%s\n", errname(ret < 0 ? err : 0));
		return 0;
	}
	if (ret < 0) {
		fprintf(stderr, "fsops: %s: %s (%s)\n", what, strerror(err), errname(err));
		return 1;
	}
	return 0;
}

static void die(const char *what)
{
	int e = errno;
	if (errno_mode) {
		printf("%s\n", errname(e));
		exit(0);
	}
	fprintf(stderr, "fsops: %s: %s (%s)\n", what, strerror(e), errname(e));
	exit(1);
}

static void usage_exit(const char *msg)
{
	fprintf(stderr, "fsops: usage: %s\n", msg);
	exit(2);
}

static unsigned long long num(const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end)
		usage_exit("bad number");
	return v;
}

/*
 * Deterministic pattern: every 8-byte word at byte offset `off` of a stream
 * with seed `seed` is a pure function of both, so any range can be generated
 * or verified independently (splitmix64 of seed ^ word index).
 */
static inline uint64_t pattern_word(uint64_t seed, uint64_t off)
{
	uint64_t z = (off / 8) + seed * 0x9E3779B97F4A7C15ULL;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static void pattern_fill(uint64_t seed, uint64_t off, uint64_t *buf, size_t len)
{
	for (size_t i = 0; i < len / 8; i++)
		buf[i] = pattern_word(seed, off + i * 8);
}

static void *aligned_buf(size_t len)
{
	void *p;
	if (posix_memalign(&p, DIO_ALIGN, len))
		die("posix_memalign");
	return p;
}

static void write_all(int fd, const void *buf, size_t len, off_t off, const char *what)
{
	const char *p = buf;
	while (len) {
		ssize_t n = pwrite(fd, p, len, off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die(what);
		}
		p += n;
		len -= n;
		off += n;
	}
}

static size_t read_full(int fd, void *buf, size_t len, off_t off, const char *what)
{
	char *p = buf;
	size_t got = 0;
	while (got < len) {
		ssize_t n = pread(fd, p + got, len - got, off + got);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die(what);
		}
		if (n == 0)
			break;
		got += n;
	}
	return got;
}

/* pattern write|verify FILE MIB SEED [direct] */
static int cmd_pattern(int argc, char **argv)
{
	if (argc < 5)
		usage_exit("pattern write|verify FILE MIB SEED [direct]");
	int writing = !strcmp(argv[1], "write");
	if (!writing && strcmp(argv[1], "verify"))
		usage_exit("pattern write|verify FILE MIB SEED [direct]");
	const char *path = argv[2];
	uint64_t mib = num(argv[3]), seed = num(argv[4]);
	int direct = argc > 5 && !strcmp(argv[5], "direct");
	int flags = writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY;
	if (direct)
		flags |= O_DIRECT;
	int fd = open(path, flags, 0644);
	if (fd < 0)
		die(path);
	uint64_t *buf = aligned_buf(MIB), *want = aligned_buf(MIB);
	for (uint64_t i = 0; i < mib; i++) {
		off_t off = i * MIB;
		if (writing) {
			pattern_fill(seed, off, buf, MIB);
			write_all(fd, buf, MIB, off, "pattern write");
		} else {
			size_t got = read_full(fd, buf, MIB, off, "pattern read");
			if (got != MIB) {
				fprintf(stderr, "fsops: %s: short file at MiB %" PRIu64 "\n", path, i);
				return 1;
			}
			pattern_fill(seed, off, want, MIB);
			if (memcmp(buf, want, MIB)) {
				fprintf(stderr, "fsops: %s: pattern mismatch in MiB %" PRIu64 "\n", path, i);
				return 1;
			}
		}
	}
	if (!writing) {
		/* The file must end exactly where the pattern ends. */
		char extra;
		if (read_full(fd, &extra, direct ? 0 : 1, mib * MIB, "pattern read") != 0) {
			fprintf(stderr, "fsops: %s: longer than %" PRIu64 " MiB\n", path, mib);
			return 1;
		}
		struct stat st;
		if (fstat(fd, &st) < 0)
			die("fstat");
		if ((uint64_t)st.st_size != mib * MIB) {
			fprintf(stderr, "fsops: %s: size %lld, want %" PRIu64 "\n", path,
				(long long)st.st_size, mib * MIB);
			return 1;
		}
	}
	if (writing && fsync(fd) < 0)
		die("fsync");
	if (close(fd) < 0)
		die("close");
	return 0;
}

/* rename2 none|noreplace|exchange OLD NEW */
static int cmd_rename2(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("rename2 none|noreplace|exchange OLD NEW");
	unsigned flags;
	if (!strcmp(argv[1], "none"))
		flags = 0;
	else if (!strcmp(argv[1], "noreplace"))
		flags = RENAME_NOREPLACE;
	else if (!strcmp(argv[1], "exchange"))
		flags = RENAME_EXCHANGE;
	else
		usage_exit("rename2 none|noreplace|exchange OLD NEW");
	int r = syscall(SYS_renameat2, AT_FDCWD, argv[2], AT_FDCWD, argv[3], flags);
	return report(r, errno, "renameat2");
}

/* fallocate alloc|keep|punch|zero FILE OFFSET LEN */
static int cmd_fallocate(int argc, char **argv)
{
	if (argc != 5)
		usage_exit("fallocate alloc|keep|punch|zero FILE OFFSET LEN");
	int mode;
	if (!strcmp(argv[1], "alloc"))
		mode = 0;
	else if (!strcmp(argv[1], "keep"))
		mode = FALLOC_FL_KEEP_SIZE;
	else if (!strcmp(argv[1], "punch"))
		mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
	else if (!strcmp(argv[1], "zero"))
		mode = FALLOC_FL_ZERO_RANGE;
	else
		usage_exit("fallocate alloc|keep|punch|zero FILE OFFSET LEN");
	int fd = open(argv[2], O_RDWR | O_CREAT, 0644);
	if (fd < 0)
		die(argv[2]);
	int r = fallocate(fd, mode, num(argv[3]), num(argv[4]));
	int e = errno;
	close(fd);
	return report(r, e, "fallocate");
}

/* seek data|hole FILE OFFSET: prints the resulting offset, or the errno name */
static int cmd_seek(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("seek data|hole FILE OFFSET");
	int whence = !strcmp(argv[1], "data") ? SEEK_DATA : SEEK_HOLE;
	int fd = open(argv[2], O_RDONLY);
	if (fd < 0)
		die(argv[2]);
	off_t r = lseek(fd, num(argv[3]), whence);
	if (r < 0) {
		/* ENXIO (past EOF / no more data) is an answer, not an error. */
		printf("%s\n", errname(errno));
		return errno == ENXIO || errno_mode ? 0 : 1;
	}
	printf("%lld\n", (long long)r);
	return 0;
}

/* pwrite FILE OFFSET STRING: write STRING at OFFSET without truncating */
static int cmd_pwrite(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("pwrite FILE OFFSET STRING");
	int fd = open(argv[1], O_WRONLY | O_CREAT, 0644);
	if (fd < 0)
		die(argv[1]);
	write_all(fd, argv[3], strlen(argv[3]), num(argv[2]), "pwrite");
	return close(fd) < 0 ? report(-1, errno, "close") : 0;
}

/* fsync FILE [data]: write a line, then fsync (or fdatasync) it and its dir */
static int cmd_fsync(int argc, char **argv)
{
	if (argc < 2)
		usage_exit("fsync FILE [data]");
	int fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd < 0)
		die(argv[1]);
	static const char line[] = "fsync-line\n";
	if (write(fd, line, sizeof(line) - 1) != sizeof(line) - 1)
		die("write");
	int r = (argc > 2 && !strcmp(argv[2], "data")) ? fdatasync(fd) : fsync(fd);
	if (r < 0)
		return report(r, errno, "fsync");
	close(fd);
	/* fsync of the containing directory goes through FUSE_FSYNCDIR. */
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", argv[1]);
	char *slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = 0;
	else
		strcpy(dir, ".");
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	if (dfd < 0)
		die(dir);
	r = fsync(dfd);
	int e = errno;
	close(dfd);
	return report(r, e, "fsync dir");
}

/* utimens FILE ATIME MTIME, each "SEC.NSEC" (or "SEC") */
static struct timespec parse_ts(const char *s)
{
	struct timespec ts = {0, 0};
	char buf[64];
	snprintf(buf, sizeof(buf), "%s", s);
	char *dot = strchr(buf, '.');
	if (dot) {
		*dot = 0;
		ts.tv_nsec = num(dot + 1);
	}
	ts.tv_sec = num(buf);
	return ts;
}

static int cmd_utimens(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("utimens FILE ATIME MTIME");
	struct timespec ts[2] = {parse_ts(argv[2]), parse_ts(argv[3])};
	int r = utimensat(AT_FDCWD, argv[1], ts, AT_SYMLINK_NOFOLLOW);
	return report(r, errno, "utimensat");
}

/* times FILE: prints "ATIME_SEC.NSEC MTIME_SEC.NSEC" */
static int cmd_times(int argc, char **argv)
{
	if (argc != 2)
		usage_exit("times FILE");
	struct stat st;
	if (lstat(argv[1], &st) < 0)
		die(argv[1]);
	printf("%lld.%09ld %lld.%09ld\n", (long long)st.st_atim.tv_sec, st.st_atim.tv_nsec,
	       (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
	return 0;
}

/* cfr SRC DST: copy the whole of SRC into DST with copy_file_range */
static int cmd_cfr(int argc, char **argv)
{
	if (argc != 3)
		usage_exit("cfr SRC DST");
	int in = open(argv[1], O_RDONLY);
	if (in < 0)
		die(argv[1]);
	int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (out < 0)
		die(argv[2]);
	struct stat st;
	if (fstat(in, &st) < 0)
		die("fstat");
	off_t left = st.st_size;
	while (left > 0) {
		ssize_t n = copy_file_range(in, NULL, out, NULL, left, 0);
		if (n < 0)
			return report(-1, errno, "copy_file_range");
		if (n == 0) {
			fprintf(stderr, "fsops: copy_file_range: unexpected EOF\n");
			return 1;
		}
		left -= n;
	}
	close(in);
	return close(out) < 0 ? report(-1, errno, "close") : report(0, 0, "");
}

/* readdir [-l] DIR: print the entry count (or, with -l, the names) sans . and .. */
static int cmd_readdir(int argc, char **argv)
{
	int list = argc == 3 && !strcmp(argv[1], "-l");
	if (argc != 2 && !list)
		usage_exit("readdir [-l] DIR");
	const char *path = argv[argc - 1];
	DIR *d = opendir(path);
	if (!d)
		die(path);
	unsigned long count = 0;
	struct dirent *de;
	errno = 0;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		count++;
		if (list)
			printf("%s\n", de->d_name);
	}
	if (errno)
		die("readdir");
	closedir(d);
	if (!list)
		printf("%lu\n", count);
	return 0;
}

/* mkfiles DIR PREFIX N: create PREFIX0..PREFIX{N-1}, each holding its own name */
static int cmd_mkfiles(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("mkfiles DIR PREFIX N");
	unsigned long n = num(argv[3]);
	char path[PATH_MAX], name[NAME_MAX + 1];
	for (unsigned long i = 0; i < n; i++) {
		int len = snprintf(name, sizeof(name), "%s%lu", argv[2], i);
		snprintf(path, sizeof(path), "%s/%s", argv[1], name);
		int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
		if (fd < 0)
			die(path);
		write_all(fd, name, len, 0, path);
		if (close(fd) < 0)
			die("close");
	}
	return 0;
}

/* rmfiles DIR PREFIX N: unlink what mkfiles created */
static int cmd_rmfiles(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("rmfiles DIR PREFIX N");
	unsigned long n = num(argv[3]);
	char path[PATH_MAX];
	for (unsigned long i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/%s%lu", argv[1], argv[2], i);
		if (unlink(path) < 0)
			die(path);
	}
	return 0;
}

/* statfs PATH: prints "type=0x.. bsize=.. blocks=.. bfree=.. bavail=.. files=.. ffree=.. namelen=.." */
static int cmd_statfs(int argc, char **argv)
{
	if (argc != 2)
		usage_exit("statfs PATH");
	struct statfs s;
	if (statfs(argv[1], &s) < 0)
		die(argv[1]);
	printf("type=0x%lx bsize=%ld blocks=%llu bfree=%llu bavail=%llu files=%llu ffree=%llu namelen=%ld\n",
	       (unsigned long)s.f_type, (long)s.f_bsize, (unsigned long long)s.f_blocks,
	       (unsigned long long)s.f_bfree, (unsigned long long)s.f_bavail,
	       (unsigned long long)s.f_files, (unsigned long long)s.f_ffree, (long)s.f_namelen);
	return 0;
}

/* pin CPU CMD [ARGS...]: run CMD bound to one CPU (fallback when taskset is absent) */
static int cmd_pin(int argc, char **argv)
{
	if (argc < 3)
		usage_exit("pin CPU CMD [ARGS...]");
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(num(argv[1]), &set);
	if (sched_setaffinity(0, sizeof(set), &set) < 0)
		die("sched_setaffinity");
	execvp(argv[2], argv + 2);
	die(argv[2]);
	return 1;
}

/* getcpu: print the CPU this process runs on */
static int cmd_getcpu(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("%d\n", sched_getcpu());
	return 0;
}

/* blocks FILE: print st_size and allocated bytes (st_blocks * 512) */
static int cmd_blocks(int argc, char **argv)
{
	if (argc != 2)
		usage_exit("blocks FILE");
	struct stat st;
	if (stat(argv[1], &st) < 0)
		die(argv[1]);
	printf("%lld %lld\n", (long long)st.st_size, (long long)st.st_blocks * 512);
	return 0;
}

/* now: print wall-clock seconds with milliseconds (busybox date lacks %N) */
static int cmd_now(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	printf("%lld.%03ld\n", (long long)ts.tv_sec, ts.tv_nsec / 1000000);
	return 0;
}

/* open PATH r|w|rw|a|wc|wt|cx: open with those flags, then close */
static int cmd_open(int argc, char **argv)
{
	if (argc != 3)
		usage_exit("open PATH r|w|rw|a|wc|wt|cx");
	const char *m = argv[2];
	int flags;
	if (!strcmp(m, "r"))
		flags = O_RDONLY;
	else if (!strcmp(m, "w"))
		flags = O_WRONLY;
	else if (!strcmp(m, "rw"))
		flags = O_RDWR;
	else if (!strcmp(m, "a"))
		flags = O_WRONLY | O_APPEND;
	else if (!strcmp(m, "wc"))
		flags = O_WRONLY | O_CREAT;
	else if (!strcmp(m, "wt"))
		flags = O_WRONLY | O_TRUNC;
	else if (!strcmp(m, "cx"))
		flags = O_WRONLY | O_CREAT | O_EXCL;
	else
		usage_exit("open PATH r|w|rw|a|wc|wt|cx");
	int fd = open(argv[1], flags, 0644);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	close(fd);
	return report(0, 0, "");
}

/* Single path syscalls, for errno assertions with -e:
 *   mkdir PATH | unlink PATH | rmdir PATH | chmod MODE PATH | truncate PATH LEN
 *   link OLD NEW | symlink TARGET NEW | mkfifo PATH | stat PATH (prints "dev ino")
 *   touch PATH (utimensat to now) */
static int cmd_sys(int argc, char **argv)
{
	const char *c = argv[0];
	int r;
	if (!strcmp(c, "mkdir") && argc == 2)
		r = mkdir(argv[1], 0755);
	else if (!strcmp(c, "unlink") && argc == 2)
		r = unlink(argv[1]);
	else if (!strcmp(c, "rmdir") && argc == 2)
		r = rmdir(argv[1]);
	else if (!strcmp(c, "chmod") && argc == 3)
		r = chmod(argv[2], num(argv[1]));
	else if (!strcmp(c, "truncate") && argc == 3)
		r = truncate(argv[1], num(argv[2]));
	else if (!strcmp(c, "link") && argc == 3)
		r = link(argv[1], argv[2]);
	else if (!strcmp(c, "symlink") && argc == 3)
		r = symlink(argv[1], argv[2]);
	else if (!strcmp(c, "mkfifo") && argc == 2)
		r = mkfifo(argv[1], 0644);
	else if (!strcmp(c, "touch") && argc == 2)
		r = utimensat(AT_FDCWD, argv[1], NULL, 0);
	else if (!strcmp(c, "stat") && argc == 2) {
		struct stat st;
		r = stat(argv[1], &st);
		if (r == 0 && !errno_mode)
			printf("%llu %llu\n", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
	} else
		usage_exit("mkdir|unlink|rmdir PATH, chmod MODE PATH, truncate PATH LEN, link|symlink A B, mkfifo|stat|touch PATH");
	return report(r, errno, c);
}

/* readfd FD: pread up to 4096 bytes at offset 0 of an inherited fd and print them */
static int cmd_readfd(int argc, char **argv)
{
	if (argc != 2)
		usage_exit("readfd FD");
	char buf[4096];
	ssize_t n = pread(num(argv[1]), buf, sizeof(buf), 0);
	if (n < 0)
		return report(-1, errno, "pread");
	if (!errno_mode)
		fwrite(buf, 1, n, stdout);
	return report(0, 0, "");
}

#ifndef F_OFD_SETLK
#define F_OFD_SETLK 37
#define F_OFD_SETLKW 38
#endif

/* Lock kinds: posix (fcntl, per process), ofd (fcntl, per open file) or flock,
 * each a write (exclusive) lock on the whole file; with "-read" appended, a read
 * (shared) lock taken on a read-only open, as a read-only volume allows. */
static int lock_kind_ok(const char *kind)
{
	static const char *const kinds[] = {"posix", "ofd", "flock", "posix-read", "ofd-read", "flock-read"};
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (!strcmp(kind, kinds[i]))
			return 1;
	return 0;
}

static int lock_is_read(const char *kind)
{
	size_t n = strlen(kind);
	return n > 5 && !strcmp(kind + n - 5, "-read");
}

/* Take a lock of that kind on all of fd's file; wait: block until it is granted.
 * Returns what the syscall returned (errno set). */
static int take_lock_as(int fd, const char *kind, int wait)
{
	int rd = lock_is_read(kind);
	if (!strncmp(kind, "posix", 5) || !strncmp(kind, "ofd", 3)) {
		struct flock fl = {.l_type = rd ? F_RDLCK : F_WRLCK, .l_whence = SEEK_SET};
		int ofd = !strncmp(kind, "ofd", 3);
		int cmd = ofd ? (wait ? F_OFD_SETLKW : F_OFD_SETLK) : (wait ? F_SETLKW : F_SETLK);
		return fcntl(fd, cmd, &fl);
	}
	return flock(fd, (rd ? LOCK_SH : LOCK_EX) | (wait ? 0 : LOCK_NB));
}

static int take_lock(int fd, const char *kind)
{
	return take_lock_as(fd, kind, 0);
}

/* lockhold FILE [posix|ofd]: a write lock of that kind (posix by default) and
 * an flock on FILE, held until killed; prints "locked" once both are held */
static int cmd_lockhold(int argc, char **argv)
{
	if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "posix") && strcmp(argv[2], "ofd")))
		usage_exit("lockhold FILE [posix|ofd]");
	const char *kind = argc == 3 ? argv[2] : "posix";
	int fd = open(argv[1], O_RDWR);
	if (fd < 0)
		die(argv[1]);
	if (take_lock(fd, kind) < 0)
		die(!strcmp(kind, "ofd") ? "fcntl F_OFD_SETLK F_WRLCK" : "fcntl F_SETLK F_WRLCK");
	if (take_lock(fd, "flock") < 0)
		die("flock LOCK_EX|LOCK_NB");
	printf("locked\n");
	fflush(stdout);
	for (;;)
		pause();
	return 0;
}

/* Takes a lock of kind argv[1] on argv[2] (waiting for it if wait), reports the
 * outcome, and releases it by closing the file. */
static int lock_once(int argc, char **argv, int wait, const char *usage)
{
	if (argc != 3 || !lock_kind_ok(argv[1]))
		usage_exit(usage);
	int rd = lock_is_read(argv[1]);
	int fd = open(argv[2], rd ? O_RDONLY : O_RDWR);
	if (fd < 0)
		return report(-1, errno, argv[2]);
	int r = take_lock_as(fd, argv[1], wait);
	int err = errno;
	if (r == 0 && wait && !errno_mode) {
		printf("locked\n");
		fflush(stdout);
	}
	close(fd); /* releases any of them */
	const char *what = !strncmp(argv[1], "flock", 5) ? (rd ? "flock LOCK_SH" : "flock LOCK_EX")
							: (rd ? "fcntl F_RDLCK" : "fcntl F_WRLCK");
	return report(r, err, what);
}

/* trylock KIND FILE: try to take that lock (see lock_kind_ok) without waiting
 * (EAGAIN: someone else holds it), then release it */
static int cmd_trylock(int argc, char **argv)
{
	return lock_once(argc, argv, 0, "trylock posix|ofd|flock[-read] FILE");
}

/* lockwait KIND FILE: wait for that lock (F_SETLKW, F_OFD_SETLKW or a blocking
 * flock); print "locked" once it is granted, then release it and exit */
static int cmd_lockwait(int argc, char **argv)
{
	return lock_once(argc, argv, 1, "lockwait posix|ofd|flock[-read] FILE");
}

/* asuser UID GID CMD [ARGS...]: drop all supplementary groups, set the real,
 * effective and saved gid and uid, then exec CMD (pjdfstest's "-u UID -g GID") */
static int cmd_asuser(int argc, char **argv)
{
	if (argc < 4)
		usage_exit("asuser UID GID CMD [ARGS...]");
	gid_t gid = num(argv[2]);
	if (setgroups(1, &gid) < 0)
		die("setgroups");
	if (setresgid(gid, gid, gid) < 0)
		die("setresgid");
	if (setresuid(num(argv[1]), num(argv[1]), num(argv[1])) < 0)
		die("setresuid");
	execvp(argv[3], argv + 3);
	die(argv[3]);
	return 1;
}

/*
 * POSIX ACLs in the kernel's xattr format (a 4-byte version 2, then 8-byte
 * entries {u16 tag, u16 perm, u32 id} in tag-then-id order), written as text
 * like setfacl's short form: "u::rw,u:1000:r,g::r,m::r,o::-" (busybox has no
 * setfacl/getfacl).
 */
#define ACL_XATTR_VERSION 2
#define ACL_TAG_USER_OBJ 0x01
#define ACL_TAG_USER 0x02
#define ACL_TAG_GROUP_OBJ 0x04
#define ACL_TAG_GROUP 0x08
#define ACL_TAG_MASK 0x10
#define ACL_TAG_OTHER 0x20
#define ACL_NO_ID 0xffffffffu

struct acl_ent {
	uint16_t tag, perm;
	uint32_t id;
};

static int acl_ent_cmp(const void *a, const void *b)
{
	const struct acl_ent *x = a, *y = b;
	if (x->tag != y->tag)
		return x->tag < y->tag ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

static const char *acl_name(const char *which)
{
	if (!strcmp(which, "access"))
		return "system.posix_acl_access";
	if (!strcmp(which, "default"))
		return "system.posix_acl_default";
	usage_exit("acl set|get FILE access|default [SPEC]");
	return NULL;
}

/* acl set FILE access|default SPEC | acl get FILE access|default (prints SPEC,
 * entries in the kernel's order) | acl remove FILE access|default */
static int cmd_acl(int argc, char **argv)
{
	const char *help = "acl set FILE access|default SPEC | get FILE access|default | remove FILE access|default";
	if (argc < 4)
		usage_exit(help);
	const char *name = acl_name(argv[3]);
	unsigned char buf[4 + 8 * 64];
	if (!strcmp(argv[1], "set") && argc == 5) {
		struct acl_ent ents[64];
		int n = 0;
		char *spec = strdup(argv[4]), *save = NULL;
		for (char *e = strtok_r(spec, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
			if (n == 64)
				usage_exit("acl: too many entries");
			char *c1 = strchr(e, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
			if (!c1 || !c2)
				usage_exit("acl: an entry is TYPE:[ID]:PERMS");
			*c1 = *c2 = 0;
			int has_id = c1[1] != 0;
			uint16_t tag;
			switch (e[0]) {
			case 'u': tag = has_id ? ACL_TAG_USER : ACL_TAG_USER_OBJ; break;
			case 'g': tag = has_id ? ACL_TAG_GROUP : ACL_TAG_GROUP_OBJ; break;
			case 'm': tag = ACL_TAG_MASK; break;
			case 'o': tag = ACL_TAG_OTHER; break;
			default: usage_exit("acl: TYPE is u, g, m or o"); return 2;
			}
			uint16_t perm = 0;
			for (const char *p = c2 + 1; *p; p++)
				perm |= *p == 'r' ? 4 : *p == 'w' ? 2 : *p == 'x' ? 1 : 0;
			ents[n].tag = tag;
			ents[n].perm = perm;
			ents[n].id = has_id ? (uint32_t)num(c1 + 1) : ACL_NO_ID;
			n++;
		}
		qsort(ents, n, sizeof(ents[0]), acl_ent_cmp);
		uint32_t version = ACL_XATTR_VERSION;
		memcpy(buf, &version, 4);
		for (int i = 0; i < n; i++)
			memcpy(buf + 4 + 8 * i, &ents[i], 8);
		int ret = setxattr(argv[2], name, buf, 4 + 8 * n, 0);
		return report(ret, errno, "setxattr");
	}
	if (!strcmp(argv[1], "remove") && argc == 4) {
		int ret = removexattr(argv[2], name);
		return report(ret, errno, "removexattr");
	}
	if (!strcmp(argv[1], "get") && argc == 4) {
		ssize_t len = getxattr(argv[2], name, buf, sizeof(buf));
		if (len < 0)
			return report(-1, errno, "getxattr");
		if (errno_mode)
			return report(0, 0, "");
		for (ssize_t off = 4; off + 8 <= len; off += 8) {
			struct acl_ent e;
			memcpy(&e, buf + off, 8);
			char t = e.tag & (ACL_TAG_USER_OBJ | ACL_TAG_USER) ? 'u'
				 : e.tag & (ACL_TAG_GROUP_OBJ | ACL_TAG_GROUP) ? 'g'
				 : e.tag == ACL_TAG_MASK ? 'm' : 'o';
			printf("%s%c:", off > 4 ? "," : "", t);
			if (e.id != ACL_NO_ID)
				printf("%u", e.id);
			printf(":%s%s%s", e.perm & 4 ? "r" : "", e.perm & 2 ? "w" : "",
			       e.perm & 1 ? "x" : "");
			if (!e.perm)
				printf("-");
		}
		printf("\n");
		return 0;
	}
	usage_exit(help);
	return 2;
}

/* openwait FILE r|w|direct-r|direct-w GOFILE: open FILE (direct-*: with
 * O_DIRECT), print "open", and keep it open until GOFILE exists (polled every
 * 20 ms, at most 120 s) */
static int cmd_openwait(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("openwait FILE r|w|direct-r|direct-w GOFILE");
	const char *m = argv[2];
	int flags = strstr(m, "w") ? O_WRONLY : O_RDONLY;
	if (!strncmp(m, "direct-", 7))
		flags |= O_DIRECT;
	int fd = open(argv[1], flags);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	printf("open\n");
	fflush(stdout);
	for (int i = 0; i < 6000 && access(argv[3], F_OK) != 0; i++)
		usleep(20000);
	close(fd);
	return 0;
}

/* write FILE STRING: open(FILE, O_WRONLY) (no O_CREAT, no O_TRUNC), write
 * STRING at offset 0, close */
static int cmd_write(int argc, char **argv)
{
	if (argc != 3)
		usage_exit("write FILE STRING");
	int fd = open(argv[1], O_WRONLY);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	ssize_t n = write(fd, argv[2], strlen(argv[2]));
	int err = errno;
	if (n >= 0 && (size_t)n != strlen(argv[2])) {
		n = -1;
		err = EIO;
	}
	if (n < 0) {
		close(fd);
		return report(-1, err, "write");
	}
	return close(fd) < 0 ? report(-1, errno, "close") : report(0, 0, "");
}

/* setxattr FILE NAME VALUE: one extended attribute (busybox has no setfattr) */
static int cmd_setxattr(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("setxattr FILE NAME VALUE");
	int ret = setxattr(argv[1], argv[2], argv[3], strlen(argv[3]), 0);
	return report(ret, errno, "setxattr");
}

/* mode PATH: print st_mode & 07777 in octal (pjdfstest's "stat PATH mode") */
static int cmd_mode(int argc, char **argv)
{
	if (argc != 2)
		usage_exit("mode PATH");
	struct stat st;
	if (stat(argv[1], &st) < 0)
		return report(-1, errno, argv[1]);
	if (!errno_mode)
		printf("0%o\n", st.st_mode & 07777);
	return report(0, 0, "");
}

/*
 * mmap write FILE OFFSET STRING sync|unmap: map FILE shared and read-write, copy
 *   STRING at OFFSET into the map, then either msync(MS_SYNC) while still mapped
 *   (sync) or only munmap and close (unmap). FILE must be large enough already.
 * mmap read FILE OFFSET LEN: map FILE shared and read-only; print LEN bytes.
 * mmap private FILE OFFSET STRING: map FILE private and read-write, write STRING
 *   into the map; the map must read it back and the file (pread) must not.
 * mmap rwmap-rdonly FILE: open FILE read-only and ask for a shared read-write
 *   map (the kernel refuses it: EACCES).
 */
static int cmd_mmap(int argc, char **argv)
{
	const char *help = "mmap write FILE OFFSET STRING sync|unmap|wait:GOFILE | read FILE OFFSET LEN | "
			   "private FILE OFFSET STRING | rwmap-rdonly FILE";
	if (argc < 3)
		usage_exit(help);
	const char *mode = argv[1], *path = argv[2];
	int rdwr = !strcmp(mode, "write") || !strcmp(mode, "private");
	if (!rdwr && strcmp(mode, "read") && strcmp(mode, "rwmap-rdonly"))
		usage_exit(help);
	if ((!strcmp(mode, "write") && argc != 6) || (!strcmp(mode, "read") && argc != 5) ||
	    (!strcmp(mode, "private") && argc != 5) || (!strcmp(mode, "rwmap-rdonly") && argc != 3))
		usage_exit(help);
	int fd = open(path, rdwr ? O_RDWR : O_RDONLY);
	if (fd < 0)
		return report(-1, errno, path);
	struct stat st;
	if (fstat(fd, &st) < 0)
		return report(-1, errno, "fstat");
	size_t len = st.st_size ? (size_t)st.st_size : 1;
	if (!strcmp(mode, "rwmap-rdonly")) {
		void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		int e = errno;
		if (p != MAP_FAILED)
			munmap(p, len);
		close(fd);
		return report(p == MAP_FAILED ? -1 : 0, e, "mmap shared read-write of a read-only open");
	}
	size_t off = num(argv[3]);
	if (!strcmp(mode, "read")) {
		size_t n = num(argv[4]);
		if (off + n > (size_t)st.st_size) {
			fprintf(stderr, "fsops: mmap read: %zu bytes at %zu past the end (%lld)\n", n, off,
				(long long)st.st_size);
			return 1;
		}
		char *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			return report(-1, errno, "mmap shared read-only");
		if (!errno_mode)
			fwrite(p + off, 1, n, stdout);
		munmap(p, len);
		close(fd);
		return report(0, 0, "");
	}
	const char *s = argv[4];
	size_t n = strlen(s);
	if (off + n > (size_t)st.st_size) {
		fprintf(stderr, "fsops: mmap %s: %zu bytes at %zu past the end (%lld)\n", mode, n, off,
			(long long)st.st_size);
		return 1;
	}
	int private = !strcmp(mode, "private");
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, private ? MAP_PRIVATE : MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return report(-1, errno, private ? "mmap private read-write" : "mmap shared read-write");
	memcpy(p + off, s, n);
	if (private) {
		char *back = malloc(n);
		if (!back)
			die("malloc");
		if (memcmp(p + off, s, n)) {
			fprintf(stderr, "fsops: mmap private: the map does not read back what was written\n");
			return 1;
		}
		if (pread(fd, back, n, off) != (ssize_t)n)
			die("pread");
		if (!memcmp(back, s, n)) {
			fprintf(stderr, "fsops: mmap private: the write reached the file\n");
			return 1;
		}
		free(back);
	} else if (!strcmp(argv[5], "sync")) {
		if (msync(p, len, MS_SYNC) < 0)
			return report(-1, errno, "msync");
	} else if (!strncmp(argv[5], "wait:", 5)) {
		/* Written but not synced: let another sandbox look, then msync once
		 * the file named after "wait:" exists. */
		printf("mapped\n");
		fflush(stdout);
		while (access(argv[5] + 5, F_OK) < 0)
			usleep(10000);
		if (msync(p, len, MS_SYNC) < 0)
			return report(-1, errno, "msync");
	} else if (strcmp(argv[5], "unmap")) {
		usage_exit(help);
	}
	if (munmap(p, len) < 0)
		return report(-1, errno, "munmap");
	if (close(fd) < 0)
		return report(-1, errno, "close");
	return report(0, 0, "");
}

/* uniform FILE: read FILE to its end (one open, 64 KiB reads); it must be one
 * byte repeated. Prints "SIZE BYTE" (the byte as a character). A file that mixes
 * two versions (a torn read) fails, naming the first offset that differs. */
static int cmd_uniform(int argc, char **argv)
{
	if (argc != 2)
		usage_exit("uniform FILE");
	int fd = open(argv[1], O_RDONLY);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	static char buf[65536];
	long long total = 0;
	int first = -1;
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0)
			return report(-1, errno, "read");
		if (n == 0)
			break;
		for (ssize_t i = 0; i < n; i++) {
			if (first < 0)
				first = (unsigned char)buf[i];
			if ((unsigned char)buf[i] != first) {
				fprintf(stderr, "fsops: uniform: %s: byte %lld is '%c', byte 0 is '%c' (torn read)\n",
					argv[1], total + i, buf[i], first);
				return 1;
			}
		}
		total += n;
	}
	close(fd);
	if (!errno_mode)
		printf("%lld %c\n", total, first < 0 ? '-' : first);
	return report(0, 0, "");
}

/*
 * Holders for the migration suite (suites/migration.sh): each keeps something
 * open while the host moves the VM (live migration, snapshot and restore) and
 * checks it afterwards. The guest never learns when it moves: each prints one
 * readiness line, works on until GOFILE exists, then reports.
 */
static int gone_yet(const char *gofile)
{
	return access(gofile, F_OK) == 0;
}

/* readhold FILE SEED GOFILE: FILE holds `pattern write FILE MIB SEED`. One
 * open O_RDONLY; every 50 ms one 4 KiB read() at the fd's position (from the
 * start again at the end), each checked against the pattern; once GOFILE
 * exists, the rest of the file through the same fd. Prints "open", then
 * "reads N bytes B"; fails naming the offset of a mismatch or a short file. */
static int cmd_readhold(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("readhold FILE SEED GOFILE");
	uint64_t seed = num(argv[2]);
	int fd = open(argv[1], O_RDONLY);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	struct stat st;
	if (fstat(fd, &st) < 0)
		return report(-1, errno, "fstat");
	printf("open\n");
	fflush(stdout);
	static uint64_t buf[512], want[512];
	unsigned long long reads = 0, bytes = 0;
	off_t pos = 0;
	int last = 0;
	for (;;) {
		if (!last && gone_yet(argv[3]))
			last = 1; /* from here on: to the end of the file, then stop */
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0)
			return report(-1, errno, "read of the held file");
		reads++;
		if (n == 0) {
			if (pos != st.st_size) {
				fprintf(stderr, "fsops: readhold: end of file at %lld, size %lld\n",
					(long long)pos, (long long)st.st_size);
				return 1;
			}
			if (last)
				break;
			if (lseek(fd, 0, SEEK_SET) < 0)
				return report(-1, errno, "lseek");
			pos = 0;
			continue;
		}
		if (n % 8 || (pos % 8)) {
			fprintf(stderr, "fsops: readhold: odd read of %zd bytes at %lld\n", n, (long long)pos);
			return 1;
		}
		pattern_fill(seed, pos, want, n);
		if (memcmp(buf, want, n)) {
			fprintf(stderr, "fsops: readhold: %s: data differs in the %zd bytes at %lld (read %llu)\n",
				argv[1], n, (long long)pos, reads);
			return 1;
		}
		pos += n;
		bytes += n;
		if (!last)
			usleep(50000);
	}
	close(fd);
	printf("reads %llu bytes %llu\n", reads, bytes);
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct linux_dirent64_ {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/* dirhold DIR N GOFILE: open DIR and read entries with getdents64 into a small
 * buffer (a few entries per call: the kernel asks the daemon again at the
 * stream's position each time) until at least N names are read; print "held K";
 * wait for GOFILE; read on to the end through the same fd. Prints
 * "entries TOTAL dups D" (. and .. left out). */
static int cmd_dirhold(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("dirhold DIR N GOFILE");
	unsigned long n = num(argv[2]);
	int fd = open(argv[1], O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	size_t cap = 1024, count = 0;
	char **names = malloc(cap * sizeof(*names));
	if (!names)
		die("malloc");
	char buf[320];
	int held = 0;
	for (;;) {
		if (!held && count >= n) {
			printf("held %zu\n", count);
			fflush(stdout);
			while (!gone_yet(argv[3]))
				usleep(20000);
			held = 1;
		}
		long got = syscall(SYS_getdents64, fd, buf, sizeof(buf));
		if (got < 0)
			return report(-1, errno, "getdents64 of the held directory");
		if (got == 0)
			break;
		for (long off = 0; off < got;) {
			struct linux_dirent64_ *d = (void *)(buf + off);
			off += d->d_reclen;
			if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, ".."))
				continue;
			if (count == cap) {
				cap *= 2;
				names = realloc(names, cap * sizeof(*names));
				if (!names)
					die("realloc");
			}
			names[count++] = strdup(d->d_name);
		}
	}
	if (!held) {
		fprintf(stderr, "fsops: dirhold: %s has %zu entries, fewer than %lu\n", argv[1], count, n);
		return 1;
	}
	close(fd);
	qsort(names, count, sizeof(*names), name_cmp);
	size_t dups = 0;
	for (size_t i = 1; i < count; i++)
		dups += !strcmp(names[i - 1], names[i]);
	printf("entries %zu dups %zu\n", count, dups);
	return 0;
}

/* holdio FILE GOFILE: open FILE O_RDWR, write "held\n" at 0, print "open", wait
 * for GOFILE, then pread and pwrite through the same fd. Prints
 * "read=ERRNO write=ERRNO" (OK when it worked). */
static int cmd_holdio(int argc, char **argv)
{
	if (argc != 3)
		usage_exit("holdio FILE GOFILE");
	int fd = open(argv[1], O_RDWR);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	if (pwrite(fd, "held\n", 5, 0) != 5)
		return report(-1, errno, "pwrite");
	printf("open\n");
	fflush(stdout);
	while (!gone_yet(argv[2]))
		usleep(20000);
	char b[5];
	ssize_t r = pread(fd, b, sizeof(b), 0);
	int re = r < 0 ? errno : (r == 5 && !memcmp(b, "held\n", 5)) ? 0 : EBADMSG;
	ssize_t w = pwrite(fd, "again\n", 6, 5);
	int we = w < 0 ? errno : w == 6 ? 0 : EIO;
	printf("read=%s write=%s\n", re ? errname(re) : "OK", we ? errname(we) : "OK");
	close(fd);
	return 0;
}

/* mmaphold FILE GOFILE: map FILE (4 KiB or more) shared read-write; write
 * "before-move\n" at offset 0 and msync; print "mapped"; then every 100 ms
 * write "tick NNNNNNNN\n" at 64 and msync, until GOFILE exists; then write
 * "after-move\n" at 128, msync and unmap. Prints "ticks N". */
static int cmd_mmaphold(int argc, char **argv)
{
	if (argc != 3)
		usage_exit("mmaphold FILE GOFILE");
	int fd = open(argv[1], O_RDWR);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	size_t len = 4096;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return report(-1, errno, "mmap shared read-write");
	memcpy(p, "before-move\n", 12);
	if (msync(p, len, MS_SYNC) < 0)
		return report(-1, errno, "msync before the move");
	printf("mapped\n");
	fflush(stdout);
	unsigned long ticks = 0;
	while (!gone_yet(argv[2])) {
		char t[32];
		snprintf(t, sizeof(t), "tick %08lu\n", ++ticks);
		memcpy(p + 64, t, strlen(t));
		if (msync(p, len, MS_SYNC) < 0)
			return report(-1, errno, "msync");
		usleep(100000);
	}
	memcpy(p + 128, "after-move\n", 11);
	if (msync(p, len, MS_SYNC) < 0)
		return report(-1, errno, "msync after the move");
	if (munmap(p, len) < 0)
		return report(-1, errno, "munmap");
	close(fd);
	printf("ticks %lu\n", ticks);
	return 0;
}

/* lockwatch FILE STOPFILE [INTERVAL_MS] (host side): every INTERVAL_MS (default
 * 5) try a classic POSIX write lock and an flock on FILE without waiting, until
 * STOPFILE exists; a lock that is granted is released at once. Prints a line for
 * each of the first 20 grants ("granted posix|flock at EPOCH.MS") and at the end
 * "attempts N posix-granted P flock-granted F". */
static int cmd_lockwatch(int argc, char **argv)
{
	if (argc != 3 && argc != 4)
		usage_exit("lockwatch FILE STOPFILE [INTERVAL_MS]");
	unsigned long interval = argc == 4 ? num(argv[3]) : 5;
	int fd = open(argv[1], O_RDWR);
	if (fd < 0)
		return report(-1, errno, argv[1]);
	unsigned long attempts = 0, posix = 0, fl = 0;
	while (!gone_yet(argv[2])) {
		struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
		struct timeval tv;
		attempts++;
		if (fcntl(fd, F_SETLK, &lk) == 0) {
			gettimeofday(&tv, NULL);
			if (posix++ + fl < 20)
				printf("granted posix at %ld.%03ld\n", (long)tv.tv_sec, (long)tv.tv_usec / 1000);
			lk.l_type = F_UNLCK;
			fcntl(fd, F_SETLK, &lk);
		} else if (errno != EAGAIN && errno != EACCES) {
			return report(-1, errno, "fcntl F_SETLK");
		}
		if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
			gettimeofday(&tv, NULL);
			if (posix + fl++ < 20)
				printf("granted flock at %ld.%03ld\n", (long)tv.tv_sec, (long)tv.tv_usec / 1000);
			flock(fd, LOCK_UN);
		} else if (errno != EWOULDBLOCK) {
			return report(-1, errno, "flock");
		}
		fflush(stdout);
		usleep(interval * 1000);
	}
	printf("attempts %lu posix-granted %lu flock-granted %lu\n", attempts, posix, fl);
	return 0;
}


/* The crash suite's metadata loop (suites/crash.sh): round after round until
 * STOPFILE exists, in DIR: create f.N exclusively (O_CREAT|O_EXCL), write N, close,
 * rename to g.N, stat it, read N back, unlink it, mkdir d.N, rmdir it. A request
 * the daemon had taken when it was killed, and that is not idempotent, is answered
 * EIO: the step may or may not have happened, so the rest of that round finds out
 * which (and cleans up) instead of counting the consequences. Counted: rounds,
 * steps, EIOs, EEXIST on an exclusive create (the daemon ran one twice: must be
 * 0), and any other failure of a step not after an EIO (must be 0). Writes
 * DIR/progress (round number, renamed in) every round. Prints one summary line:
 * "rounds R steps S eio E eexist X unexpected U". */
static unsigned long ml_eio, ml_eexist, ml_unexpected, ml_steps;

/* One step's outcome: 1 done, 0 EIO (state unknown), -1 another failure. */
static int ml_step(int ret, const char *what, unsigned long round, int after_eio)
{
	ml_steps++;
	if (ret >= 0)
		return 1;
	int e = errno;
	if (e == EIO) {
		ml_eio++;
		return 0;
	}
	if (!after_eio) {
		if (ml_unexpected++ < 5)
			printf("round %lu: %s: %s (%s)\n", round, what, strerror(e), errname(e));
	}
	return -1;
}

/* A clean-up call: ENOENT is fine; an EIO is counted like any other. */
static void ml_cleanup(int ret)
{
	if (ret < 0 && errno == EIO)
		ml_eio++;
}

static int cmd_metaloop(int argc, char **argv)
{
	if (argc != 3)
		usage_exit("metaloop DIR STOPFILE");
	const char *dir = argv[1], *stop = argv[2];
	char f[PATH_MAX], g[PATH_MAX], d[PATH_MAX], p[PATH_MAX], ptmp[PATH_MAX], buf[32];
	unsigned long n = 0;
	snprintf(p, sizeof p, "%s/progress", dir);
	snprintf(ptmp, sizeof ptmp, "%s/.progress.tmp", dir);
	while (access(stop, F_OK) != 0) {
		n++;
		int eio = 0, r;
		snprintf(f, sizeof f, "%s/f.%lu", dir, n);
		snprintf(g, sizeof g, "%s/g.%lu", dir, n);
		snprintf(d, sizeof d, "%s/d.%lu", dir, n);
		int len = snprintf(buf, sizeof buf, "%lu", n);
		int fd = open(f, O_CREAT | O_EXCL | O_WRONLY, 0644);
		if (fd < 0 && errno == EEXIST) {
			ml_steps++;
			if (ml_eexist++ < 5)
				printf("round %lu: EEXIST on its own exclusive create\n", n);
			continue;
		}
		r = ml_step(fd, "create", n, 0);
		if (r == 1) {
			if (ml_step(write(fd, buf, len) == len ? 0 : -1, "write", n, 0) != 1)
				eio = 1;
			close(fd);
		} else {
			eio = 1;
		}
		if (!eio) {
			r = ml_step(rename(f, g), "rename", n, 0);
			if (r == 0)
				eio = 1;
		}
		if (!eio) {
			struct stat st;
			char back[32] = {0};
			ml_step(stat(g, &st), "stat", n, 0);
			int rfd = open(g, O_RDONLY);
			if (ml_step(rfd, "open to read", n, 0) == 1) {
				ssize_t got = read(rfd, back, sizeof back - 1);
				ml_step(got, "read", n, 0);
				close(rfd);
				if (got >= 0 && strcmp(back, buf)) {
					if (ml_unexpected++ < 5)
						printf("round %lu: read back '%s', want '%s'\n", n, back, buf);
				}
			}
			if (ml_step(unlink(g), "unlink", n, 0) == 0)
				eio = 1;
		}
		if (eio) {
			/* Whatever of this round happened: gone now. */
			ml_cleanup(unlink(f));
			ml_cleanup(unlink(g));
		}
		int deio = 0;
		r = ml_step(mkdir(d, 0755), "mkdir", n, 0);
		if (r == 0)
			deio = 1;
		if (r == 1 && ml_step(rmdir(d), "rmdir", n, 0) == 0)
			deio = 1;
		if (deio)
			ml_cleanup(rmdir(d));
		/* Progress, for the host (counted as steps too: every EIO the guest
		 * gets is one the daemon counts). */
		int pfd = open(ptmp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
		if (ml_step(pfd, "progress create", n, 0) == 1) {
			ml_step(write(pfd, buf, len) == len ? 0 : -1, "progress write", n, 0);
			close(pfd);
			if (ml_step(rename(ptmp, p), "progress rename", n, 0) == 0)
				ml_cleanup(unlink(ptmp));
		} else {
			ml_cleanup(unlink(ptmp));
		}
	}
	printf("rounds %lu steps %lu eio %lu eexist %lu unexpected %lu\n", n, ml_steps, ml_eio,
	       ml_eexist, ml_unexpected);
	return 0;
}

/* durable FILE STOPFILE DONEFILE: record after record until STOPFILE: record N
 * (64 bytes, "record N" padded) written at offset N*64 with pwrite, then fsync;
 * once fsync returned 0, N is written to DONEFILE (outside the share: the last
 * record the guest was told is durable). Prints "records N eio E other O". */
static int cmd_durable(int argc, char **argv)
{
	if (argc != 4)
		usage_exit("durable FILE STOPFILE DONEFILE");
	int fd = open(argv[1], O_CREAT | O_WRONLY, 0644);
	if (fd < 0)
		die(argv[1]);
	unsigned long n = 0, eio = 0, other = 0;
	char rec[64];
	while (access(argv[2], F_OK) != 0) {
		memset(rec, ' ', sizeof rec);
		int len = snprintf(rec, sizeof rec, "record %lu", n + 1);
		rec[len] = ' ';
		rec[63] = '\n';
		if (pwrite(fd, rec, sizeof rec, (off_t)(n + 1) * 64) != (ssize_t)sizeof rec || fsync(fd) != 0) {
			if (errno == EIO)
				eio++;
			else if (other++ < 5)
				printf("record %lu: %s (%s)\n", n + 1, strerror(errno), errname(errno));
			continue;
		}
		n++;
		FILE *done = fopen(argv[3], "w");
		if (done) {
			fprintf(done, "%lu\n", n);
			fclose(done);
		}
	}
	close(fd);
	printf("records %lu eio %lu other %lu\n", n, eio, other);
	return 0;
}

/*
 * probe LIST [ROOT]: replay the file-system calls of a module resolution (the
 * workloads suite's npm-style storm; vm-tests/workloads-inputs.py writes the
 * list) and check every answer. Paths are relative to ROOT. Lines:
 *   S f|d|l|- PATH   stat PATH: a regular file, directory, symlink or ENOENT
 *   R SIZE PATH      open, read to the end (SIZE bytes), close
 * Prints "ops N stats S enoent E reads R bytes B mismatches M"; the first
 * mismatches go to stderr; exits 1 if there was any. One process for all the
 * calls: as a shell loop they would cost a fork each under TCG.
 */
static int cmd_probe(int argc, char **argv)
{
	if (argc != 2 && argc != 3)
		usage_exit("probe LIST [ROOT]");
	FILE *in = fopen(argv[1], "r");
	if (!in)
		die(argv[1]);
	if (argc == 3 && chdir(argv[2]) < 0)
		die(argv[2]);
	static char line[PATH_MAX + 64], buf[1 << 16];
	unsigned long ops = 0, stats = 0, enoent = 0, reads = 0, bad = 0;
	unsigned long long bytes = 0;
	while (fgets(line, sizeof line, in)) {
		size_t len = strlen(line);
		if (len && line[len - 1] == '\n')
			line[--len] = 0;
		if (!len)
			continue;
		char op = line[0], *arg = line + 2, *path = strchr(arg, ' ');
		if (len < 5 || line[1] != ' ' || !path)
			usage_exit("probe: a line is 'S KIND PATH' or 'R SIZE PATH'");
		*path++ = 0;
		ops++;
		char got[64] = "";
		if (op == 'S') {
			struct stat st;
			char kind = '-';
			stats++;
			if (stat(path, &st) == 0)
				kind = S_ISREG(st.st_mode) ? 'f' : S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : '?';
			else if (errno == ENOENT)
				enoent++;
			else
				kind = 'E';
			if (kind != arg[0])
				snprintf(got, sizeof got, "kind %c (%s)", kind, kind == 'E' ? errname(errno) : "");
		} else if (op == 'R') {
			unsigned long long n = 0;
			ssize_t r = 0;
			int fd = open(path, O_RDONLY | O_CLOEXEC);
			reads++;
			if (fd < 0) {
				snprintf(got, sizeof got, "open: %s", errname(errno));
			} else {
				while ((r = read(fd, buf, sizeof buf)) > 0)
					n += (unsigned long long)r;
				if (r < 0)
					snprintf(got, sizeof got, "read: %s", errname(errno));
				close(fd);
				bytes += n;
				if (!got[0] && n != strtoull(arg, NULL, 10))
					snprintf(got, sizeof got, "%llu bytes", n);
			}
		} else {
			usage_exit("probe: a line starts with S or R");
		}
		if (got[0] && bad++ < 10)
			fprintf(stderr, "fsops: probe: %c %s %s: got %s\n", op, arg, path, got);
	}
	fclose(in);
	printf("ops %lu stats %lu enoent %lu reads %lu bytes %llu mismatches %lu\n",
	       ops, stats, enoent, reads, bytes, bad);
	return bad ? 1 : 0;
}

static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *help;
} cmds[] = {
	{"pattern", cmd_pattern, "write|verify FILE MIB SEED [direct]"},
	{"rename2", cmd_rename2, "none|noreplace|exchange OLD NEW"},
	{"fallocate", cmd_fallocate, "alloc|keep|punch|zero FILE OFFSET LEN"},
	{"seek", cmd_seek, "data|hole FILE OFFSET"},
	{"pwrite", cmd_pwrite, "FILE OFFSET STRING"},
	{"fsync", cmd_fsync, "FILE [data]"},
	{"utimens", cmd_utimens, "FILE ATIME MTIME (SEC[.NSEC])"},
	{"times", cmd_times, "FILE"},
	{"cfr", cmd_cfr, "SRC DST"},
	{"readdir", cmd_readdir, "[-l] DIR"},
	{"mkfiles", cmd_mkfiles, "DIR PREFIX N"},
	{"rmfiles", cmd_rmfiles, "DIR PREFIX N"},
	{"statfs", cmd_statfs, "PATH"},
	{"pin", cmd_pin, "CPU CMD [ARGS...]"},
	{"getcpu", cmd_getcpu, ""},
	{"blocks", cmd_blocks, "FILE"},
	{"now", cmd_now, ""},
	{"open", cmd_open, "PATH r|w|rw|a|wc|wt|cx"},
	{"mkdir", cmd_sys, "PATH"},
	{"unlink", cmd_sys, "PATH"},
	{"rmdir", cmd_sys, "PATH"},
	{"chmod", cmd_sys, "MODE PATH (octal: 0644)"},
	{"truncate", cmd_sys, "PATH LEN"},
	{"link", cmd_sys, "OLD NEW"},
	{"symlink", cmd_sys, "TARGET NEW"},
	{"mkfifo", cmd_sys, "PATH"},
	{"touch", cmd_sys, "PATH"},
	{"stat", cmd_sys, "PATH (prints st_dev st_ino)"},
	{"readfd", cmd_readfd, "FD"},
	{"asuser", cmd_asuser, "UID GID CMD [ARGS...] (no supplementary groups)"},
	{"write", cmd_write, "FILE STRING (O_WRONLY, no create/truncate)"},
	{"setxattr", cmd_setxattr, "FILE NAME VALUE"},
	{"mode", cmd_mode, "PATH (prints the octal mode & 07777)"},
	{"lockhold", cmd_lockhold, "FILE [posix|ofd] (that write lock + flock, held until killed)"},
	{"trylock", cmd_trylock, "posix|ofd|flock[-read] FILE (non-blocking; EAGAIN if held; -read: a read lock on a read-only open)"},
	{"lockwait", cmd_lockwait, "posix|ofd|flock[-read] FILE (blocks until granted, prints locked, releases)"},
	{"acl", cmd_acl, "set FILE access|default SPEC (u::rw,u:1000:r,g::r,m::r,o::-) | get FILE access|default | remove FILE access|default"},
	{"openwait", cmd_openwait, "FILE r|w|direct-r|direct-w GOFILE (holds it open until GOFILE exists)"},
	{"uniform", cmd_uniform, "FILE (one byte repeated? prints SIZE BYTE)"},
	{"mmap", cmd_mmap, "write FILE OFFSET STRING sync|unmap|wait:GOFILE | read FILE OFFSET LEN | private FILE OFFSET STRING | rwmap-rdonly FILE"},
	{"readhold", cmd_readhold, "FILE SEED GOFILE (a pattern file read slowly through one fd until GOFILE, then to its end)"},
	{"dirhold", cmd_dirhold, "DIR N GOFILE (N entries read, the rest after GOFILE; prints entries T dups D)"},
	{"holdio", cmd_holdio, "FILE GOFILE (open O_RDWR until GOFILE, then pread/pwrite: prints read=E write=E)"},
	{"mmaphold", cmd_mmaphold, "FILE GOFILE (shared map written and msynced every 100 ms until GOFILE)"},
	{"metaloop", cmd_metaloop, "DIR STOPFILE (the crash suite's metadata loop: counts EIO, EEXIST, unexpected failures)"},
	{"durable", cmd_durable, "FILE STOPFILE DONEFILE (pwrite+fsync record after record; DONEFILE: the last one fsynced)"},
	{"probe", cmd_probe, "LIST [ROOT] (replay 'S f|d|l|- PATH' stats and 'R SIZE PATH' reads, checking each)"},
	{"lockwatch", cmd_lockwatch, "FILE STOPFILE [MS] (host: try a POSIX lock and an flock every MS until STOPFILE)"},
};

int main(int argc, char **argv)
{
	argv++, argc--;
	if (argc && !strcmp(argv[0], "-e")) {
		errno_mode = 1;
		argv++, argc--;
	}
	if (argc) {
		for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
			if (!strcmp(argv[0], cmds[i].name))
				return cmds[i].fn(argc, argv);
	}
	fprintf(stderr, "usage: fsops [-e] SUBCOMMAND ARGS...\n");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		fprintf(stderr, "  %s %s\n", cmds[i].name, cmds[i].help);
	return 2;
}
