/*
 * The namespace sandbox's supervisor as a freestanding x86_64 program: no libc, its
 * own _start, raw system calls. build.rs compiles it statically; volfsd embeds it
 * and executes it from a sealed memfd (tiny_supervisor.rs). A dynamically linked
 * Rust process holds ~200 KiB of RssAnon however little it does; this one holds a
 * stack page and a few pages of data.
 *
 * It does what supervisor.rs's `supervise` does, nothing more: wait for the
 * forwarded signals and SIGCHLD (blocked by volfsd before the fork; the mask is
 * kept across the exec), pass SIGTERM/SIGINT/SIGHUP/SIGQUIT on through the pidfd
 * it was given, and on the child's end exit with its status, or, if a signal
 * killed it, remove the socket files it left and say which signal.
 *
 * volfsd confined it before the exec: pidfd opened, capabilities dropped (bounding,
 * inheritable and ambient sets empty, no_new_privs: the exec cannot give any back),
 * the supervisor's seccomp list plus this exec and the two calls below. Its own
 * first acts are to take its name back (PR_SET_NAME) and stack a filter that
 * allows only the calls of its loop; only then does it tell the child it may
 * serve.
 *
 * argv: ARGV0 MARKER MODE PIDFD CHILD COMM CONFINED N SOCKET... -- DAEMON-ARGS...
 * (MODE: kill, trap, log or none; CONFINED: the fd to write one byte on once
 * confined; the daemon's arguments only for `ps`).
 */

typedef unsigned long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define SYS_write 1
#define SYS_wait4 61
#define SYS_unlink 87
#define SYS_rt_sigtimedwait 128
#define SYS_prctl 157
#define SYS_restart_syscall 219
#define SYS_exit_group 231
#define SYS_seccomp 317
#define SYS_statx 332
#define SYS_pidfd_send_signal 424

#define SIGHUP 1
#define SIGINT 2
#define SIGQUIT 3
#define SIGTERM 15
#define SIGCHLD 17
#define SIGSYS 31

#define PR_SET_NAME 15
#define WNOHANG 1
#define AT_FDCWD (-100)
#define AT_SYMLINK_NOFOLLOW 0x100
#define STATX_TYPE 1
#define S_IFMT 0170000
#define S_IFSOCK 0140000

#define SECCOMP_SET_MODE_FILTER 1
#define SECCOMP_RET_KILL_PROCESS 0x80000000U
#define SECCOMP_RET_LOG 0x7ffc0000U
#define SECCOMP_RET_ALLOW 0x7fff0000U
#define AUDIT_ARCH_X86_64 0xc000003eU
#define X32_SYSCALL_BIT 0x40000000U

/* classic BPF */
#define BPF_LD_W_ABS 0x20
#define BPF_JEQ_K 0x15
#define BPF_JGE_K 0x35
#define BPF_RET_K 0x06

/* Program entry: the kernel's initial stack is argc, argv..., NULL, envp... */
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  xor %rbp, %rbp\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call tiny_main\n"
        "  hlt\n");

static long sys6(long nr, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

#define sys(nr, a, b, c, d) sys6(nr, (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)

static __attribute__((noreturn)) void exit_group(int code) {
    for (;;)
        sys(SYS_exit_group, code, 0, 0, 0);
}

/* The compiler may emit calls to these for struct copies and zeroing. */
void *memset(void *d, int c, u64 n) {
    u8 *p = d;
    while (n--)
        *p++ = (u8)c;
    return d;
}

void *memcpy(void *d, const void *s, u64 n) {
    u8 *p = d;
    const u8 *q = s;
    while (n--)
        *p++ = *q++;
    return d;
}

static int same(const char *a, const char *b) {
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

/* A decimal number (no sign), or -1. */
static long number(const char *s) {
    long n = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || n > 0x7fffffff / 10)
            return -1;
        n = n * 10 + (*s - '0');
    }
    return n;
}

/* Appends s to the message at *at (bounded by end). */
static void append(char **at, char *end, const char *s) {
    while (*s && *at < end)
        *(*at)++ = *s++;
}

static void append_number(char **at, char *end, long n) {
    char digits[20];
    int i = 0;
    do
        digits[i++] = (char)('0' + n % 10);
    while ((n /= 10) && i < 20);
    while (i && *at < end)
        *(*at)++ = digits[--i];
}

static void usage(void) {
    static const char msg[] = "volfsd: the sandbox supervisor is internal to the namespace sandbox\n";
    sys(SYS_write, 2, msg, sizeof msg - 1, 0);
    exit_group(2);
}

static const char *const signal_names[32] = {
    0,         "SIGHUP",  "SIGINT",    "SIGQUIT", "SIGILL",    "SIGTRAP", "SIGABRT",
    "SIGBUS",  "SIGFPE",  "SIGKILL",   "SIGUSR1", "SIGSEGV",   "SIGUSR2", "SIGPIPE",
    "SIGALRM", "SIGTERM", "SIGSTKFLT", "SIGCHLD", "SIGCONT",   "SIGSTOP", "SIGTSTP",
    "SIGTTIN", "SIGTTOU", "SIGURG",    "SIGXCPU", "SIGXFSZ",   "SIGVTALRM", "SIGPROF",
    "SIGWINCH", "SIGIO",  "SIGPWR",    "SIGSYS",
};

struct sock_filter {
    u16 code;
    u8 jt;
    u8 jf;
    u32 k;
};

struct sock_fprog {
    u16 len;
    const struct sock_filter *filter;
};

#define ALLOW_NR(nr) {BPF_JEQ_K, 0, 1, (nr)}, {BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW}

/*
 * Its own allow-list, stacked on the one volfsd installed before the exec (all
 * filters apply, the strictest answer wins): the calls of the loop below, and none
 * to execute, name or signal another process, or change its filters again. Copied
 * onto the stack with the mismatch action of MODE as its last instruction: read-only
 * here, so that no page of data is ever written (each one written is 4 KiB more of
 * RssAnon).
 */
static const struct sock_filter filter_template[] = {
    {BPF_LD_W_ABS, 0, 0, 4}, /* seccomp_data.arch */
    {BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64},
    {BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS},
    {BPF_LD_W_ABS, 0, 0, 0}, /* seccomp_data.nr */
    {BPF_JGE_K, 0, 1, X32_SYSCALL_BIT},
    {BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS},
    ALLOW_NR(SYS_rt_sigtimedwait),
    ALLOW_NR(SYS_pidfd_send_signal),
    ALLOW_NR(SYS_wait4),
    ALLOW_NR(SYS_statx),
    ALLOW_NR(SYS_unlink),
    ALLOW_NR(SYS_write),
    ALLOW_NR(SYS_exit_group),
    ALLOW_NR(SYS_restart_syscall),
    {BPF_RET_K, 0, 0, 0 /* mismatch */},
};

/* struct statx: stx_mode is the u16 at offset 28; the struct is 256 bytes. */
struct statx_buf {
    u32 mask, blksize;
    u64 attributes;
    u32 nlink, uid, gid;
    u16 mode;
    u8 rest[256 - 30];
};

/* A socket file the dead child left: removed; never any other kind of file. */
static void remove_socket(const char *path) {
    struct statx_buf st;
    if (sys6(SYS_statx, AT_FDCWD, (long)path, AT_SYMLINK_NOFOLLOW, STATX_TYPE, (long)&st, 0) == 0 &&
        (st.mode & S_IFMT) == S_IFSOCK)
        sys(SYS_unlink, path, 0, 0, 0);
}

__attribute__((noreturn, used)) void tiny_main(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    if (argc < 8 || !same(argv[1], "\001volfsd-sandbox-supervisor"))
        usage();
    const char *mode = argv[2];
    long pidfd = number(argv[3]), child = number(argv[4]);
    const char *comm = argv[5];
    long confined = number(argv[6]), count = number(argv[7]);
    if (pidfd < 3 || child < 1 || confined < 3 || count < 0 || count > argc - 8)
        usage();
    char **sockets = argv + 8;
    u32 mismatch;
    if (same(mode, "kill") || same(mode, "trap"))
        /* trap: no handler here to report the call; the process dies as in kill. */
        mismatch = SECCOMP_RET_KILL_PROCESS;
    else if (same(mode, "log"))
        mismatch = SECCOMP_RET_LOG;
    else if (same(mode, "none"))
        mismatch = 0;
    else
        usage();

    /* The exec named it after the memfd: named as the daemon again. */
    sys(SYS_prctl, PR_SET_NAME, comm, 0, 0);
    if (mismatch) {
        enum { N = sizeof filter_template / sizeof filter_template[0] };
        struct sock_filter filter[N];
        memcpy(filter, filter_template, sizeof filter);
        filter[N - 1].k = mismatch;
        struct sock_fprog prog = {N, filter};
        long e = sys(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog, 0);
        if (e < 0) {
            static const char msg[] = "volfsd: sandbox supervisor: seccomp failed\n";
            sys(SYS_write, 2, msg, sizeof msg - 1, 0);
            sys(SYS_pidfd_send_signal, pidfd, 9 /* SIGKILL */, 0, 0);
            exit_group(1);
        }
    }
    /* The child may serve now (the fd stays open, unused: close is not allowed). */
    sys(SYS_write, confined, "1", 1, 0);

    u64 set = 1UL << (SIGTERM - 1) | 1UL << (SIGINT - 1) | 1UL << (SIGHUP - 1) |
              1UL << (SIGQUIT - 1) | 1UL << (SIGCHLD - 1);
    for (;;) {
        u8 info[128]; /* siginfo_t, unread */
        long sig = sys(SYS_rt_sigtimedwait, &set, info, 0, 8);
        if (sig < 0)
            continue;
        if (sig != SIGCHLD) {
            sys(SYS_pidfd_send_signal, pidfd, sig, 0, 0);
            continue;
        }
        int status = 0;
        if (sys(SYS_wait4, child, &status, WNOHANG, 0) != child)
            continue;
        if ((status & 0x7f) == 0) /* exited */
            exit_group((status >> 8) & 0xff);
        int killer = status & 0x7f;
        if (killer == 0x7f) /* stopped or continued: not reported without WUNTRACED */
            continue;
        for (long i = 0; i < count; i++)
            remove_socket(sockets[i]);
        char msg[160], *at = msg, *end = msg + sizeof msg - 1;
        append(&at, end, "volfsd: the sandboxed daemon was killed by ");
        if (killer < 32 && signal_names[killer]) {
            append(&at, end, signal_names[killer]);
        } else {
            append(&at, end, "signal ");
            append_number(&at, end, killer);
        }
        if (killer == SIGSYS)
            append(&at, end, " (a system call outside its seccomp allow-list)");
        *at++ = '\n';
        sys(SYS_write, 2, msg, at - msg, 0);
        exit_group(1);
    }
}
